"""Grouped-query attention on the CPU: transformers' sdpa path against models/cpu_attention.py's, side by side.

    python -m scripts.bench_gqa_attention                      # target forwards: bf16, 2 threads, B = 1 4 16
    python -m scripts.bench_gqa_attention --jobs --batch-sizes 1 16 --temperatures 0 1   # whole jobs

Forwards (the default): the default pair's target loaded twice in bf16, one on transformers' "sdpa"
attention (which copies each key/value head once per query head of its group in a masked forward of
several positions) and one on the engine's grouped-query attention (`use_gqa_attention`, what
ModelRunner sets on a CPU model). Through the engine's ModelRunner, after a --context-token prompt per
row, it times the target scoring 1 and 3 tokens per row (a plain step, a g = 2 block); the two take
turns, --iters forwards each, --repeats rounds, the median per round, then over rounds. It also checks
that both give bitwise the same logits.

--jobs: whole jobs in the local runtime with the target on either attention (two generators in this
process, taking turns): bench_throughput's length-skewed records (--records-at-b1 of them at B = 1,
--num-records otherwise), autoregressive, fixed g = --num-draft-tokens and goodput, --repeats rounds.
Prints tokens/s (mean over rounds) and each policy's ratio over the autoregressive job on the same
attention. Writes nothing; docs/RESULTS.md quotes its tables.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from distributed_spec.engine import ModelRunner
from scripts.bench_cpu_linear import add_arguments, jobs_side_by_side, time_side_by_side
from scripts.common import load_default_pair, markdown_table

KINDS = ("sdpa", "grouped")


def runner_on(model, kind: str) -> ModelRunner:
    """A ModelRunner over `model` with its attention as `kind` (the runner picks grouped by itself)."""
    runner = ModelRunner(model)
    if kind == "sdpa":
        model.set_attn_implementation("sdpa")
    return runner


def forwards_table(args) -> str:
    models = {kind: load_default_pair(draft="distilled", dtype="bfloat16")[0].model for kind in KINDS}
    rows = []
    with torch.inference_mode():
        for batch_size in args.batch_sizes:
            context = [[5 + (i * 7 + row) % 1000 for i in range(args.context + 3 * row)] for row in range(batch_size)]
            for num_tokens in (1, 3):
                runners = {kind: runner_on(model, kind) for kind, model in models.items()}
                input_ids = torch.randint(5, 1000, (batch_size, num_tokens), generator=torch.Generator().manual_seed(0))
                ms, same = time_side_by_side(runners, context, input_ids, args)
                rows.append([
                    batch_size, num_tokens, f"{ms['sdpa']:.2f}", f"{ms['grouped']:.2f}",
                    f"{ms['sdpa'] / ms['grouped']:.2f}", "yes" if same else "NO",
                ])
    return markdown_table(
        ["B", "tokens per row", "sdpa ms", "grouped ms", "sdpa / grouped", "same logits"], rows
    )


def load_jobs(args, records: Path) -> tuple[dict, dict]:
    """The job and a loaded generator per attention kind (the sdpa one's target switched back)."""
    from distributed_spec.jobs.runner import build_generator
    from scripts.common import base_job

    options = argparse.Namespace(tiny=False, dtype="bfloat16", overrides=[f"parallel.num_threads={args.threads}"])
    jobs = {kind: base_job(options, "local", records) for kind in KINDS}
    generators = {kind: build_generator(job) for kind, job in jobs.items()}
    generators["sdpa"].engine.target_runner.model.set_attn_implementation("sdpa")
    return jobs, generators


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{args.threads} thread(s), bf16, the default pair's target")
    print(jobs_side_by_side(args, lambda records: load_jobs(args, records)) if args.jobs else forwards_table(args))


if __name__ == "__main__":
    main()
