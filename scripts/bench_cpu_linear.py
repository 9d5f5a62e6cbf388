"""model.cpu_prepack: the default pair's forwards with bf16 linears plain and packed once, side by side.

    python -m scripts.bench_cpu_linear                          # 2 threads, bf16, B = 1 4 16
    python -m scripts.bench_cpu_linear --threads 1 --batch-sizes 1

Loads the default pair (SmolLM2 target, the bundled distilled draft) twice in bf16 and packs one copy
(models/cpu_linear.py). Through the engine's ModelRunner, after a --context-token prompt per row, it
times the forwards a step is made of: the target scoring 1 and 3 tokens per row (a plain step, a
g = 2 block) and the draft drafting one token per row. Plain and packed take turns, --iters forwards
each, --repeats rounds; the median per round, then the median over rounds. It also checks that both
copies give bitwise the same logits. Writes nothing; docs/RESULTS.md quotes its tables.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from distributed_spec.engine import ModelRunner
from distributed_spec.models.cpu_linear import pack_cpu_linears
from scripts.common import load_default_pair, markdown_table


def forward_seconds(runner: ModelRunner, input_ids: torch.Tensor) -> float:
    """Seconds of one forward of input_ids [B, n] after the runner's cached context (rolled back after)."""
    start = time.perf_counter()
    runner.forward_tokens(input_ids)
    seconds = time.perf_counter() - start
    runner.rollback(torch.zeros(input_ids.shape[0], dtype=torch.long), input_ids.shape[1])
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--context", type=int, default=100, help="prompt tokens per row before the timed forwards")
    parser.add_argument("--iters", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    plain = load_default_pair(draft="distilled", dtype="bfloat16")
    packed = load_default_pair(draft="distilled", dtype="bfloat16")
    num_packed = [pack_cpu_linears(loaded.model) for loaded in packed]
    print(f"{args.threads} thread(s), bf16; linears packed: target {num_packed[0]}, draft {num_packed[1]}")

    rows = []
    with torch.inference_mode():
        for batch_size in args.batch_sizes:
            context = [[5 + (i * 7 + row) % 1000 for i in range(args.context)] for row in range(batch_size)]
            for role, index, num_tokens in (("target", 0, 1), ("target", 0, 3), ("draft", 1, 1)):
                runners = {name: ModelRunner(pair[index].model) for name, pair in (("plain", plain), ("packed", packed))}
                for runner in runners.values():
                    runner.prefill(context)
                input_ids = torch.randint(5, 1000, (batch_size, num_tokens), generator=torch.Generator().manual_seed(0))
                logits = {name: runner.forward_tokens(input_ids) for name, runner in runners.items()}
                same = torch.equal(logits["plain"], logits["packed"])
                for runner in runners.values():
                    runner.rollback(torch.zeros(batch_size, dtype=torch.long), num_tokens)
                rounds: dict[str, list[float]] = {name: [] for name in runners}
                for _ in range(args.repeats):
                    seconds: dict[str, list[float]] = {name: [] for name in runners}
                    for _ in range(args.iters):
                        for name, runner in runners.items():
                            seconds[name].append(forward_seconds(runner, input_ids))
                    for name in runners:
                        rounds[name].append(statistics.median(seconds[name]))
                ms = {name: 1000 * statistics.median(values) for name, values in rounds.items()}
                rows.append([
                    role, batch_size, num_tokens, f"{ms['plain']:.2f}", f"{ms['packed']:.2f}",
                    f"{ms['plain'] / ms['packed']:.2f}", "yes" if same else "NO",
                ])
    print(markdown_table(
        ["model", "B", "tokens per row", "plain ms", "packed ms", "plain / packed", "same logits"], rows
    ))


if __name__ == "__main__":
    main()
