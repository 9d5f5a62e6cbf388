"""Would a wider draft head accept more? The default pair's acceptance with the draft's head widened to K tokens.

    python -m scripts.draft_sub_vocab                          # T = 1, K = 8192 (shipped) ... 49152, bf16
    python -m scripts.draft_sub_vocab --temperature 0 --sizes 8192 16384

The bundled draft scores K = 8192 tokens (its `sub_vocab_ids`); q(x) = 0 for the others, so a token
outside them is never proposed, and acceptance is capped by the target's mass on them. Its head rows
are the target's own LM-head rows, so the head can be widened without training: K' > K scores the
shipped K tokens plus the K' - K lowest token ids not among them (a BPE tokenizer numbers its merges
in the order it learned them, the frequent first), each through the target's head row.
Verification stays exact for any such q. This measures whether that would pay: the target samples
--max-new-tokens tokens at temperature T after each bundled bench prompt (greedy at T = 0); at every
such position, per K', it prints the target's mass on the K' tokens, the chance a single drafted
token is accepted (sum_x min(p, q); at T = 0, whether the draft's argmax is the target's), and the
draft's forward time at B = 1 (ModelRunner, median, the K' heads taking turns). Writes nothing;
docs/RESULTS.md quotes its output.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from torch import nn

from distributed_spec.engine.runner import ModelRunner
from scripts.bench_draft_forward import time_forward
from scripts.common import chat_ids, load_default_pair, markdown_table, read_bench_prompts


def widened_ids(sub_vocab_ids: torch.Tensor, vocab_size: int, size: int) -> torch.Tensor:
    """sub_vocab_ids [K] -> [size] (size >= K): the shipped ids first, then the lowest ids not among them."""
    taken = torch.zeros(vocab_size, dtype=torch.bool)
    taken[sub_vocab_ids] = True
    extra = torch.nonzero(~taken).flatten()[: max(size - sub_vocab_ids.numel(), 0)]
    return torch.cat([sub_vocab_ids, extra])


def widen_head(draft_model, target_head: torch.Tensor, ids: torch.Tensor) -> None:
    """Point the draft's sub-vocabulary head at the target's head rows `ids` ([K'] long; in place)."""
    draft_model.lm_head = nn.Linear(target_head.shape[1], ids.numel(), bias=False, dtype=target_head.dtype)
    draft_model.lm_head.weight = nn.Parameter(target_head[ids].clone(), requires_grad=False)
    draft_model.sub_vocab_ids = ids


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--sizes", type=int, nargs="+", default=[8192, 12288, 16384, 24576, 49152])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timing-rounds", type=int, default=3, help="rounds of draft-forward timing per K")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    target, draft = load_default_pair(draft="distilled", dtype=args.dtype)
    model = draft.model
    shipped = model.sub_vocab_ids.clone()
    target_head = target.model.get_output_embeddings().weight.detach()
    ids_by_size = {size: widened_ids(shipped, target_head.shape[0], size) for size in args.sizes}
    covered = {size: [] for size in args.sizes}
    accepted = {size: [] for size in args.sizes}
    greedy = args.temperature == 0
    for record in read_bench_prompts():
        prompt = torch.tensor([chat_ids(target.tokenizer, record["messages"])])
        generate = {"do_sample": False} if greedy else {"do_sample": True, "temperature": args.temperature, "top_k": 0, "top_p": 1.0}
        sequence = target.model.generate(prompt, max_new_tokens=args.max_new_tokens, **generate)
        # Logits at the positions that predicted the generated tokens.
        positions = slice(prompt.shape[1] - 1, sequence.shape[1] - 1)
        target_logits = target.model(sequence).logits[0, positions].float()
        p = torch.softmax(target_logits / max(args.temperature, 1e-6), dim=-1) if not greedy else None
        for size, ids in ids_by_size.items():
            widen_head(model, target_head, ids)
            draft_logits = model(input_ids=sequence, attention_mask=torch.ones_like(sequence)).logits[0, positions].float()
            if greedy:
                target_best = target_logits.argmax(dim=-1)
                covered[size].append(torch.isin(target_best, ids).float())
                accepted[size].append((draft_logits.argmax(dim=-1) == target_best).float())
            else:
                q = torch.softmax(draft_logits / args.temperature, dim=-1)
                covered[size].append(p[:, ids].sum(dim=-1))
                accepted[size].append(torch.minimum(p, q).sum(dim=-1))
    seconds = {size: [] for size in args.sizes}
    for _ in range(args.timing_rounds):
        for size, ids in ids_by_size.items():
            widen_head(model, target_head, ids)
            seconds[size].append(time_forward(ModelRunner(model), batch_size=1, context=100, iters=40))
    widen_head(model, target_head, shipped)
    rows = []
    for size in args.sizes:
        rows.append([
            size,
            f"{torch.cat(covered[size]).mean():.4f}",
            f"{torch.cat(accepted[size]).mean():.4f}",
            f"{statistics.median(seconds[size]) * 1e3:.2f}",
            torch.cat(accepted[size]).numel(),
        ])
    what = "argmax in the K tokens / draft argmax = target argmax" if greedy else "target mass on the K tokens / sum_x min(p, q)"
    print(f"target at T = {args.temperature:g}, {args.dtype}, {len(read_bench_prompts())} bench prompts; columns 2-3: {what}")
    print(markdown_table(["K", "covered", "accepted", "draft forward ms (B = 1)", "positions"], rows))


if __name__ == "__main__":
    main()
