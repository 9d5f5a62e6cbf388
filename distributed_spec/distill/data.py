"""Distillation data: prompt files, the shards of teacher records on disk, and training batches.

A record is one sequence the target wrote or scored: input_ids [L] int32 (prompt + continuation),
topk_ids [L-1, k] int32 / topk_probs [L-1, k] fp16 / rest [L-1] fp32 (row t: the target's p of
token t+1, its top-k and the mass outside them), num_prompt_tokens, and the job tags prompt_index,
split ("train" or "eval") and sample_index. A shard is a list of records saved by torch.save.
"""

from __future__ import annotations

from pathlib import Path

import torch

DEFAULT_PROMPTS = Path(__file__).resolve().parent / "prompts.txt"
# Every 8th prompt of the prompt file is held out for evaluation.
EVAL_EVERY = 8


def read_prompts(path: Path) -> list[tuple[str, str]]:
    """[(kind, text)] from lines "<chat|raw>\\t<text>"; '#' lines are comments, "\\n" is a newline.

    Lines end at "\\n" (or "\\r\\n") only: str.splitlines and universal newlines would also split at
    U+2028, "\\r" and other separators that generated text contains."""
    prompts = []
    for number, line in enumerate(path.read_bytes().decode("utf-8").split("\n"), start=1):
        line = line.removesuffix("\r")  # a file saved with CRLF line ends
        if not line.strip() or line.startswith("#"):
            continue
        kind, tab, text = line.partition("\t")
        if not tab or kind not in ("chat", "raw"):
            raise ValueError(f"{path}:{number}: expected '<chat|raw><TAB><text>', got {line[:60]!r}")
        prompts.append((kind, text.replace("\\n", "\n")))
    return prompts


def write_prompts(path: Path, prompts: list[tuple[str, str]], header: str) -> None:
    """Writes [(kind, text)] in read_prompts' format: newlines (\\r\\n, \\r, \\n) become "\\n", tabs spaces."""
    lines = [f"# {header}"]
    for kind, text in prompts:
        text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "\\n").replace("\t", " ")
        lines.append(f"{kind}\t{text}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def encode_prompt(tokenizer, kind: str, text: str) -> list[int]:
    """Token ids of one prompt: chat prompts go through the chat template when the tokenizer has one."""
    if kind == "chat" and tokenizer.chat_template:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    return tokenizer(text)["input_ids"]


def pad_batch(sequences: list, pad_token_id: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id sequences padded to one length: input_ids [B, T] long and attention_mask [B, T].

    left=True puts the padding first (every row's next token is at column T, for generation);
    left=False puts it last (causal attention keeps the valid positions exact, for scoring).
    """
    max_len = max(len(ids) for ids in sequences)
    input_ids = torch.full((len(sequences), max_len), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for b, ids in enumerate(sequences):
        span = slice(max_len - len(ids), max_len) if left else slice(0, len(ids))
        input_ids[b, span] = torch.as_tensor(ids)
        attention_mask[b, span] = 1
    return input_ids, attention_mask


def right_pad(records: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """The records' input_ids, right-padded with 0: input_ids [B, T] and attention_mask [B, T]."""
    return pad_batch([r["input_ids"] for r in records], 0, left=False)


def make_batch(records: list[dict], vocab_to_sub: torch.Tensor) -> dict[str, torch.Tensor]:
    """Right-padded batch: input_ids [B, T], attention_mask [B, T], and per predicted position n (flattened,
    row-major over the valid (b, t<L_b-1)): sub_ids [n, k] (index into the sub-vocabulary, K = not in it),
    top_probs [n, k], rest [n], generated [n] (True where the next token was generated, not prompt)."""
    lengths = [len(r["input_ids"]) for r in records]
    input_ids, attention_mask = right_pad(records)
    valid = torch.zeros_like(input_ids, dtype=torch.bool)
    for b, length in enumerate(lengths):
        valid[b, :length - 1] = True
    cat = lambda key: torch.cat([r[key] for r in records])  # noqa: E731
    generated = torch.cat([torch.arange(len(r["rest"])) >= r["num_prompt_tokens"] - 1 for r in records])
    return {"input_ids": input_ids, "attention_mask": attention_mask, "valid": valid,
            "sub_ids": vocab_to_sub[cat("topk_ids").long()], "top_probs": cat("topk_probs").float(),
            "rest": cat("rest").float(), "generated": generated}


def sample_jobs(args, tokenizer, splits: tuple[str, ...]) -> tuple[list[list[int]], list[tuple[int, str, int]]]:
    """The --prompts encoded, and a (prompt index, split, sample index) job per sample of the prompts of
    `splits` (every EVAL_EVERY-th prompt is "eval"), sorted by prompt length: less padding per batch."""
    prompts = read_prompts(Path(args.prompts))
    encoded = [encode_prompt(tokenizer, kind, text) for kind, text in prompts]
    jobs = []
    for i in range(len(prompts)):
        split = "eval" if i % EVAL_EVERY == EVAL_EVERY - 1 else "train"
        if split in splits:
            num_samples = args.eval_samples_per_prompt if split == "eval" else args.samples_per_prompt
            jobs += [(i, split, s) for s in range(num_samples)]
    return encoded, sorted(jobs, key=lambda job: (len(encoded[job[0]]), job))


def missing_shards(args, jobs: list[tuple[int, str, int]], prefix: str) -> list[tuple[int, Path, list]]:
    """(shard index, path, jobs) for each batch of --gen-batch-size jobs whose shard is not written yet."""
    data_dir = Path(args.work_dir) / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    batches = [jobs[i:i + args.gen_batch_size] for i in range(0, len(jobs), args.gen_batch_size)]
    paths = [data_dir / f"{prefix}_{shard:05d}.pt" for shard in range(len(batches))]
    return [(shard, path, batch) for shard, (path, batch) in enumerate(zip(paths, batches)) if not path.exists()]


def write_shard(path: Path, records: list[dict], batch: list[tuple[int, str, int]]) -> int:
    """Tag the records with their jobs and write them atomically; returns the shard's token count."""
    for record, (i, split, s) in zip(records, batch):
        record.update(prompt_index=i, split=split, sample_index=s)
    torch.save(records, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").rename(path)  # a shard appears only once complete
    return sum(len(r["input_ids"]) for r in records)


def shard_paths(work_dir: str) -> list[Path]:
    return sorted((Path(work_dir) / "data").glob("*shard_*.pt"))


def load_records(work_dir: str, split: str) -> list[dict]:
    """All generated records of one split ("train" or "eval"), in shard order."""
    shards = shard_paths(work_dir)
    if not shards:
        raise FileNotFoundError(f"no shards under {work_dir}/data: run the generate stage first (--stages generate)")
    return [r for path in shards for r in torch.load(path, weights_only=True) if r["split"] == split]
