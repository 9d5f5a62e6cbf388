"""The draft's forward: models/lean_llama.py's plain-torch path against transformers' own, side by side.

    python -m scripts.bench_draft_forward                       # the bundled distilled draft, bf16
    python -m scripts.bench_draft_forward --threads 1 --batch-sizes 1 4
    python -m scripts.bench_draft_forward --jobs --batch-sizes 1 4        # whole jobs, fixed g = 2

One draft token per row (what a block costs per position on top of the target's forward) through
the engine's ModelRunner on the job's own pair, after a --context-token prompt per row; the two paths
take turns, --repeats rounds of --iters forwards each, median per round. With --jobs, whole jobs
instead (bench_throughput's 64 length-skewed records, local runtime, greedy, fixed g = --num-draft-tokens,
the same tokens on either path): autoregressive, the draft through transformers, the draft through the
lean path, taking turns --repeats times; tokens/s, mean over rounds. Writes nothing.
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


def time_jobs(generator, args, batch_size: int, work: Path) -> list[float]:
    """Mean tokens/s of [autoregressive, transformers' draft forward, lean draft forward] jobs."""
    from dataclasses import replace

    from scripts.bench_throughput import Policy, write_records
    from scripts.common import measure

    write_records(work / "records.jsonl", args.num_records)
    job = base_job(argparse.Namespace(tiny=False, dtype=args.dtype), "local", work / "records.jsonl")
    job = replace(job, data=replace(job.data, batch_size=batch_size), sampling=replace(job.sampling, temperature=0.0))
    draft_class = type(generator.engine.draft_runner.model)
    autoregressive = Policy("autoregressive", method="autoregressive", g=1, max_draft_len=1)
    fixed = Policy(f"g={args.num_draft_tokens}", g=args.num_draft_tokens, max_draft_len=args.num_draft_tokens)
    cases = [(autoregressive, True), (fixed, False), (fixed, True)]
    speeds: list[list[float]] = [[] for _ in cases]
    shipped = draft_class.lean_forward
    try:
        for round_index in range(args.repeats):
            for index, (policy, lean) in enumerate(cases):
                draft_class.lean_forward = lean
                summary = measure(generator, replace(job, verifier=policy.verifier()), work / f"out-{round_index}-{index}")
                speeds[index].append(summary["tokens_per_s"])
    finally:
        # A class attribute: put the shipped path back even when a job fails.
        draft_class.lean_forward = shipped
    return [statistics.mean(values) for values in speeds]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the local runtime's default: 2)")
    parser.add_argument("--context", type=int, default=100, help="prompt tokens per row before the timed forwards")
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--jobs", action="store_true", help="whole jobs instead of single forwards")
    parser.add_argument("--num-records", type=int, default=64, help="--jobs: records per job")
    parser.add_argument("--num-draft-tokens", type=int, default=2, help="--jobs: the fixed g")
    args = parser.parse_args(argv)

    from distributed_spec.jobs.runner import build_generator

    torch.set_num_threads(args.threads)
    job = base_job(argparse.Namespace(tiny=False, dtype=args.dtype), "local", Path("unused.jsonl"))
    generator = build_generator(job)
    runner = generator.engine.draft_runner
    model = runner.model
    if not hasattr(model, "lean_forward"):
        raise SystemExit(f"the job's draft ({type(model).__name__}) has no lean path")
    if args.jobs:
        import tempfile

        rows = []
        for batch_size in args.batch_sizes:
            with tempfile.TemporaryDirectory() as tmp:
                autoregressive, transformers_tps, lean_tps = time_jobs(generator, args, batch_size, Path(tmp))
            rows.append([batch_size, f"{autoregressive:.1f}", f"{transformers_tps:.1f}", f"{lean_tps:.1f}",
                         f"{transformers_tps / autoregressive:.3f}", f"{lean_tps / autoregressive:.3f}",
                         f"{lean_tps / transformers_tps:.3f}"])
        generator.close()
        print(f"whole jobs, {args.num_records} records, g = {args.num_draft_tokens}, greedy, {args.dtype}, "
              f"{args.threads} thread(s), mean of {args.repeats} rounds (tokens/s)")
        print(markdown_table(["B", "autoregressive", "transformers draft", "lean draft", "transformers x AR",
                              "lean x AR", "lean / transformers"], rows))
        return
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
