"""model.cpu_prepack: the default pair with bf16 linears plain and packed once, side by side.

    python -m scripts.bench_cpu_linear                          # forwards: 2 threads, bf16, B = 1 4 16
    python -m scripts.bench_cpu_linear --threads 1 --batch-sizes 1
    python -m scripts.bench_cpu_linear --jobs --batch-sizes 1 4 16 --temperatures 0 1   # whole jobs

Forwards (the default): loads the default pair (SmolLM2 target, the bundled distilled draft) twice in
bf16 and packs one copy (models/cpu_linear.py). Through the engine's ModelRunner, after a
--context-token prompt per row, it times the forwards a step is made of: the target scoring 1 and 3
tokens per row (a plain step, a g = 2 block) and the draft drafting one token per row. Plain and
packed take turns, --iters forwards each, --repeats rounds; the median per round, then the median
over rounds. It also checks that both copies give bitwise the same logits.

--jobs: whole jobs instead, in the local runtime with model.cpu_prepack false and true (two
generators in this process, so that their jobs can take turns): bench_throughput's length-skewed
records (--records-at-b1 of them at B = 1, --num-records otherwise), autoregressive, fixed g =
--num-draft-tokens and goodput, plain and packed taking turns --repeats times. Prints tokens/s (mean
over rounds) and each policy's ratio over the autoregressive of its own kind. Writes nothing;
docs/RESULTS.md quotes its tables.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from distributed_spec.engine import ModelRunner
from distributed_spec.models.cpu_linear import pack_cpu_linears
from scripts.common import load_default_pair, markdown_table, time_calls


def forward_seconds(runner: ModelRunner, input_ids: torch.Tensor) -> float:
    """Seconds of one forward of input_ids [B, n] after the runner's cached context (rolled back after)."""
    start = time.perf_counter()
    runner.forward_tokens(input_ids)
    seconds = time.perf_counter() - start
    runner.rollback(torch.zeros(input_ids.shape[0], dtype=torch.long), input_ids.shape[1])
    return seconds


@torch.inference_mode()
def head_table(plain_model, packed_model, args) -> str:
    """The target's output head alone (its biggest linear), plain F.linear against the packed one."""
    plain_head, packed_head = plain_model.get_output_embeddings(), packed_model.get_output_embeddings()
    rows = []
    for num_rows in (1, 3, 16, 32):
        x = torch.randn(num_rows, plain_head.in_features, generator=torch.Generator().manual_seed(0))
        x = x.to(plain_head.weight.dtype)
        same = torch.equal(plain_head(x), packed_head(x))
        calls = {"plain": lambda x=x: plain_head(x), "packed": lambda x=x: packed_head(x)}
        rounds: dict[str, list[float]] = {"plain": [], "packed": []}
        for _ in range(args.repeats):
            for name, seconds in time_calls(calls, args.iters, statistics.median).items():
                rounds[name].append(seconds)
        ms = {name: 1000 * statistics.median(values) for name, values in rounds.items()}
        rows.append([
            f"{plain_head.out_features} x {plain_head.in_features}", num_rows, f"{ms['plain']:.2f}",
            f"{ms['packed']:.2f}", f"{ms['plain'] / ms['packed']:.2f}", "yes" if same else "NO",
        ])
    return markdown_table(["target head", "rows", "plain ms", "packed ms", "plain / packed", "same result"], rows)


def time_side_by_side(runners: dict[str, ModelRunner], context: list[list[int]], input_ids: torch.Tensor, args) -> tuple[dict[str, float], bool]:
    """Milliseconds of one forward of input_ids [B, n] per runner, after `context` (the runners take
    turns, args.iters forwards each, args.repeats rounds; median per round, then over rounds), and
    whether they all give bitwise the same logits."""
    for runner in runners.values():
        runner.prefill(context)
    logits = [runner.forward_tokens(input_ids) for runner in runners.values()]
    same = all(torch.equal(logits[0], other) for other in logits[1:])
    for runner in runners.values():
        runner.rollback(torch.zeros(input_ids.shape[0], dtype=torch.long), input_ids.shape[1])
    rounds: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(args.repeats):
        seconds: dict[str, list[float]] = {name: [] for name in runners}
        for _ in range(args.iters):
            for name, runner in runners.items():
                seconds[name].append(forward_seconds(runner, input_ids))
        for name in runners:
            rounds[name].append(statistics.median(seconds[name]))
    return {name: 1000 * statistics.median(values) for name, values in rounds.items()}, same


def jobs_side_by_side(args, load: Callable[[Path], tuple[dict, dict]]) -> str:
    """Whole local jobs of two kinds taking turns: autoregressive, fixed g = args.num_draft_tokens and
    goodput, per T and B, args.repeats rounds. load(records path) -> (JobConfig per kind, loaded
    generator per kind). The table: tokens/s per kind (mean over rounds), the second kind's over the
    first's, and each policy x the autoregressive job of its kind."""
    import tempfile
    from dataclasses import replace

    from scripts.bench_throughput import Policy, write_records
    from scripts.common import measure

    policies = [
        Policy("autoregressive", method="autoregressive", g=1, max_draft_len=1),
        Policy(f"g={args.num_draft_tokens}", g=args.num_draft_tokens, max_draft_len=args.num_draft_tokens),
        Policy("goodput", draft_len_schedule="goodput", g=1, max_draft_len=3),
    ]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_records(work / "records.jsonl", args.num_records)
        write_records(work / "records_b1.jsonl", min(args.records_at_b1, args.num_records))
        jobs, generators = load(work / "records.jsonl")
        first, second = list(generators)
        for temperature in args.temperatures:
            for batch_size in args.batch_sizes:
                records = work / ("records_b1.jsonl" if batch_size == 1 else "records.jsonl")
                speeds: dict[tuple[str, str], list[float]] = {}
                for round_index in range(args.repeats):
                    for policy in policies:
                        for kind, generator in generators.items():
                            job = jobs[kind]
                            job = replace(
                                job,
                                data=replace(job.data, input_path=str(records), batch_size=batch_size),
                                sampling=replace(job.sampling, temperature=temperature, seed=round_index),
                                verifier=policy.verifier(),
                            )
                            out = work / f"{kind}-{policy.name}-{temperature}-{batch_size}-{round_index}"
                            summary = measure(generator, job, out)
                            speeds.setdefault((kind, policy.name), []).append(summary["tokens_per_s"])
                mean = {key: statistics.mean(values) for key, values in speeds.items()}
                for policy in policies:
                    a, b = mean[(first, policy.name)], mean[(second, policy.name)]
                    rows.append([
                        f"{temperature:g}", batch_size, policy.name, f"{a:.1f}", f"{b:.1f}", f"{b / a:.2f}",
                        f"{a / mean[(first, 'autoregressive')]:.2f}", f"{b / mean[(second, 'autoregressive')]:.2f}",
                    ])
                print(f"T = {temperature:g}, B = {batch_size} done", flush=True)
    return markdown_table(
        ["T", "B", "policy", f"{first} tok/s", f"{second} tok/s", f"{second} / {first}", f"{first} x AR", f"{second} x AR"],
        rows,
    )


def run_jobs(args) -> None:
    """--jobs: plain vs packed whole jobs taking turns (see the module docstring)."""
    from distributed_spec.jobs.runner import build_generator
    from scripts.common import base_job

    def load(records: Path) -> tuple[dict, dict]:
        options = argparse.Namespace(tiny=False, dtype="bfloat16", overrides=[f"parallel.num_threads={args.threads}"])
        jobs = {kind: base_job(options, runtime, records) for kind, runtime in (("plain", "local"), ("packed", "local-packed"))}
        # The job's default verifier drafts, so each generator loads the draft.
        return jobs, {kind: build_generator(job) for kind, job in jobs.items()}

    print(jobs_side_by_side(args, load))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a plain-vs-other comparison: forwards by default, --jobs for whole jobs."""
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--context", type=int, default=100, help="prompt tokens per row before the timed forwards")
    parser.add_argument("--iters", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jobs", action="store_true", help="whole jobs instead of forwards")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0], help="--jobs")
    parser.add_argument("--num-draft-tokens", type=int, default=2, help="--jobs: the fixed g")
    parser.add_argument("--num-records", type=int, default=64, help="--jobs")
    parser.add_argument("--records-at-b1", type=int, default=16, help="--jobs: records at B = 1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.jobs:
        run_jobs(args)
        return

    plain = load_default_pair(draft="distilled", dtype="bfloat16")
    packed = load_default_pair(draft="distilled", dtype="bfloat16")
    num_packed = [pack_cpu_linears(loaded.model) for loaded in packed]
    print(f"{args.threads} thread(s), bf16; linears packed: target {num_packed[0]}, draft {num_packed[1]}")

    print(head_table(plain[0].model, packed[0].model, args))
    rows = []
    with torch.inference_mode():
        for batch_size in args.batch_sizes:
            context = [[5 + (i * 7 + row) % 1000 for i in range(args.context)] for row in range(batch_size)]
            for role, index, num_tokens in (("target", 0, 1), ("target", 0, 3), ("draft", 1, 1)):
                runners = {name: ModelRunner(pair[index].model) for name, pair in (("plain", plain), ("packed", packed))}
                input_ids = torch.randint(5, 1000, (batch_size, num_tokens), generator=torch.Generator().manual_seed(0))
                ms, same = time_side_by_side(runners, context, input_ids, args)
                rows.append([
                    role, batch_size, num_tokens, f"{ms['plain']:.2f}", f"{ms['packed']:.2f}",
                    f"{ms['plain'] / ms['packed']:.2f}", "yes" if same else "NO",
                ])
    print(markdown_table(
        ["model", "B", "tokens per row", "plain ms", "packed ms", "plain / packed", "same logits"], rows
    ))


if __name__ == "__main__":
    main()
