"""What the goodput schedule chooses, step by step, in one real job on the default pair.

    python -m scripts.trace_goodput --batch-size 16 --temperature 0 --num-records 64

The job is bench_throughput's (the same length-skewed records, bf16, local runtime, goodput up to
--max-draft-len). Each step prints the batch size, the g chosen, the predicted seconds T(B, g) and
expected tokens per row of every g, the acceptance rates goodput chooses with (upper confidence
bound) and their means, and the rows' mean own factor: what docs/RESULTS.md's diagnosis of goodput
at B = 16 reads.
"""

from __future__ import annotations

import argparse
import collections
import logging
import tempfile
from dataclasses import replace
from pathlib import Path

from scripts.bench_throughput import Policy, write_records
from scripts.common import base_job, measure


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--num-records", type=int, default=64)
    parser.add_argument("--max-draft-len", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from distributed_spec.engine.goodput import GoodputPolicy
    from distributed_spec.jobs.runner import build_generator

    trace = []
    choose_step = GoodputPolicy.choose_step

    def traced(policy: GoodputPolicy, rows, num_rows: int) -> int:
        g = choose_step(policy, rows, num_rows)
        widths = range(policy.max_draft_len + 1)
        seconds = [policy.cost.predict(num_rows, width) for width in widths]
        tokens = [policy.expected_tokens(rows, width) / max(len(rows), 1) for width in widths]
        factor = sum(record.factor() for _, record in rows) / max(len(rows), 1)
        trace.append((num_rows, g, seconds, tokens, policy.acceptance.rates(policy.optimism), policy.acceptance.rates(), factor))
        return g

    GoodputPolicy.choose_step = traced
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_records(work / "records.jsonl", args.num_records)
        job = base_job(argparse.Namespace(tiny=False, dtype=args.dtype), "local", work / "records.jsonl")
        verifier = Policy("goodput", draft_len_schedule="goodput", g=1, max_draft_len=args.max_draft_len).verifier()
        job = replace(
            job,
            verifier=verifier,
            sampling=replace(job.sampling, temperature=args.temperature),
            data=replace(job.data, batch_size=args.batch_size),
        )
        summary = measure(build_generator(job), job, work / "out")

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1e3:.1f}"

    print("B  g  | T(B, g) ms per g | tokens per row per g | rates (bound) | rates (mean) | row factor")
    for num_rows, g, seconds, tokens, bound, rates, factor in trace:
        print(
            f"{num_rows:<2} {g}  | {' '.join(ms(value) for value in seconds)} | "
            f"{' '.join(f'{value:.2f}' for value in tokens)} | {' '.join(f'{r:.2f}' for r in bound[:2])} | "
            f"{' '.join(f'{r:.2f}' for r in rates[:2])} | {factor:.2f}"
        )
    steps = collections.Counter((num_rows, g) for num_rows, g, *_ in trace)
    print("steps per (B, g):", dict(sorted(steps.items())))
    print(f"{summary['tokens_per_s']:.1f} tokens/s, steps per g {summary.get('steps_per_draft_len')}")


if __name__ == "__main__":
    main()
