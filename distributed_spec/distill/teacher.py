"""What the target (the teacher) writes: its continuations with p at every position, the scoring of
text another model wrote, and user turns it writes itself (stages questions, generate, draft-samples)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from distributed_spec.distill.data import (
    missing_shards,
    pad_batch,
    sample_jobs,
    write_prompts,
    write_shard,
)
from distributed_spec.models.distilled import load_distilled_draft
from distributed_spec.models.fetch import smollm2_gguf_path

logger = logging.getLogger("distributed_spec.distill")


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


def eos_and_pad(model, tokenizer) -> tuple[int, int]:
    """The token that ends a sample, and the one that pads a batch (EOS when there is no pad)."""
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else model.config.eos_token_id
    return eos, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos


def cache_kwargs(outputs) -> dict:
    """The KV cache of a forward's outputs as the kwarg the next forward takes (`cache` in transformers 5)."""
    name = "cache" if "cache" in outputs else "past_key_values"
    return {name: outputs[name]}


def top_k_record(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [N, V] -> top-k ids [N, k] int32, their probs [N, k] fp16, rest mass [N] fp32."""
    probs = torch.softmax(logits.float(), dim=-1)
    top_probs, top_ids = probs.topk(k, dim=-1)
    rest = (1.0 - top_probs.sum(-1)).clamp(min=0.0)
    return top_ids.to(torch.int32), top_probs.to(torch.float16), rest


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
        top_ids, top_probs, rest = top_k_record(head(outputs.last_hidden_state[b, max_len - len(ids):]), top_k)
        records.append({"prompt": ids, "generated": [], "topk_ids": [top_ids], "topk_probs": [top_probs], "rest": [rest]})
    next_logits = head(outputs.last_hidden_state[:, -1])  # [B, V]
    cache = cache_kwargs(outputs)
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
        cache = cache_kwargs(outputs)
        next_logits = head(outputs.last_hidden_state[:, -1])
        top_ids, top_probs, rest = top_k_record(next_logits, top_k)
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
    encoded, jobs = sample_jobs(args, tokenizer, ("eval",) if only_eval else ("train", "eval"))
    eos, pad = eos_and_pad(model, tokenizer)
    prefix = "eval_shard" if only_eval else f"{args.shard_prefix}shard"
    progress = tqdm(missing_shards(args, jobs, prefix), desc="generate", unit="batch")
    for shard, path, batch in progress:
        generator = torch.Generator().manual_seed(args.seed * 100_003 + shard + (50_000 if only_eval else 0))
        records = generate_with_target_probs(
            model, [encoded[i] for i, _, _ in batch], args.max_new_tokens, eos, pad, args.store_top_k, generator
        )
        progress.set_postfix(tokens=write_shard(path, records, batch))


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
        top_ids, top_probs, rest = top_k_record(head(hidden[b, :len(ids) - 1]), top_k)
        records.append({"input_ids": torch.tensor(ids, dtype=torch.int32), "topk_ids": top_ids,
                        "topk_probs": top_probs, "rest": rest, "num_prompt_tokens": len(prompt_ids[b])})
    return records


def run_draft_samples(args, model, tokenizer) -> None:
    """Stage 1b: the draft in --sampler-from continues the training prompts, the target scores the text;
    one shard per batch under work_dir/data (existing shards are kept), as run_generate writes them."""
    sampler = load_distilled_draft(args.sampler_from, model).eval()
    encoded, jobs = sample_jobs(args, tokenizer, ("train",))
    eos, pad = eos_and_pad(model, tokenizer)
    progress = tqdm(missing_shards(args, jobs, f"{args.shard_prefix or 'draft_'}shard"), desc="draft samples",
                    unit="batch")
    for shard, path, batch in progress:
        batch_prompts = [encoded[i] for i, _, _ in batch]
        continuations = sample_continuations(sampler, batch_prompts, args.max_new_tokens, eos, pad,
                                             seed=args.seed * 100_003 + shard + 70_000)
        records, step = [], args.score_batch_size
        for start in range(0, len(batch), step):
            records += score_with_target(model, batch_prompts[start:start + step],
                                         continuations[start:start + step], args.store_top_k)
        progress.set_postfix(tokens=write_shard(path, records, batch))


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
    eos, pad = eos_and_pad(model, tokenizer)
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
    write_prompts(path, questions, "user turns written by the target (python -m distributed_spec.distill --stages questions)")
    logger.info("wrote %d of %d questions (finished turns) to %s", len(questions), len(openings), path)
    return path
