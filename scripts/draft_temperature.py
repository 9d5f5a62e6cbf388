"""Would a sharper or flatter draft accept more? Acceptance of the default pair at T against a draft at T x s.

    python -m scripts.draft_temperature                       # T = 1, s = 0.5 ... 1.1, bf16
    python -m scripts.draft_temperature --temperature 0.6 --scales 0.8 1.0 1.2

Verification is exact for any q the draft samples from, so the draft could sample at its own
temperature T x s instead of the target's T. This measures whether that would pay: the target
samples --max-new-tokens tokens at temperature T after each bundled bench prompt; at every sampled
position it takes p = softmax(target logits / T) and q_s = softmax(draft logits / (T x s)) and
prints the mean of sum_x min(p, q_s), the chance a single drafted token is accepted, per s. Writes
nothing; docs/RESULTS.md quotes its output.
"""

from __future__ import annotations

import argparse

import torch

from scripts.common import chat_ids, load_default_pair, markdown_table, read_bench_prompts


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--scales", type=float, nargs="+", default=[0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    target, draft = load_default_pair(draft="distilled", dtype=args.dtype)
    overlaps: dict[float, list[torch.Tensor]] = {scale: [] for scale in args.scales}
    for record in read_bench_prompts():
        prompt = torch.tensor([chat_ids(target.tokenizer, record["messages"])])
        sequence = target.model.generate(
            prompt, do_sample=True, temperature=args.temperature, top_k=0, top_p=1.0,
            max_new_tokens=args.max_new_tokens,
        )
        # Logits at the positions that predicted the sampled tokens.
        positions = slice(prompt.shape[1] - 1, sequence.shape[1] - 1)
        target_logits = target.model(sequence).logits[0, positions].float()
        draft_logits = draft.model(input_ids=sequence, attention_mask=torch.ones_like(sequence)).logits[0, positions]
        p = torch.softmax(target_logits / args.temperature, dim=-1)
        for scale in args.scales:
            q = torch.softmax(draft_logits.float() / (args.temperature * scale), dim=-1)
            overlaps[scale].append(torch.minimum(p, q).sum(dim=-1))
    rows = []
    for scale in args.scales:
        overlap = torch.cat(overlaps[scale])
        rows.append([f"{scale:g}", f"{args.temperature * scale:g}", f"{overlap.mean():.4f}", overlap.numel()])
    print(f"target at T = {args.temperature:g}, {args.dtype}, {len(read_bench_prompts())} bench prompts")
    print(markdown_table(["s", "draft temperature", "mean sum_x min(p, q)", "positions"], rows))


if __name__ == "__main__":
    main()
