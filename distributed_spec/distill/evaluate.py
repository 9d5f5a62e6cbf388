"""Stage eval: token-level acceptance of an exported draft on held-out text, and its cost per token."""

from __future__ import annotations

import time

import torch

from distributed_spec.distill.data import load_records, make_batch
from distributed_spec.distill.teacher import cache_kwargs
from distributed_spec.models.distilled import load_distilled_draft

TRAIN_EVAL_EVERY = 64  # --eval-split train scores every 64th training sequence


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
        outputs = model(input_ids=token, use_cache=True, **cache_kwargs(outputs))
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
