"""Time token vs block vs greedy verification on this machine.

    python -m scripts.bench_verify                       # the full grid, markdown table
    python -m scripts.bench_verify --batch 1 --gamma 4 --vocab 49152 --repeats 5

Each row times one `verify(...)` call from probabilities (what the rule itself costs) and one
verification step from target logits (the softmax of the target's g+1 positions included: what
the engine pays per iteration). Block verification needs one more reduction over V per draft
position than token verification; the ratio column shows what that costs.
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch

from distributed_spec.verify import SamplingParams, draw_uniforms, logits_to_probs, verify


def _time_calls(calls: dict, repeats: int) -> dict[str, float]:
    """Fastest of `repeats` calls of each, after one warm-up; the calls take turns, so load or
    frequency changes on the machine hit every method alike."""
    durations = {name: [] for name in calls}
    for fn in calls.values():
        fn()
    for _ in range(repeats):
        for name, fn in calls.items():
            start = time.perf_counter()
            fn()
            durations[name].append(time.perf_counter() - start)
    return {name: min(times) for name, times in durations.items()}


def bench_point(batch_size: int, gamma: int, vocab_size: int, repeats: int) -> dict[str, float]:
    generator = torch.Generator().manual_seed(0)
    target_logits = torch.randn(batch_size, gamma + 1, vocab_size, generator=generator) * 3
    draft_logits = target_logits[:, :gamma] + torch.randn(batch_size, gamma, vocab_size, generator=generator)
    params = SamplingParams(temperature=1.0)
    draft_probs = logits_to_probs(draft_logits, params)
    draft_ids = torch.multinomial(draft_probs.view(-1, vocab_size), 1, generator=generator).view(
        batch_size, gamma
    )
    target_probs = logits_to_probs(target_logits, params)
    uniforms = draw_uniforms(batch_size, gamma, generator)
    calls = {}
    for method in ("token", "block", "greedy"):
        calls[method] = lambda m=method: verify(m, draft_ids, draft_probs, target_probs, None, uniforms)
        calls[f"{method}_from_logits"] = lambda m=method: verify(
            m, draft_ids, draft_probs, logits_to_probs(target_logits, params), None, uniforms
        )
    return _time_calls(calls, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--gamma", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--vocab", type=int, nargs="+", default=[49152, 128256])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {args.threads} threads, best of {args.repeats} calls, microseconds per call\n"
    )
    print(
        "| B | g | V | token | block | greedy | block/token | token (from logits) | block (from logits) | block/token (from logits) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for batch_size, gamma, vocab_size in itertools.product(args.batch, args.gamma, args.vocab):
        t = {k: v * 1e6 for k, v in bench_point(batch_size, gamma, vocab_size, args.repeats).items()}
        print(
            f"| {batch_size} | {gamma} | {vocab_size} | {t['token']:.0f} | {t['block']:.0f} | {t['greedy']:.0f} | "
            f"{t['block'] / t['token']:.2f} | {t['token_from_logits']:.0f} | {t['block_from_logits']:.0f} | "
            f"{t['block_from_logits'] / t['token_from_logits']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
