"""The draft's forward: models/lean_llama.py's plain-torch path against transformers' own, side by side.

    python -m scripts.bench_draft_forward                       # the bundled distilled draft, bf16
    python -m scripts.bench_draft_forward --threads 1 --batch-sizes 1 4

One draft token per row (what a block costs per position on top of the target's forward) through
the engine's ModelRunner on the job's own pair, after a --context-token prompt per row; the two paths
take turns, --repeats rounds of --iters forwards each, median per round. Writes nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from scripts.common import base_job, markdown_table


def time_forward(runner, batch_size: int, context: int, iters: int) -> float:
    """Median seconds of one draft forward of one token per row (the slot is rolled back after each)."""
    runner.prefill([[5 + (i % 1000) for i in range(context)] for _ in range(batch_size)])
    input_ids = torch.full((batch_size, 1), 7)
    no_slot_kept = torch.zeros(batch_size, dtype=torch.long)
    seconds = []
    for _ in range(iters):
        start = time.perf_counter()
        runner.forward_tokens(input_ids, num_logits=1)
        seconds.append(time.perf_counter() - start)
        runner.rollback(no_slot_kept, 1)
    return statistics.median(seconds)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the local runtime's default: 2)")
    parser.add_argument("--context", type=int, default=100, help="prompt tokens per row before the timed forwards")
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args(argv)

    from distributed_spec.jobs.runner import build_generator

    torch.set_num_threads(args.threads)
    job = base_job(argparse.Namespace(tiny=False, dtype=args.dtype), "local", Path("unused.jsonl"))
    generator = build_generator(job)
    runner = generator.engine.draft_runner
    model = runner.model
    if not hasattr(model, "lean_forward"):
        raise SystemExit(f"the job's draft ({type(model).__name__}) has no lean path")
    rows = []
    for batch_size in args.batch_sizes:
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.repeats):
            for lean in (False, True):
                model.lean_forward = lean
                times[lean].append(time_forward(runner, batch_size, args.context, args.iters))
        transformers_ms, lean_ms = (1e3 * statistics.median(times[lean]) for lean in (False, True))
        rows.append([batch_size, f"{transformers_ms:.2f}", f"{lean_ms:.2f}", f"{transformers_ms / lean_ms:.2f}"])
    generator.close()
    print(f"draft forward, one token per row, {args.dtype}, {args.threads} thread(s), {args.context}-token context")
    print(markdown_table(["B", "transformers ms", "lean ms", "speedup"], rows))


if __name__ == "__main__":
    main()
