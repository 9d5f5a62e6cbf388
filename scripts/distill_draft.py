"""Distil a small draft model for a target that shares its tokenizer, from text the target generates.

    python -m scripts.distill_draft --target smollm2 --out-dir distributed_spec/assets/drafts/smollm2-draft
    python -m scripts.distill_draft --target smollm2 --out-dir distributed_spec/assets/drafts/smollm2-draft --eval-only

Stages (--stages), working in --work-dir (default ~/.cache/distributed_spec/distill/<out-dir name>):
0. questions (only when named, with --num-questions N): the target writes N user requests itself
   into work_dir/questions_seed<seed>.txt, to pass to generate as --prompts (new contexts).
1. generate: the target continues every seed prompt (scripts/distill_prompts.txt) at temperature 1,
   batched; per position we keep the target's top-k probabilities p and the rest mass, one shard
   per batch (existing shards are skipped; --seed/--shard-prefix add another round of samples).
   Every 8th prompt is held out for evaluation.
1b. draft-samples (only when named): the draft in --sampler-from writes the continuations instead
   (at temperature 1, batched; cheap), and the target scores each whole sequence in one forward
   (about 2.5x the generated tokens/s of target sampling on 2 CPU cores): on-policy data, the contexts
   the draft itself produces (DistillSpec, Zhou et al. 2024). Same shard format, prefix "draft_" by default.
2. train: the draft (distributed_spec.models.distilled: a few Llama layers on the target's frozen
   embeddings and LM head, optionally a sub-vocabulary head of the K tokens with most target mass)
   minimises forward KL(p || q) over the buckets {top-k tokens it can score} + {everything else},
   or with --tv-weight w a mix with the total variation 1 - sum min(p, q) that acceptance pays for.
   Checkpoints every --save-every steps; --resume continues from the last one.
3. export: bf16 weights + draft_config.json into --out-dir (what load_distilled_draft reads).
4. eval: token-level acceptance, mean over held-out positions of sum_x min(p(x), q(x)) with the
   full p and q at temperature 1, and the per-token cost of draft vs target at batch 1.
   --eval-only runs just this stage (generating the held-out samples first when no shards exist).
--init-from DIR starts training from an exported draft of the same shape (a warm start).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from distributed_spec.models.distilled import (
    DISTILLED_SMOLLM2_DRAFT_DIR,
    WEIGHT_FORMATS,
    build_draft,
    draft_llama_config,
    load_distilled_draft,
    read_draft_weights,
    save_distilled_draft,
    trainable_state_dict,
)
from distributed_spec.models.fetch import cache_dir, smollm2_gguf_path

logger = logging.getLogger("distill_draft")

DEFAULT_PROMPTS = Path(__file__).resolve().parent / "distill_prompts.txt"
EVAL_EVERY = 8
TRAIN_EVAL_EVERY = 64  # --eval-split train scores every 64th training sequence


# ----------------------------------------------------------------------------- target and prompts


def load_target(target: str):
    """(model, tokenizer) in fp32 eval mode; "smollm2" is the embedded GGUF target, else a dir or hub id."""
    if target == "smollm2":
        path = smollm2_gguf_path()
        kwargs = {"gguf_file": path.name}
        target = str(path.parent)
    else:
        kwargs = {}
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32, **kwargs).eval()
    tokenizer = AutoTokenizer.from_pretrained(target, **kwargs)
    return model, tokenizer


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


# ----------------------------------------------------------------------------- stage 1: generate


def _eos_and_pad(model, tokenizer) -> tuple[int, int]:
    """The token that ends a sample, and the one that pads a batch (EOS when there is no pad)."""
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else model.config.eos_token_id
    return eos, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos


def _cache_kwargs(outputs) -> dict:
    """The KV cache of a forward's outputs as the kwarg the next forward takes (`cache` in transformers 5)."""
    name = "cache" if "cache" in outputs else "past_key_values"
    return {name: outputs[name]}


def _top_k_record(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [N, V] -> top-k ids [N, k] int32, their probs [N, k] fp16, rest mass [N] fp32."""
    probs = torch.softmax(logits.float(), dim=-1)
    top_probs, top_ids = probs.topk(k, dim=-1)
    rest = (1.0 - top_probs.sum(-1)).clamp(min=0.0)
    return top_ids.to(torch.int32), top_probs.to(torch.float16), rest


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


@torch.inference_mode()
def generate_with_target_probs(
    model, prompt_ids: list[list[int]], max_new_tokens: int, eos_token_id: int, pad_token_id: int,
    top_k: int, generator: torch.Generator,
) -> list[dict]:
    """Sample continuations at temperature 1 and keep the target's p at every position.

    Returns one record per prompt: input_ids [L] int32 (prompt + generated, up to and including EOS),
    topk_ids [L-1, k] int32 / topk_probs [L-1, k] fp16 / rest [L-1] fp32 (row t: p of token t+1),
    num_prompt_tokens.
    """
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    input_ids, attention_mask = pad_batch(prompt_ids, pad_token_id, left=True)
    batch_size, max_len = input_ids.shape
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    outputs = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True)
    records = []
    for b, ids in enumerate(prompt_ids):  # head row by row: [max_len, V] at a time keeps memory small
        top_ids, top_probs, rest = _top_k_record(head(outputs.last_hidden_state[b, max_len - len(ids):]), top_k)
        records.append({"prompt": ids, "generated": [], "topk_ids": [top_ids], "topk_probs": [top_probs], "rest": [rest]})
    next_logits = head(outputs.last_hidden_state[:, -1])  # [B, V]
    cache = _cache_kwargs(outputs)
    finished = torch.zeros(batch_size, dtype=torch.bool)
    for step in range(max_new_tokens):
        tokens = torch.multinomial(torch.softmax(next_logits.float(), -1), 1, generator=generator)[:, 0]
        # .tolist(): host-side bookkeeping of which rows are still generating.
        for b, token in enumerate(tokens.tolist()):
            if not finished[b]:
                records[b]["generated"].append(token)
        finished |= tokens == eos_token_id
        if step == max_new_tokens - 1 or bool(finished.all()):
            break
        attention_mask = torch.cat([attention_mask, torch.ones(batch_size, 1, dtype=torch.long)], dim=1)
        position_ids = position_ids[:, -1:] + 1
        outputs = decoder(input_ids=tokens[:, None], attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=True, **cache)
        cache = _cache_kwargs(outputs)
        next_logits = head(outputs.last_hidden_state[:, -1])
        top_ids, top_probs, rest = _top_k_record(next_logits, top_k)
        for b in range(batch_size):
            if not finished[b]:
                records[b]["topk_ids"].append(top_ids[b:b + 1])
                records[b]["topk_probs"].append(top_probs[b:b + 1])
                records[b]["rest"].append(rest[b:b + 1])
    out = []
    for record in records:
        input_ids = torch.tensor(record["prompt"] + record["generated"], dtype=torch.int32)
        num_rows = len(input_ids) - 1  # the last token has no successor to predict
        out.append({
            "input_ids": input_ids,
            "topk_ids": torch.cat(record["topk_ids"])[:num_rows],
            "topk_probs": torch.cat(record["topk_probs"])[:num_rows],
            "rest": torch.cat(record["rest"])[:num_rows],
            "num_prompt_tokens": len(record["prompt"]),
        })
    return out


def run_generate(args, model, tokenizer, only_eval: bool = False) -> None:
    """Stage 1: one shard per batch of (prompt, sample) jobs under work_dir/data; existing shards are kept.

    only_eval: generate just the held-out prompts' samples (into eval_shard_*.pt), for --eval-only
    on a machine that has no shards yet.
    """
    encoded, jobs = _sample_jobs(args, tokenizer, ("eval",) if only_eval else ("train", "eval"))
    eos, pad = _eos_and_pad(model, tokenizer)
    prefix = "eval_shard" if only_eval else f"{args.shard_prefix}shard"
    progress = tqdm(_missing_shards(args, jobs, prefix), desc="generate", unit="batch")
    for shard, path, batch in progress:
        generator = torch.Generator().manual_seed(args.seed * 100_003 + shard + (50_000 if only_eval else 0))
        records = generate_with_target_probs(
            model, [encoded[i] for i, _, _ in batch], args.max_new_tokens, eos, pad, args.store_top_k, generator
        )
        progress.set_postfix(tokens=_write_shard(path, records, batch))


def _missing_shards(args, jobs: list[tuple[int, str, int]], prefix: str) -> list[tuple[int, Path, list]]:
    """(shard index, path, jobs) for each batch of --gen-batch-size jobs whose shard is not written yet."""
    data_dir = Path(args.work_dir) / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    batches = [jobs[i:i + args.gen_batch_size] for i in range(0, len(jobs), args.gen_batch_size)]
    paths = [data_dir / f"{prefix}_{shard:05d}.pt" for shard in range(len(batches))]
    return [(shard, path, batch) for shard, (path, batch) in enumerate(zip(paths, batches)) if not path.exists()]


def _write_shard(path: Path, records: list[dict], batch: list[tuple[int, str, int]]) -> int:
    """Tag the records with their jobs and write them atomically; returns the shard's token count."""
    for record, (i, split, s) in zip(records, batch):
        record.update(prompt_index=i, split=split, sample_index=s)
    torch.save(records, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").rename(path)  # a shard appears only once complete
    return sum(len(r["input_ids"]) for r in records)


def _sample_jobs(args, tokenizer, splits: tuple[str, ...]) -> tuple[list[list[int]], list[tuple[int, str, int]]]:
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


@torch.inference_mode()
def sample_continuations(model, prompt_ids: list[list[int]], max_new_tokens: int, eos_token_id: int,
                         pad_token_id: int, seed: int) -> list[list[int]]:
    """Continuations that `model` samples at temperature 1 from the full distribution (no top-k/top-p),
    each up to and including its EOS; transformers' generate on a left-padded batch."""
    input_ids, attention_mask = pad_batch(prompt_ids, pad_token_id, left=True)
    max_len = input_ids.shape[1]
    config = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens,
                              eos_token_id=eos_token_id, pad_token_id=pad_token_id)
    torch.manual_seed(seed)  # generate samples from the global generator
    generated = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    continuations = []
    for row in generated[:, max_len:].tolist():
        end = row.index(eos_token_id) + 1 if eos_token_id in row else len(row)
        continuations.append(row[:end])
    return continuations


@torch.inference_mode()
def score_with_target(model, prompt_ids: list[list[int]], continuations: list[list[int]], top_k: int) -> list[dict]:
    """The target's p at every position of prompt + continuation, in one forward per batch.

    Returns records in generate_with_target_probs' format: input_ids [L] int32, topk_ids [L-1, k] int32,
    topk_probs [L-1, k] fp16, rest [L-1] fp32 (row t: p of token t+1), num_prompt_tokens.
    """
    sequences = [p + c for p, c in zip(prompt_ids, continuations)]
    input_ids, attention_mask = pad_batch(sequences, 0, left=False)
    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    head, records = model.get_output_embeddings(), []
    for b, ids in enumerate(sequences):  # head row by row: [L, V] at a time keeps memory small
        top_ids, top_probs, rest = _top_k_record(head(hidden[b, :len(ids) - 1]), top_k)
        records.append({"input_ids": torch.tensor(ids, dtype=torch.int32), "topk_ids": top_ids,
                        "topk_probs": top_probs, "rest": rest, "num_prompt_tokens": len(prompt_ids[b])})
    return records


def run_draft_samples(args, model, tokenizer) -> None:
    """Stage 1b: the draft in --sampler-from continues the training prompts, the target scores the text;
    one shard per batch under work_dir/data (existing shards are kept), as run_generate writes them."""
    sampler = load_distilled_draft(args.sampler_from, model).eval()
    encoded, jobs = _sample_jobs(args, tokenizer, ("train",))
    eos, pad = _eos_and_pad(model, tokenizer)
    progress = tqdm(_missing_shards(args, jobs, f"{args.shard_prefix or 'draft_'}shard"), desc="draft samples",
                    unit="batch")
    for shard, path, batch in progress:
        batch_prompts = [encoded[i] for i, _, _ in batch]
        continuations = sample_continuations(sampler, batch_prompts, args.max_new_tokens, eos, pad,
                                             seed=args.seed * 100_003 + shard + 70_000)
        records, step = [], args.score_batch_size
        for start in range(0, len(batch), step):
            records += score_with_target(model, batch_prompts[start:start + step],
                                         continuations[start:start + step], args.store_top_k)
        progress.set_postfix(tokens=_write_shard(path, records, batch))


# Openings of the user turns that the target completes in the "questions" stage.
QUESTION_OPENINGS = (
    "Explain", "Write a", "How do I", "What is", "Why does", "Summarize", "Can you", "Give me",
    "Write a Python function", "What are the differences between", "Tell me about", "Help me",
    "List", "Describe", "Translate", "Compare", "Fix this code:", "Suggest", "Is it true that", "Plan",
)


def run_questions(args, model, tokenizer) -> Path:
    """Stage 0 (optional): the target writes --num-questions user requests (it completes the user turn
    of its chat template from one of QUESTION_OPENINGS, at temperature 1). They are written as "chat"
    prompts to work_dir/questions_seed<seed>.txt, to pass as --prompts: more varied contexts than a
    hand-written list, and still text the target generates. Returns the file's path."""
    if not tokenizer.chat_template:
        raise ValueError("--stages questions needs a target with a chat template")
    marker = "QUESTION_OPENING"
    template = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False)
    prefix = template[: template.index(marker)]
    eos, pad = _eos_and_pad(model, tokenizer)
    openings = [QUESTION_OPENINGS[i % len(QUESTION_OPENINGS)] for i in range(args.num_questions)]
    generator = torch.Generator().manual_seed(args.seed * 100_003 + 90_000)
    questions = []
    for start in tqdm(range(0, len(openings), args.gen_batch_size), desc="questions", unit="batch"):
        batch = openings[start:start + args.gen_batch_size]
        prompt_ids = [tokenizer(prefix + opening, add_special_tokens=False)["input_ids"] for opening in batch]
        records = generate_with_target_probs(model, prompt_ids, args.question_tokens, eos, pad, 1, generator)
        for opening, record in zip(batch, records):
            generated = record["input_ids"][record["num_prompt_tokens"]:].tolist()
            text = opening + tokenizer.decode([t for t in generated if t != eos], skip_special_tokens=True)
            if generated and generated[-1] == eos and len(text) > len(opening) + 8:  # finished turns only
                questions.append(("chat", text.strip()))
    path = Path(args.work_dir) / f"questions_seed{args.seed}.txt"
    write_prompts(path, questions, "user turns written by the target (scripts/distill_draft.py --stages questions)")
    logger.info("wrote %d of %d questions (finished turns) to %s", len(questions), len(openings), path)
    return path


def _shard_paths(work_dir: str) -> list[Path]:
    return sorted((Path(work_dir) / "data").glob("*shard_*.pt"))


def load_records(work_dir: str, split: str) -> list[dict]:
    """All generated records of one split ("train" or "eval"), in shard order."""
    shards = _shard_paths(work_dir)
    if not shards:
        raise FileNotFoundError(f"no shards under {work_dir}/data: run the generate stage first (--stages generate)")
    return [r for path in shards for r in torch.load(path, weights_only=True) if r["split"] == split]



# ----------------------------------------------------------------------------- stage 2: train


def choose_sub_vocab(records: list[dict], vocab_size: int, size: int) -> torch.Tensor | None:
    """The `size` token ids with the most target probability mass over the records ([K] long, sorted), or None."""
    if size <= 0 or size >= vocab_size:
        return None
    mass = torch.zeros(vocab_size, dtype=torch.float64)
    for r in records:
        mass.index_add_(0, r["topk_ids"].flatten().long(), r["topk_probs"].flatten().double())
    return mass.topk(size).indices.sort().values


def init_from_target(draft, target_model, layer_spec: str) -> None:
    """Copy target decoder layers into the draft's (MLP neurons pruned to the draft's width) and its final norm.

    layer_spec: "none", or one target layer index per draft layer ("first"/"last" allowed), e.g. "first,last".
    Pruning keeps the intermediate neurons j with the largest |gate_j| * |up_j| * |down_:,j|.
    """
    if layer_spec == "none":
        return
    target_layers = target_model.get_decoder().layers
    names = [name.strip() for name in layer_spec.split(",")]
    if len(names) != len(draft.model.layers):
        raise ValueError(f"--init-layers names {len(names)} layers but the draft has {len(draft.model.layers)}: "
                         "give one target layer per draft layer, or 'none'")
    index = {"first": 0, "last": len(target_layers) - 1}
    with torch.no_grad():
        for draft_layer, name in zip(draft.model.layers, names):
            source = target_layers[index[name] if name in index else int(name)].state_dict()
            own = draft_layer.state_dict()
            gate, up, down = (source[f"mlp.{n}_proj.weight"] for n in ("gate", "up", "down"))
            width = own["mlp.gate_proj.weight"].shape[0]
            keep = (gate.norm(dim=1) * up.norm(dim=1) * down.norm(dim=0)).topk(width).indices.sort().values
            source.update({"mlp.gate_proj.weight": gate[keep], "mlp.up_proj.weight": up[keep],
                           "mlp.down_proj.weight": down[:, keep]})
            draft_layer.load_state_dict({name: source[name] for name in own})
        draft.model.norm.load_state_dict(target_model.get_decoder().norm.state_dict())


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


def _target_buckets(sub_ids: torch.Tensor, top_probs: torch.Tensor, rest: torch.Tensor, num_sub: int):
    """p over the buckets {each top-k token the draft can score} + {all other tokens}.

    sub_ids [n, k] top-k tokens of p as sub-vocabulary indices (num_sub where outside it); top_probs [n, k];
    rest [n] p mass outside the top-k. Returns p_top [n, k] (0 where not scorable) and p_other [n].
    """
    p_top = torch.where(sub_ids < num_sub, top_probs, 0.0)
    return p_top, (rest + (top_probs - p_top).sum(-1)).clamp(min=0.0)  # rounding: never below 0


def bucket_kl_loss(sub_logits: torch.Tensor, sub_ids: torch.Tensor, top_probs: torch.Tensor,
                   rest: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward KL(p || q) over buckets {each top-k token the draft can score} + {all other tokens}.

    sub_logits [n, K] draft logits over the sub-vocabulary; sub_ids [n, k] top-k tokens of p as
    sub-vocabulary indices (K where outside it); top_probs [n, k]; rest [n] p mass outside the top-k.
    Coarse-graining only merges tokens, so this KL is a lower bound of the full one and equals it
    when the top-k hold all of p's mass. Returns (mean cross-entropy: the loss, mean KL: to report).
    """
    log_q = torch.log_softmax(sub_logits.float(), dim=-1)
    log_q = torch.cat([log_q, log_q.new_full((log_q.shape[0], 1), float("-inf"))], dim=-1)  # [n, K+1]
    p_top, p_other = _target_buckets(sub_ids, top_probs, rest, sub_logits.shape[-1])
    log_q_top = log_q.gather(-1, sub_ids).clamp(min=-100.0)
    log_q_other = torch.logsumexp(log_q.scatter(-1, sub_ids, float("-inf")), dim=-1).clamp(min=-100.0)
    cross_entropy = -(p_top * log_q_top).sum(-1) - p_other * log_q_other
    entropy = -(torch.xlogy(p_top, p_top)).sum(-1) - torch.xlogy(p_other, p_other)
    return cross_entropy.mean(), (cross_entropy - entropy).mean().detach()


def bucket_acceptance(sub_logits: torch.Tensor, sub_ids: torch.Tensor, top_probs: torch.Tensor,
                      rest: torch.Tensor) -> torch.Tensor:
    """sum_b min(p_b, q_b) over the buckets of bucket_kl_loss: the acceptance, differentiable in sub_logits.

    Same shapes as bucket_kl_loss; returns [n]. Merging tokens can only raise sum min(p, q), so this is an
    upper bound of the full acceptance that equals it when the top-k hold all of p's mass; 1 - it is the
    total variation that speculative sampling pays for (docs/design.md section 2), the loss of --tv-weight.
    """
    q = torch.softmax(sub_logits.float(), dim=-1)
    q = torch.cat([q, q.new_zeros(q.shape[0], 1)], dim=-1)  # [n, K+1]: index K (not scorable) has q = 0
    p_top, p_other = _target_buckets(sub_ids, top_probs, rest, sub_logits.shape[-1])
    q_top = q.gather(-1, sub_ids)
    q_other = (1.0 - q_top.sum(-1)).clamp(min=0.0)
    return torch.minimum(p_top, q_top).sum(-1) + torch.minimum(p_other, q_other)


def draft_sub_logits(draft, input_ids: torch.Tensor, attention_mask: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Draft logits over its own output set at the valid positions: [n, K] (K = V for a full-vocabulary head)."""
    hidden = draft.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    return draft.lm_head(hidden[valid])


def _vocab_to_sub(draft) -> torch.Tensor:
    """[V] long: token id -> index in the draft's output set, K (one past the end) for tokens outside it."""
    vocab_size = draft.config.vocab_size
    sub_vocab_ids = getattr(draft, "sub_vocab_ids", None)
    if sub_vocab_ids is None:
        return torch.arange(vocab_size)
    table = torch.full((vocab_size,), len(sub_vocab_ids), dtype=torch.long)
    table[sub_vocab_ids.cpu()] = torch.arange(len(sub_vocab_ids))
    return table


def lr_at(step: int, args) -> float:
    """Linear warmup, then cosine decay to 10% of --lr at --steps."""
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    progress = min(1.0, (step - args.warmup_steps) / max(1, args.steps - args.warmup_steps))
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def optimizer_step(optimizer, params, loss: torch.Tensor, step: int, args) -> None:
    """One clipped AdamW step on `loss` at the schedule's learning rate for `step`."""
    for group in optimizer.param_groups:
        group["lr"] = lr_at(step, args)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()


def run_train(args, target_model):
    """Stage 2: train the draft; checkpoints work_dir/train_state.pt every --save-every steps."""
    records = load_records(args.work_dir, "train")
    state_path = Path(args.work_dir) / "train_state.pt"
    state = torch.load(state_path, weights_only=True) if args.resume and state_path.exists() else None
    initial, initial_sub_vocab = (None, None) if state is not None or not args.init_from else read_draft_weights(args.init_from)
    if state is not None and not args.refresh_sub_vocab:
        sub_vocab_ids = state["sub_vocab_ids"]
    elif initial is not None and not args.refresh_sub_vocab and initial_sub_vocab is not None:
        sub_vocab_ids = initial_sub_vocab.long()
    else:
        sub_vocab_ids = choose_sub_vocab(records, target_model.config.vocab_size, args.sub_vocab_size)
    config = draft_llama_config(target_model.config, args.num_layers, args.intermediate_size)
    draft = build_draft(target_model, config, sub_vocab_ids)
    params = [p for p in draft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, betas=(0.9, 0.98))
    start = 0
    if state is not None:
        draft.load_state_dict(state["draft"], strict=False)
        optimizer.load_state_dict(state["optimizer"])
        if args.refresh_sub_vocab:
            logger.info("sub-vocabulary chosen again from %d sequences", len(records))
        start = state["step"]
        logger.info("resumed from %s at step %d", state_path, start)
    elif initial is not None:
        # Warm start from an exported draft of the same shape (its stored layers; the head rows are the target's).
        with torch.no_grad():
            for name, tensor in trainable_state_dict(draft).items():
                tensor.copy_(initial[name])
        logger.info("initialised from the exported draft in %s", args.init_from)
    else:
        init_from_target(draft, target_model, args.init_layers)
    vocab_to_sub = _vocab_to_sub(draft)
    logger.info("draft: %d trainable parameters, output set %d tokens, %d training sequences",
                sum(p.numel() for p in params), int(vocab_to_sub.max()) if sub_vocab_ids is not None
                else config.vocab_size, len(records))
    draft.train()
    progress = tqdm(range(start, args.steps), desc="train", unit="step", initial=start, total=args.steps)
    for step in progress:
        if args.reload_data_every and step > start and step % args.reload_data_every == 0:
            records = load_records(args.work_dir, "train")
        # The batch depends only on (seed, step) and the shards present: a resumed run sees the same data.
        order = torch.randperm(len(records), generator=torch.Generator().manual_seed(args.seed * 7919 + step))
        batch = make_batch([records[i] for i in order[:args.batch_size].tolist()], vocab_to_sub)
        sub_logits = draft_sub_logits(draft, batch["input_ids"], batch["attention_mask"], batch["valid"])
        targets = (batch["sub_ids"], batch["top_probs"], batch["rest"])
        cross_entropy, kl = bucket_kl_loss(sub_logits, *targets)
        acceptance = bucket_acceptance(sub_logits, *targets).mean()
        loss = (1.0 - args.tv_weight) * cross_entropy + args.tv_weight * (1.0 - acceptance)
        optimizer_step(optimizer, params, loss, step, args)
        # .item(): the progress bar shows the loss; one sync per step is negligible next to the step itself.
        progress.set_postfix(loss=f"{loss.item():.3f}", kl=f"{kl.item():.3f}", acc=f"{acceptance.item():.3f}")
        if (step + 1) % args.save_every == 0 or step + 1 == args.steps:
            save_train_state(state_path, draft, optimizer, step + 1)
    return draft.eval()


def save_train_state(path: Path, draft, optimizer, step: int) -> None:
    """Atomically write the trainable weights, optimizer state and step."""
    state = {"draft": trainable_state_dict(draft), "optimizer": optimizer.state_dict(), "step": step,
             "sub_vocab_ids": getattr(draft, "sub_vocab_ids", None)}
    torch.save(state, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").rename(path)


def restore_draft(args, target_model):
    """The draft in work_dir/train_state.pt (for --stages export without train)."""
    state = torch.load(Path(args.work_dir) / "train_state.pt", weights_only=True)
    config = draft_llama_config(target_model.config, args.num_layers, args.intermediate_size)
    draft = build_draft(target_model, config, state["sub_vocab_ids"])
    draft.load_state_dict(state["draft"], strict=False)
    return draft.eval()


# ----------------------------------------------------------------------------- stage 4: eval


@torch.inference_mode()
def acceptance_stats(target_model, draft, records: list[dict], batch_size: int) -> dict:
    """Token-level acceptance sum_x min(p(x), q(x)) at temperature 1, full p and q, averaged over positions.

    Returns acceptance over generated positions (the next token was sampled by the target), over all
    positions (prompt included), and the mean p mass the draft can propose at all (its output set).
    """
    sums = {"generated": 0.0, "all": 0.0, "coverage": 0.0}
    counts = {"generated": 0, "all": 0}
    for start in range(0, len(records), batch_size):
        chunk = records[start:start + batch_size]
        batch = make_batch(chunk, torch.zeros(target_model.config.vocab_size, dtype=torch.long))
        kwargs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "use_cache": False}
        target_probs = torch.softmax(target_model(**kwargs).logits[batch["valid"]].float(), -1)  # [n, V]
        draft_probs = torch.softmax(draft(**kwargs).logits[batch["valid"]].float(), -1)  # [n, V]
        overlap = torch.minimum(target_probs, draft_probs).sum(-1)  # [n]
        covered = torch.where(draft_probs > 0, target_probs, 0.0).sum(-1)
        # .item(): scalar sums leave the tensors here; eval is not a hot loop.
        sums["generated"] += overlap[batch["generated"]].sum().item()
        sums["all"] += overlap.sum().item()
        sums["coverage"] += covered.sum().item()
        counts["generated"] += int(batch["generated"].sum())
        counts["all"] += overlap.numel()
    return {"acceptance_generated": sums["generated"] / max(1, counts["generated"]),
            "acceptance_all": sums["all"] / max(1, counts["all"]),
            "output_set_coverage": sums["coverage"] / max(1, counts["all"]),
            "num_generated_positions": counts["generated"], "num_positions": counts["all"]}


@torch.inference_mode()
def decode_ms_per_token(model, prompt_ids: torch.Tensor, num_tokens: int) -> float:
    """Milliseconds per greedy batch-1 decode step with the KV cache (prompt_ids [1, L])."""
    outputs = model(input_ids=prompt_ids, use_cache=True)
    token = outputs.logits[:, -1:].argmax(-1)
    elapsed = 0.0
    for step in range(num_tokens + 2):
        begin = time.perf_counter()
        outputs = model(input_ids=token, use_cache=True, **_cache_kwargs(outputs))
        token = outputs.logits[:, -1:].argmax(-1)
        if step >= 2:  # the first steps warm allocator and kernels
            elapsed += time.perf_counter() - begin
    return 1000 * elapsed / num_tokens


def run_eval(args, target_model) -> dict:
    """Stage 4: acceptance of the exported draft in --out-dir on held-out prompts, and batch-1 costs."""
    draft = load_distilled_draft(args.out_dir, target_model)
    records = load_records(args.work_dir, args.eval_split)
    if args.eval_split == "train":  # a sample of the training text, to measure over-fitting against
        records = records[::TRAIN_EVAL_EVERY]
    metrics = acceptance_stats(target_model, draft, records, args.eval_batch_size)
    if args.bench_tokens > 0:
        prompt = load_records(args.work_dir, "eval")[0]["input_ids"][None].long()
        metrics["target_ms_per_token"] = decode_ms_per_token(target_model, prompt, args.bench_tokens)
        metrics["draft_ms_per_token"] = decode_ms_per_token(draft, prompt, args.bench_tokens)
        metrics["draft_cost_ratio"] = metrics["draft_ms_per_token"] / metrics["target_ms_per_token"]
    return metrics


# ----------------------------------------------------------------------------- entry point

STAGES = ("questions", "generate", "draft-samples", "train", "export", "eval")
DEFAULT_STAGES = ("generate", "train", "export", "eval")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2", help='"smollm2" (embedded GGUF), a local model dir or hub id')
    parser.add_argument("--out-dir", default=str(DISTILLED_SMOLLM2_DRAFT_DIR), help="exported draft checkpoint")
    parser.add_argument("--work-dir", default=None, help="shards and training state (default: cache/distill/<out-dir name>)")
    parser.add_argument("--stages", default=",".join(DEFAULT_STAGES), help=f"comma-separated subset of {STAGES}")
    parser.add_argument("--eval-only", action="store_true", help="only the eval stage: print the acceptance of --out-dir")
    parser.add_argument("--resume", action="store_true", help="continue training from work-dir/train_state.pt")
    parser.add_argument("--refresh-sub-vocab", action="store_true",
                        help="on --resume, choose the sub-vocabulary again from all shards (the head is frozen target rows)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    # generate
    parser.add_argument("--prompts", default=str(DEFAULT_PROMPTS))
    parser.add_argument("--samples-per-prompt", type=int, default=3)
    parser.add_argument("--eval-samples-per-prompt", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--gen-batch-size", type=int, default=32)
    parser.add_argument("--store-top-k", type=int, default=64, help="target probabilities kept per position")
    parser.add_argument("--num-questions", type=int, default=0, help="questions stage: user turns the target writes")
    parser.add_argument("--sampler-from", default=None,
                        help="draft-samples stage: the exported draft that writes the text (default: --init-from)")
    parser.add_argument("--score-batch-size", type=int, default=16,
                        help="draft-samples stage: sequences per target scoring forward")
    parser.add_argument("--question-tokens", type=int, default=48, help="questions stage: longest user turn")
    parser.add_argument("--shard-prefix", default="",
                        help="name prefix of new shards, to add a round of samples (with another --seed) to the data")
    # draft architecture
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--intermediate-size", type=int, default=768)
    parser.add_argument("--sub-vocab-size", type=int, default=8192, help="K tokens the draft scores; 0: all V")
    parser.add_argument("--weight-format", choices=WEIGHT_FORMATS, default="bf16",
                        help="export: bf16, or int8 linear weights with per-row scales (half the bytes)")
    parser.add_argument("--init-from", default=None,
                        help="exported draft folder to start training from (same shape), instead of --init-layers")
    parser.add_argument("--init-layers", default="first,last",
                        help='target layers that initialise the draft layers ("first,last", "0,29", or "none")')
    # train
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per step")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup-steps", type=int, default=20)
    parser.add_argument("--tv-weight", type=float, default=0.0,
                        help="loss = (1 - w) * forward KL + w * total variation (1 - acceptance); 0: KL only")
    parser.add_argument("--save-every", type=int, default=100, help="training checkpoint interval (steps)")
    parser.add_argument("--reload-data-every", type=int, default=0,
                        help="re-read the shards every N steps, to train while generate runs in another process; 0: never")
    # eval
    parser.add_argument("--eval-batch-size", type=int, default=4)
    parser.add_argument("--eval-split", choices=["eval", "train"], default="eval",
                        help="held-out sequences, or every 64th training sequence (to compare)")
    parser.add_argument("--bench-tokens", type=int, default=32, help="batch-1 decode steps timed per model; 0: skip")
    args = parser.parse_args(argv)
    args.stages = ["eval"] if args.eval_only else [s for s in args.stages.split(",") if s]
    if "questions" in args.stages and args.num_questions < 1:
        parser.error("--stages questions needs --num-questions > 0")
    if "draft-samples" in args.stages:
        args.sampler_from = args.sampler_from or args.init_from
        if args.sampler_from is None:
            parser.error("--stages draft-samples needs --sampler-from (or --init-from): the draft that writes")
    if not 0.0 <= args.tv_weight <= 1.0:
        parser.error(f"--tv-weight must be in [0, 1], got {args.tv_weight}")
    unknown = set(args.stages) - set(STAGES)
    if unknown:
        parser.error(f"--stages: unknown {sorted(unknown)}; choose from {STAGES}")
    if args.work_dir is None:
        args.work_dir = str(cache_dir() / "distill" / Path(args.out_dir).name)
    return args


def main(argv: list[str] | None = None) -> dict:
    """Run the requested stages; returns the eval metrics (empty when eval is not run)."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    # Denormal floats in the dequantised GGUF weights' activations make CPU matmuls several times slower.
    torch.set_flush_denormal(True)
    torch.manual_seed(args.seed)
    model, tokenizer = load_target(args.target)
    metrics = {}
    if "questions" in args.stages:
        run_questions(args, model, tokenizer)
    if "generate" in args.stages:
        run_generate(args, model, tokenizer)
    if "draft-samples" in args.stages:
        run_draft_samples(args, model, tokenizer)
    if "train" in args.stages:
        draft = run_train(args, model)
    if "export" in args.stages:
        if "train" not in args.stages:
            draft = restore_draft(args, model)
        made_by = " ".join(["python -m scripts.distill_draft", *(argv if argv is not None else sys.argv[1:])])
        save_distilled_draft(draft, args.out_dir, extra_config={"made_by": made_by}, weight_format=args.weight_format)
        logger.info("exported draft to %s", args.out_dir)
    if "eval" in args.stages:
        if not _shard_paths(args.work_dir):
            logger.info("no shards under %s: generating the held-out samples first", args.work_dir)
            run_generate(args, model, tokenizer, only_eval=True)
        metrics = run_eval(args, model)
        print(json.dumps(metrics, indent=2))
    return metrics


if __name__ == "__main__":
    main()
