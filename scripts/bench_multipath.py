"""Multi-path block verification in the engine (issue 30, item 4): K paths x g vs autoregressive.

    python -m scripts.bench_multipath --out docs/bench/multipath            # the full grid
    python -m scripts.bench_multipath --tiny --records-per-task 1 --max-new-tokens 8 --seeds 0 \\
        --batch-sizes 1 --temperatures 1 --num-paths 1 2 --num-draft-tokens 2 --out /tmp/bench_mp   # smoke test

Records: the first --records-per-task prompts of each task type (chat, code, summarisation) of
distributed_spec/assets/bench_prompts.jsonl, --max-new-tokens each (EOS may end them earlier). Every
measurement is a real job (`distributed_spec.jobs.runner.run`) on the default pair loaded once, one job
per task type, so each task gets its own wall clock. Policies: autoregressive (the target alone),
and block verification with constant g for each (K, g) in --num-paths x --num-draft-tokens (K = 1: one path),
plus the n-gram proposers of --proposers (`ngram`, `model+ngram`) at K = 1 for each g.
They take turns within each (T, B, seed), the first rotating with the seed, so the machine's drift
hits them alike. At T = 0 the draft's K paths are identical (its argmax), so K > 1 only adds cost:
those runs are skipped unless --all-paths-at-t0.

Reported per (T, B, policy) for each task type and over all prompts: block efficiency (tokens per
(row, target call), all seeds pooled), target calls (per seed, summed over tasks), tokens/s (tokens
over wall-clock, pooled) and speedup (tokens/s over autoregressive's, same seed, mean over seeds),
plus block efficiency over K = 1's at the same g. Writes results.json, results.md and multipath.png.
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path

from distributed_spec.config import JobConfig, VerifierConfig
from scripts.common import (
    base_job,
    markdown_table,
    mean,
    measure,
    plot_lines,
    pyplot,
    read_bench_prompts,
    run_grid_and_report,
    save_figure,
    save_results,
)

logger = logging.getLogger("bench_multipath")

TASKS = ("chat", "code", "summarisation")
ALL_TASKS = "all"


@dataclass(frozen=True)
class Policy:
    """autoregressive (num_paths 0) or block verification with K paths of g drafts, constant g,
    proposed by the draft model or (K = 1) by an n-gram proposer (verifier.proposer)."""

    num_paths: int
    g: int
    proposer: str = "model"

    @property
    def name(self) -> str:
        if self.num_paths == 0:
            return "autoregressive"
        if self.proposer != "model":
            return f"{self.proposer} g={self.g}"
        return f"K={self.num_paths} g={self.g}"

    def verifier(self) -> VerifierConfig:
        if self.num_paths == 0:
            return VerifierConfig(method="autoregressive", num_draft_tokens=1, draft_len_schedule="constant", max_draft_len=1)
        return VerifierConfig(
            method="block",
            num_draft_tokens=self.g,
            draft_len_schedule="constant",
            max_draft_len=self.g,
            num_paths=self.num_paths,
            proposer=self.proposer,
        )


@dataclass
class Measurement:
    policy: str
    num_paths: int
    g: int
    proposer: str
    temperature: float
    batch_size: int
    seed: int
    task: str
    num_tokens: int
    num_target_calls: int
    num_row_iterations: int
    wall_s: float


def write_task_records(path: Path, task: str, num_records: int) -> int:
    """The first num_records prompts of one task type as a job input file; returns how many."""
    prompts = read_bench_prompts()
    chosen = [prompt for prompt in prompts if prompt["task"] == task][:num_records]
    with open(path, "w", encoding="utf-8") as file:
        for prompt in chosen:
            record = {"id": prompt["id"], "messages": prompt["messages"]}
            file.write(json.dumps(record) + "\n")
    return len(chosen)


def policies(args: argparse.Namespace, temperature: float) -> list[Policy]:
    paths = [k for k in args.num_paths if k == 1 or temperature > 0 or args.all_paths_at_t0]
    grid = [Policy(0, 0)] + [Policy(k, g) for g in args.num_draft_tokens for k in paths]
    return grid + [Policy(1, g, proposer) for proposer in args.proposers for g in args.num_draft_tokens]


def run_grid(args: argparse.Namespace, work: Path) -> list[Measurement]:
    from distributed_spec.jobs.runner import build_generator

    for task in TASKS:
        write_task_records(work / f"{task}.jsonl", task, args.records_per_task)
    job = base_job(args, "local", work / f"{TASKS[0]}.jsonl")
    job = replace(job, sampling=replace(job.sampling, max_new_tokens=args.max_new_tokens))
    generator = build_generator(replace(job, verifier=Policy(1, max(args.num_draft_tokens)).verifier()))
    measurements: list[Measurement] = []
    try:
        # Warm-up, not recorded: the first jobs of a process pay for lazy initialisation.
        for policy in (Policy(0, 0), Policy(max(args.num_paths), max(args.num_draft_tokens))):
            measure_one(generator, job, policy, 1.0, max(args.batch_sizes), 0, TASKS[0], work)
        for temperature in args.temperatures:
            for batch_size in args.batch_sizes:
                for seed_index, seed in enumerate(args.seeds):
                    grid = policies(args, temperature)
                    turn = seed_index % len(grid)
                    for policy in grid[turn:] + grid[:turn]:
                        for task in TASKS:
                            measurements.append(
                                measure_one(generator, job, policy, temperature, batch_size, seed, task, work)
                            )
                    write_results(measurements, args)
    finally:
        generator.close()
    return measurements


def measure_one(
    generator,
    job: JobConfig,
    policy: Policy,
    temperature: float,
    batch_size: int,
    seed: int,
    task: str,
    work: Path,
) -> Measurement:
    """One job: `task`'s records (work/<task>.jsonl) under `policy`, T, B and seed."""
    case = replace(
        job,
        verifier=policy.verifier(),
        sampling=replace(job.sampling, temperature=temperature, seed=seed),
        data=replace(job.data, input_path=str(work / f"{task}.jsonl"), batch_size=batch_size),
    )
    summary = measure(generator, case, work / "out")
    stats = generator.stats
    measurement = Measurement(
        policy=policy.name,
        num_paths=policy.num_paths,
        g=policy.g,
        proposer=policy.proposer,
        temperature=temperature,
        batch_size=batch_size,
        seed=seed,
        task=task,
        num_tokens=summary["new_tokens"],
        num_target_calls=summary["target_calls"],
        num_row_iterations=stats.num_row_iterations,
        wall_s=summary["wall_time_s"],
    )
    logger.warning(
        "T=%g B=%d seed=%d %-14s %-13s %6.1f tokens/s  BE %.2f  target calls %d",
        temperature, batch_size, seed, policy.name, task,
        measurement.num_tokens / max(measurement.wall_s, 1e-9), summary["block_efficiency"], measurement.num_target_calls,
    )  # fmt: skip
    return measurement


def _pooled(runs: list[Measurement]) -> tuple[int, int, float]:
    return (
        sum(m.num_tokens for m in runs),
        sum(m.num_row_iterations for m in runs),
        sum(m.wall_s for m in runs),
    )


def table(measurements: list[Measurement]) -> list[dict]:
    """One row per (T, B, policy, task type or "all"); see the module docstring for the columns."""
    rows = []
    for temperature, batch_size in sorted({(m.temperature, m.batch_size) for m in measurements}):
        cell = [m for m in measurements if (m.temperature, m.batch_size) == (temperature, batch_size)]
        for task in (*TASKS, ALL_TASKS):
            scope = [m for m in cell if task == ALL_TASKS or m.task == task]
            baseline = {}
            for seed in {m.seed for m in scope}:
                tokens, _, wall = _pooled(
                    [m for m in scope if m.policy == "autoregressive" and m.seed == seed]
                )
                baseline[seed] = tokens / wall if wall else 0.0
            for policy in dict.fromkeys(m.policy for m in scope):
                runs = [m for m in scope if m.policy == policy]
                seeds = sorted({m.seed for m in runs})
                per_seed = {seed: _pooled([m for m in runs if m.seed == seed]) for seed in seeds}
                tokens, iterations, wall = _pooled(runs)
                rows.append(
                    {
                        "temperature": temperature,
                        "batch_size": batch_size,
                        "task": task,
                        "policy": policy,
                        "num_paths": runs[0].num_paths,
                        "g": runs[0].g,
                        "proposer": runs[0].proposer,
                        "block_efficiency": tokens / iterations if iterations else float("nan"),
                        "target_calls": mean(
                            [sum(m.num_target_calls for m in runs if m.seed == s) for s in seeds]
                        ),
                        "tokens_per_s": tokens / wall if wall else float("nan"),
                        "speedup": mean(
                            [
                                t / w / baseline[s]
                                for s, (t, _, w) in per_seed.items()
                                if w and baseline.get(s)
                            ]
                        ),
                        "seeds": len(seeds),
                    }
                )
    for row in rows:
        single = next(
            (
                other
                for other in rows
                if other["num_paths"] == 1
                and other["proposer"] == "model"
                and all(other[key] == row[key] for key in ("temperature", "batch_size", "task", "g"))
            ),
            None,
        )
        row["be_over_k1"] = row["block_efficiency"] / single["block_efficiency"] if single else float("nan")
    return rows


def markdown(rows: list[dict], args: argparse.Namespace) -> str:
    best_rows = []
    for temperature, batch_size in sorted({(r["temperature"], r["batch_size"]) for r in rows}):
        for task in (*TASKS, ALL_TASKS):
            cell = [r for r in rows if (r["temperature"], r["batch_size"], r["task"]) == (temperature, batch_size, task)]
            if not cell:
                continue
            best = max(cell, key=lambda r: r["speedup"] if r["speedup"] == r["speedup"] else -1.0)
            multi = [r for r in cell if r["num_paths"] > 1]
            gain = max(multi, key=lambda r: r["be_over_k1"]) if multi else None
            gain_text = f"{gain['be_over_k1']:.3f} ({gain['policy']})" if gain else "-"
            best_rows.append([f"{temperature:g}", batch_size, task, best["policy"], f"{best['speedup']:.2f}",
                              f"{best['block_efficiency']:.2f}", gain_text])
    all_rows = [
        [f"{row['temperature']:g}", row["batch_size"], row["task"], row["policy"], f"{row['block_efficiency']:.3f}",
         f"{row['be_over_k1']:.3f}", f"{row['target_calls']:.1f}", f"{row['tokens_per_s']:.2f}", f"{row['speedup']:.3f}"]
        for row in rows
    ]
    lines = [
        f"Command: `python -m scripts.bench_multipath {' '.join(args.argv)}`".rstrip(),
        "",
        "Best policy per (T, B, task type): speedup over autoregressive, and the best block-efficiency",
        "gain of K > 1 over K = 1 at the same g.",
        "",
        markdown_table(["T", "B", "tasks", "best policy", "x AR", "its BE", "best BE / K=1 (at)"], best_rows),
        "",
        "All rows (block efficiency pooled over seeds; target calls per seed; speedup: mean over seeds):",
        "",
        markdown_table(["T", "B", "tasks", "policy", "block eff.", "BE / K=1", "target calls", "tokens/s", "x AR"],
                       all_rows),
    ]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], out: Path) -> Path:
    """Block efficiency and speedup against K, one line per g (all prompts), one column per (T, B)."""
    panels = sorted({(r["temperature"], r["batch_size"]) for r in rows})
    fig, axes = pyplot().subplots(2, len(panels), figsize=(4.5 * len(panels), 7), squeeze=False)
    for column, (temperature, batch_size) in enumerate(panels):
        cell = [
            r
            for r in rows
            if (r["temperature"], r["batch_size"], r["task"]) == (temperature, batch_size, ALL_TASKS)
            and r["num_paths"] > 0
            and r["proposer"] == "model"
        ]
        for metric, ax in zip(("block_efficiency", "speedup"), axes[:, column]):
            if metric == "speedup":
                ax.axhline(1.0, color="black", linewidth=1, linestyle="--", label="autoregressive")
            series = {f"g={g}": [(r["num_paths"], r[metric]) for r in cell if r["g"] == g]
                      for g in sorted({r["g"] for r in cell})}
            ylabel = "block efficiency" if metric == "block_efficiency" else "speedup over autoregressive"
            plot_lines(ax, series, f"T={temperature:g}, B={batch_size}", "draft paths K", ylabel, log2_x=True)
    return save_figure(fig, out / "multipath.png")


def write_results(measurements: list[Measurement], args: argparse.Namespace) -> None:
    rows = table(measurements)
    save_results(Path(args.out), measurements, rows, markdown(rows, args), plot)


def main(argv: list[str] | None = None) -> None:
    import sys

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records-per-task", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.6, 1.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--num-paths", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--num-draft-tokens", "--gammas", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument(
        "--all-paths-at-t0", action="store_true", help="also run K > 1 at T = 0 (identical paths)"
    )
    parser.add_argument(
        "--proposers", nargs="*", default=["ngram", "model+ngram"], choices=["ngram", "model+ngram"],
        help="n-gram proposers run at K = 1 for each g, beside the draft model's policies",
    )
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tiny", action="store_true", help="tiny random models instead of the default pair")
    parser.add_argument("--out", default="docs/bench/multipath")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    run_grid_and_report(args, run_grid, write_results)


if __name__ == "__main__":
    main()
