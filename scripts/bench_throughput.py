"""Throughput of the whole job path (records in, completions out): draft-length policies x batch size.

    python -m scripts.bench_throughput                                # the grid in docs/RESULTS.md
    python -m scripts.bench_throughput --batch-sizes 4 --temperatures 0 --seeds 0 --runtimes local \\
        --num-records 16 --out /tmp/bench                             # a quick look
    python -m scripts.bench_throughput --tiny --out /tmp/bench        # tiny random models (smoke test)

Records: --num-records chat/code/summarisation prompts (distributed_spec/assets/bench_prompts.jsonl,
cycled), each asking for its own max_new_tokens from a length-skewed mix (three in four short, one in
four long; natural EOS shortens more), written as a job input file. Every measurement is a real job
(`distributed_spec.jobs.runner.run`: input file, tokenizer, scheduler, completions.jsonl) on a pair loaded
once per runtime; tokens/s is the job's own figure (generated tokens over its wall-clock).

Policies, all in one run, taking turns within each (runtime, temperature, batch size, seed) so the
machine's drift hits them alike; the order of the turns rotates by one policy from each seed to the
next (goodput, listed last, ran last in every seed before: a slow spell late in a seed's turns then
fell on it alone, see `turn_order`): autoregressive (the target alone), constant g for each --num-draft-tokens,
the same with the draft's confidence stop (--confidence), and the goodput schedule (max g =
max(--num-draft-tokens)); with --proposers ngram and/or model+ngram, constant g and goodput again with blocks
from n-grams (verifier.proposer; `model` among them keeps the draft-model policies); continuous batching, plus static batches for --static-policies at the batch sizes of
--static-batch-sizes; --policies NAME... runs only the named ones (e.g. autoregressive goodput
"goodput model+ngram"). Runtimes: local (the single-process engine), Ray at TP = 1 and 2 as the job
runs it by default (ray1: the draft inside shard 0; ray2: a draft actor; over --ray-batch-sizes), and
on request with the draft placed explicitly (parallel.draft_in_shard): ray1-in-shard / ray2-in-shard,
ray1-draft-actor / ray2-draft-actor. Ratios are tokens/s over autoregressive, mean over seeds.
The goodput table shows, per cell, autoregressive's fastest seed over its slowest: at T = 0 the
seeds do identical work, so that spread is the host's own run-to-run noise, the yardstick for
goodput / best. Beside goodput / best it prints a 90% interval on it, paired by seed (Student's t
over the seeds' log ratios: each seed's jobs took turns, so their ratio cancels that seed's spell of
the host), and the goal's verdict: met (goodput / best >= 0.97), within noise (below, but the interval
reaches 0.97) or missed (the whole interval lies below). At B = 1 only the first --records-at-b1 records run (a B = 1 pass over all of them takes minutes per
policy on 2 cores). Writes results.json, results.md and tokens_per_s_vs_batch.png into --out.

    python -m scripts.bench_throughput --merge DIR [DIR ...] --out DIR    # one report from several runs

--merge runs nothing: it reads the measurements of earlier runs (their results.json) and writes one
report of them all; where two runs measured the same (runtime, T, B) cell, the later DIR's stands
(a rerun of some cells layered over a whole grid).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

from distributed_spec.config import SchedulingConfig, VerifierConfig
from scripts.common import (
    RUNTIMES,
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

logger = logging.getLogger("bench_throughput")

SHORT_LENGTHS = (4, 6, 8, 12)
LONG_LENGTHS = (32, 48)
GOODPUT_GOAL = 0.97
# Two-sided confidence of the interval on goodput / best (t over the seeds' paired log ratios).
INTERVAL = 0.90
MET, WITHIN_NOISE, MISSED, BELOW = "met", "within noise", "missed", "below (one seed)"


@dataclass(frozen=True)
class Policy:
    """A draft-length policy of the job: verifier.* settings."""

    name: str
    method: str = "block"
    draft_len_schedule: str = "constant"
    g: int = 4
    max_draft_len: int = 4
    confidence: float = 0.0
    # verifier.proposer: model, ngram or model+ngram.
    proposer: str = "model"

    def verifier(self) -> VerifierConfig:
        return VerifierConfig(
            method=self.method,
            num_draft_tokens=self.g,
            draft_len_schedule=self.draft_len_schedule,
            max_draft_len=max(self.max_draft_len, self.g),
            draft_confidence_threshold=self.confidence,
            proposer=self.proposer,
        )


@dataclass
class Measurement:
    runtime: str
    policy: str
    batching: str
    temperature: float
    batch_size: int
    seed: int
    tokens_per_s: float
    block_efficiency: float
    num_tokens: int
    steps_per_draft_len: list[int] = field(default_factory=list)
    # The summary's proposer/* counters (rows and drafts per proposer).
    proposer_counts: dict[str, float] = field(default_factory=dict)


def write_records(path: Path, num_records: int) -> None:
    """The length-skewed input: prompts cycled, three short budgets for each long one."""
    prompts = read_bench_prompts()
    with open(path, "w", encoding="utf-8") as file:
        for index in range(num_records):
            source = prompts[index % len(prompts)]
            if index % 4 == 3:
                max_new_tokens = LONG_LENGTHS[(index // 4) % len(LONG_LENGTHS)]
            else:
                max_new_tokens = SHORT_LENGTHS[index % len(SHORT_LENGTHS)]
            record = {"id": f"{source['id']}-{index}", "messages": source["messages"], "max_new_tokens": max_new_tokens}
            file.write(json.dumps(record) + "\n")


def policies(args: argparse.Namespace) -> list[Policy]:
    top = max(args.num_draft_tokens)
    result = [Policy("autoregressive", method="autoregressive", g=1, max_draft_len=1)]
    result += [Policy(f"g={g}", g=g, max_draft_len=g) for g in args.num_draft_tokens]
    if args.confidence:
        result += [
            Policy(f"g={g} conf{args.confidence}", g=g, max_draft_len=g, confidence=args.confidence)
            for g in args.num_draft_tokens
        ]
    result.append(Policy("goodput", draft_len_schedule="goodput", g=1, max_draft_len=top))
    if "model" not in args.proposers:
        result = result[:1]
    for proposer in (name for name in args.proposers if name != "model"):
        # Blocks from n-grams (or n-grams where they match, else the model): fixed g and goodput.
        result += [Policy(f"g={g} {proposer}", g=g, max_draft_len=g, proposer=proposer) for g in args.num_draft_tokens]
        result.append(Policy(f"goodput {proposer}", draft_len_schedule="goodput", g=1, max_draft_len=top, proposer=proposer))
    return result


def select_policies(all_policies: list[Policy], names: list[str] | None) -> list[Policy]:
    """The policies named by --policies, in their own order (None: all); an unknown name is an error."""
    if not names:
        return all_policies
    unknown = sorted(set(names) - {policy.name for policy in all_policies})
    if unknown:
        raise SystemExit(f"--policies: no such policy {unknown}; there are {[policy.name for policy in all_policies]}")
    return [policy for policy in all_policies if policy.name in names]


def turn_order(cases: list, seed_index: int) -> list:
    """The cases of one seed in the order they run: rotated left by seed_index, so that across seeds each
    policy takes different places in the turns instead of one policy always running first or last."""
    if not cases:
        return cases
    shift = seed_index % len(cases)
    return cases[shift:] + cases[:shift]


def run_grid(args: argparse.Namespace, work: Path) -> list[Measurement]:
    from distributed_spec.jobs.runner import build_generator

    input_path = work / "records.jsonl"
    write_records(input_path, args.num_records)
    b1_path = work / "records_b1.jsonl"
    write_records(b1_path, min(args.records_at_b1, args.num_records))
    all_policies = select_policies(policies(args), args.policies)
    measurements: list[Measurement] = []
    for runtime in args.runtimes:
        job = base_job(args, runtime, input_path)
        # Loaded once: with the draft model whenever some policy uses it.
        loading = next((policy for policy in all_policies if policy.verifier().uses_draft_model), all_policies[-1])
        generator = build_generator(replace(job, verifier=loading.verifier()))
        local = runtime.startswith("local")
        batch_sizes = args.batch_sizes if local else args.ray_batch_sizes
        runtime_policies = all_policies if local else [p for p in all_policies if not p.confidence]
        try:
            for temperature in args.temperatures:
                for batch_size in batch_sizes:
                    for seed_index, seed in enumerate(args.seeds):
                        cases = [(policy, "continuous") for policy in runtime_policies]
                        if local and batch_size in args.static_batch_sizes:
                            cases += [
                                (policy, "static") for policy in runtime_policies if policy.name in args.static_policies
                            ]
                        for policy, batching in turn_order(cases, seed_index):
                            path = b1_path if batch_size == 1 else input_path
                            case_job = replace(
                                job,
                                verifier=policy.verifier(),
                                engine=SchedulingConfig(continuous_batching=batching == "continuous"),
                                sampling=replace(job.sampling, temperature=temperature, seed=seed),
                                data=replace(job.data, input_path=str(path), batch_size=batch_size),
                            )
                            summary = measure(generator, case_job, work / "out")
                            measurements.append(
                                Measurement(
                                    runtime=runtime,
                                    policy=policy.name,
                                    batching=batching,
                                    temperature=temperature,
                                    batch_size=batch_size,
                                    seed=seed,
                                    tokens_per_s=summary["tokens_per_s"],
                                    block_efficiency=summary["block_efficiency"],
                                    num_tokens=summary["new_tokens"],
                                    steps_per_draft_len=summary.get("steps_per_draft_len", []),
                                    proposer_counts={
                                        key: value for key, value in summary.items() if key.startswith("proposer/")
                                    },
                                )
                            )
                            logger.warning(
                                "%s T=%s B=%d seed=%d %-18s %-10s %7.1f tokens/s  BE %.2f  g-steps %s",
                                runtime, temperature, batch_size, seed, policy.name, batching,
                                summary["tokens_per_s"], summary["block_efficiency"],
                                summary.get("steps_per_draft_len"),
                            )
                        write_results(measurements, args)
        finally:
            generator.close()
    return measurements


def table(measurements: list[Measurement]) -> list[dict]:
    """One row per (runtime, T, B, policy, batching): mean tokens/s and the ratio to autoregressive
    (continuous) of the same seeds."""
    rows = []
    keys = sorted({(m.runtime, m.temperature, m.batch_size) for m in measurements})
    for runtime, temperature, batch_size in keys:
        cell = [m for m in measurements if (m.runtime, m.temperature, m.batch_size) == (runtime, temperature, batch_size)]
        baseline = {m.seed: m.tokens_per_s for m in cell if m.policy == "autoregressive" and m.batching == "continuous"}
        for policy, batching in dict.fromkeys((m.policy, m.batching) for m in cell):
            runs = [m for m in cell if m.policy == policy and m.batching == batching]
            # Per seed (one job each), for the mean and for intervals paired by seed.
            seed_ratios = {m.seed: m.tokens_per_s / baseline[m.seed] for m in runs if baseline.get(m.seed)}
            ratios = list(seed_ratios.values())
            steps = [sum(column) for column in zip(*(m.steps_per_draft_len for m in runs))] if runs else []
            # Share of the decoding rows whose block came from n-grams.
            proposer_rows = [
                (counts.get("proposer/rows_ngram", 0.0), sum(v for k, v in counts.items() if k.startswith("proposer/rows_")))
                for counts in (m.proposer_counts for m in runs)
            ]
            total_rows = sum(total for _, total in proposer_rows)
            rows.append(
                {
                    "runtime": runtime,
                    "temperature": temperature,
                    "batch_size": batch_size,
                    "policy": policy,
                    "batching": batching,
                    "tokens_per_s": mean([m.tokens_per_s for m in runs]),
                    "ratio": mean(ratios),
                    "seed_ratios": seed_ratios,
                    "ratio_min": min(ratios) if ratios else float("nan"),
                    # Fastest seed over the slowest (at T = 0 autoregressive's seeds do identical work).
                    "spread": max(m.tokens_per_s for m in runs) / min(m.tokens_per_s for m in runs) if runs else float("nan"),
                    "block_efficiency": mean([m.block_efficiency for m in runs]),
                    "seeds": len(runs),
                    "steps_per_draft_len": steps,
                    "ngram_row_share": sum(ngram for ngram, _ in proposer_rows) / total_rows if total_rows else 0.0,
                }
            )
    return rows


def paired_interval(goodput: dict[int, float], best: dict[int, float]) -> tuple[float | None, float | None]:
    """INTERVAL confidence interval on goodput / best from the seeds both ran: each seed's jobs took
    turns on the host, so their ratio cancels what the host did to that seed's turns. Student's t over
    the per-seed log ratios; (None, None) with fewer than two seeds."""
    from scipy import stats  # noqa: PLC0415 - a dev dependency; the benchmark's runs do not need it

    logs = [math.log(goodput[seed] / best[seed]) for seed in sorted(goodput.keys() & best.keys())]
    if len(logs) < 2:
        return None, None
    center = statistics.fmean(logs)
    half = stats.t.ppf(0.5 + INTERVAL / 2, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(center - half), math.exp(center + half)


def goal_verdict(goodput_over_best: float, high: float | None) -> str:
    """met (the cell's ratio >= GOODPUT_GOAL); else within noise (the interval's top reaches it), missed
    (it does not), or below (one seed: no interval)."""
    if goodput_over_best >= GOODPUT_GOAL:
        return MET
    if high is None:
        return BELOW
    return WITHIN_NOISE if high >= GOODPUT_GOAL else MISSED


def proposer_of(policy: str) -> str:
    """The proposer of a policy's name ("g=2 model+ngram" -> model+ngram; "g=2", "goodput" -> model)."""
    return next((word for word in policy.split()[1:] if word in ("ngram", "model+ngram")), "model")


def markdown(rows: list[dict], args: argparse.Namespace) -> str:
    lines = [f"Command: `python -m scripts.bench_throughput {' '.join(args.argv)}`".rstrip(), ""]
    lines.append(markdown_table(
        ["runtime", "T", "B", "policy", "batching", "tokens/s", "x autoregressive (min over seeds)", "block eff.",
         "steps per g (g=0..)", "n-gram rows"],
        [[row["runtime"], f"{row['temperature']:g}", row["batch_size"], row["policy"], row["batching"],
          f"{row['tokens_per_s']:.1f}", f"{row['ratio']:.2f} ({row['ratio_min']:.2f})", f"{row['block_efficiency']:.2f}",
          " ".join(map(str, row["steps_per_draft_len"])), f"{row['ngram_row_share']:.0%}"] for row in rows],
    ))
    goodput_rows, goodput_over_best, verdicts = [], [], []
    for runtime, temperature, batch_size in sorted({(r["runtime"], r["temperature"], r["batch_size"]) for r in rows}):
        cell = [r for r in rows if (r["runtime"], r["temperature"], r["batch_size"]) == (runtime, temperature, batch_size)]
        cell = [r for r in cell if r["batching"] == "continuous"]
        for goodput in (r for r in cell if r["policy"].startswith("goodput")):
            # Against the fixed-g policies of the same proposer: goodput chooses lengths, not proposers.
            proposer = proposer_of(goodput["policy"])
            others = [
                r for r in cell
                if r["policy"] == "autoregressive"
                or (not r["policy"].startswith("goodput") and proposer_of(r["policy"]) == proposer)
            ]
            if not others:
                continue  # run alone (--policies): nothing to compare it with
            best = max(others, key=lambda r: r["ratio"])
            goodput_over_best.append(goodput["ratio"] / best["ratio"])
            over_best = goodput_over_best[-1]
            autoregressive = next((r for r in cell if r["policy"] == "autoregressive"), None)
            spread = "-" if autoregressive is None else f"{autoregressive['spread']:.2f}"
            low, high = paired_interval(goodput.get("seed_ratios", {}), best.get("seed_ratios", {}))
            interval = "-" if low is None else f"{low:.3f}-{high:.3f}"
            verdicts.append(goal_verdict(over_best, high))
            goodput_rows.append([runtime, f"{temperature:g}", batch_size, proposer, best["policy"], f"{best['ratio']:.2f}",
                                 f"{goodput['ratio']:.2f}", f"{over_best:.3f}", interval,
                                 verdicts[-1], spread])
    lines += ["", "Goodput against the best of autoregressive and the fixed-g policies of its proposer (continuous batching):", ""]
    lines.append(markdown_table(
        ["runtime", "T", "B", "proposer", "best other", "its x AR", "goodput x AR", "goodput / best",
         f"{INTERVAL:.0%} interval, paired by seed", "goal", "AR fastest / slowest seed"], goodput_rows
    ))
    if goodput_rows:
        # Issue 26's goal: goodput >= 0.97 x the best other policy in every cell.
        num_met = sum(ratio >= GOODPUT_GOAL for ratio in goodput_over_best)
        lines += ["", f"goodput / best >= {GOODPUT_GOAL} in {num_met} of {len(goodput_rows)} cells."]
        lines.append(
            f"Of the others, {verdicts.count(WITHIN_NOISE)} lie within noise of it (the interval reaches "
            f"{GOODPUT_GOAL}) and {verdicts.count(MISSED)} miss it (the whole interval lies below)."
        )
    static_rows = [r for r in rows if r["batching"] == "static"]
    if static_rows:
        pairs = []
        for static in static_rows:
            continuous = next(
                r for r in rows
                if r["batching"] == "continuous"
                and all(r[k] == static[k] for k in ("runtime", "temperature", "batch_size", "policy"))
            )
            pairs.append([static["runtime"], f"{static['temperature']:g}", static["batch_size"], static["policy"],
                          f"{static['tokens_per_s']:.1f}", f"{continuous['tokens_per_s']:.1f}",
                          f"{continuous['tokens_per_s'] / static['tokens_per_s']:.2f}"])
        lines += ["", "Continuous over static batches (same policy, T and B):", ""]
        lines.append(markdown_table(
            ["runtime", "T", "B", "policy", "static tokens/s", "continuous tokens/s", "continuous / static"], pairs
        ))
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], out: Path) -> Path:
    """tokens/s against the batch size, one line per policy (continuous batching), a panel per (runtime, T)."""
    panels = sorted({(r["runtime"], r["temperature"]) for r in rows})
    fig, axes = pyplot().subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (runtime, temperature) in zip(axes[0], panels):
        cell = [r for r in rows if (r["runtime"], r["temperature"]) == (runtime, temperature) and r["batching"] == "continuous"]
        series = {policy: [(r["batch_size"], r["tokens_per_s"]) for r in cell if r["policy"] == policy]
                  for policy in dict.fromkeys(r["policy"] for r in cell)}
        plot_lines(ax, series, f"{runtime}, T={temperature:g}", "batch size (rows decoded at once)",
                   "tokens/s (whole job)", log2_x=True, styles={"goodput": {"linewidth": 2.5, "color": "black"}})
    return save_figure(fig, out / "tokens_per_s_vs_batch.png")


def merge_measurements(runs: list[list[Measurement]]) -> list[Measurement]:
    """The measurements of several runs, in order; a (runtime, T, B) cell measured by a later run
    replaces the earlier runs' measurements of it (whole cells, so no seed mixes two runs)."""
    merged: dict[tuple, list[Measurement]] = {}
    for run in runs:
        cells: dict[tuple, list[Measurement]] = {}
        for m in run:
            cells.setdefault((m.runtime, m.temperature, m.batch_size), []).append(m)
        merged.update(cells)
    return [m for cell in merged.values() for m in cell]


def read_measurements(directory: Path) -> list[Measurement]:
    data = json.loads((Path(directory) / "results.json").read_text())
    return [Measurement(**m) for m in data["measurements"]]


def write_results(measurements: list[Measurement], args: argparse.Namespace) -> None:
    rows = table(measurements)
    save_results(Path(args.out), measurements, rows, markdown(rows, args), plot)


def main(argv: list[str] | None = None) -> None:
    import sys

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-records", type=int, default=64)
    parser.add_argument("--records-at-b1", type=int, default=16)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16, 32])
    parser.add_argument("--ray-batch-sizes", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--num-draft-tokens", "--gammas", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--confidence", type=float, default=0.4, help="0: no confidence-stop policies")
    parser.add_argument(
        "--proposers", nargs="+", default=["model"], choices=["model", "ngram", "model+ngram"],
        help="verifier.proposer of the drafting policies: each besides model adds fixed-g and goodput policies",
    )
    parser.add_argument("--runtimes", nargs="+", default=["local", "ray1", "ray2"], choices=RUNTIMES)
    parser.add_argument(
        "--policies", nargs="+", metavar="NAME",
        help="run only these of the policies the other flags make (e.g. autoregressive goodput 'goodput model+ngram')",
    )
    parser.add_argument("--static-batch-sizes", type=int, nargs="*", default=[16])
    parser.add_argument("--static-policies", nargs="*", default=["autoregressive", "goodput"])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tiny", action="store_true", help="tiny random models instead of the default pair")
    parser.add_argument(
        "--overrides", nargs="*", default=[], metavar="KEY=VALUE",
        help="Hydra overrides for every job, after the runtime's (e.g. parallel.num_cpus_per_shard=2)",
    )
    parser.add_argument("--out", default="docs/bench/throughput")
    parser.add_argument("--merge", nargs="+", type=Path, metavar="DIR", help="report these runs' results.json, run nothing")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    if args.merge:
        write_results(merge_measurements([read_measurements(directory) for directory in args.merge]), args)
        print((Path(args.out) / "results.md").read_text())
        return
    run_grid_and_report(args, run_grid, write_results)


if __name__ == "__main__":
    main()
