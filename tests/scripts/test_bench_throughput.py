"""scripts/bench_throughput.py's report: which policies goodput is compared with (no timing asserted).

.venv/bin/python -m pytest tests/scripts/test_bench_throughput.py -q
"""

from __future__ import annotations

import math
import statistics
from types import SimpleNamespace

import pytest

from scripts import bench_throughput


def _row(policy: str, ratio: float) -> dict:
    return {
        "runtime": "local", "temperature": 0.0, "batch_size": 4, "policy": policy, "batching": "continuous",
        "tokens_per_s": 10.0 * ratio, "ratio": ratio, "ratio_min": ratio, "block_efficiency": 1.0, "seeds": 1,
        "steps_per_draft_len": [1], "ngram_row_share": 0.0, "spread": 1.0,
    }


def test_goodput_is_compared_with_the_fixed_g_policies_of_its_own_proposer():
    rows = [
        _row("autoregressive", 1.0),
        _row("g=1", 1.04),
        _row("g=2 conf0.4", 1.06),
        _row("goodput", 1.05),
        _row("g=2 model+ngram", 1.13),
        _row("goodput model+ngram", 1.10),
    ]
    text = bench_throughput.markdown(rows, SimpleNamespace(argv=[]))
    goodput_table = text.split("its proposer")[1]
    # goodput (model) against g=2 conf0.4, not against the n-gram policy; goodput model+ngram against it.
    assert "| local | 0 | 4 | model | g=2 conf0.4 | 1.06 | 1.05 | 0.991 |" in goodput_table
    assert "| local | 0 | 4 | model+ngram | g=2 model+ngram | 1.13 | 1.10 | 0.973 |" in goodput_table
    assert bench_throughput.proposer_of("g=3 ngram") == "ngram" and bench_throughput.proposer_of("goodput") == "model"


def test_a_goodput_run_alone_is_reported_without_a_comparison():
    # --policies goodput: no autoregressive or fixed-g run in the cell to compare it with.
    text = bench_throughput.markdown([_row("goodput", float("nan"))], SimpleNamespace(argv=[]))
    assert "| local | 0 | 4 | goodput | continuous |" in text
    assert "goodput / best >=" not in text


def _measurement(
    runtime: str, batch_size: int, seed: int, tokens_per_s: float, policy: str = "autoregressive"
) -> bench_throughput.Measurement:
    return bench_throughput.Measurement(
        runtime=runtime, policy=policy, batching="continuous", temperature=0.0, batch_size=batch_size,
        seed=seed, tokens_per_s=tokens_per_s, block_efficiency=1.0, num_tokens=10,
    )


def test_a_later_run_replaces_whole_cells_of_an_earlier_one():
    grid = [_measurement("local", 4, seed, 10.0) for seed in (0, 1, 2)] + [_measurement("ray1", 4, 0, 5.0)]
    rerun = [_measurement("local", 4, seed, 20.0) for seed in (0, 1)]
    merged = bench_throughput.merge_measurements([grid, rerun])
    local = [m for m in merged if m.runtime == "local"]
    # The rerun's two seeds stand alone: seed 2 of the old run does not survive beside them.
    assert sorted(m.seed for m in local) == [0, 1] and all(m.tokens_per_s == 20.0 for m in local)
    assert [m.tokens_per_s for m in merged if m.runtime == "ray1"] == [5.0]


def test_merge_reports_the_runs_read_back_from_their_folders(tmp_path):
    from scripts.common import save_results

    for name, speed in (("a", 10.0), ("b", 30.0)):
        runs = [_measurement("local", 1 if name == "a" else 4, 0, speed)]
        save_results(tmp_path / name, runs, bench_throughput.table(runs), "", lambda rows, out: None)
    bench_throughput.main(["--merge", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "all")])
    text = (tmp_path / "all" / "results.md").read_text()
    assert "| local | 0 | 1 | autoregressive | continuous | 10.0 |" in text
    assert "| local | 0 | 4 | autoregressive | continuous | 30.0 |" in text


def test_the_report_counts_the_cells_that_meet_the_goodput_goal():
    rows = [_row("autoregressive", 1.0), _row("g=1", 1.10), _row("goodput", 1.05)]
    text = bench_throughput.markdown(rows, SimpleNamespace(argv=[]))
    assert "goodput / best >= 0.97 in 0 of 1 cells." in text
    rows[-1] = _row("goodput", 1.0675)  # 0.9705 of g=1: met
    assert "in 1 of 1 cells." in bench_throughput.markdown(rows, SimpleNamespace(argv=[]))
    rows[-1] = _row("goodput", 1.0669)  # 0.96991: printed as 0.970, and not met
    text = bench_throughput.markdown(rows, SimpleNamespace(argv=[]))
    assert "| 0.970 |" in text and "in 0 of 1 cells." in text


def test_the_turns_rotate_from_seed_to_seed():
    cases = ["autoregressive", "g=1", "g=2", "goodput"]
    orders = [bench_throughput.turn_order(cases, index) for index in range(4)]
    assert orders[0] == cases and orders[1] == ["g=1", "g=2", "goodput", "autoregressive"]
    # Over as many seeds as policies, every policy runs once in every place of the turns.
    assert all(sorted(order[place] for order in orders) == sorted(cases) for place in range(len(cases)))
    assert bench_throughput.turn_order([], 3) == []


def test_the_goodput_table_shows_autoregressive_spread_over_seeds():
    runs = [_measurement("local", 4, 0, 40.0), _measurement("local", 4, 1, 50.0)]
    runs += [_measurement("local", 4, 0, 42.0, "goodput"), _measurement("local", 4, 1, 50.0, "goodput")]
    rows = bench_throughput.table(runs)
    autoregressive = next(row for row in rows if row["policy"] == "autoregressive")
    assert autoregressive["spread"] == 1.25
    text = bench_throughput.markdown(rows, SimpleNamespace(argv=[]))
    # goodput x AR is the mean of 1.05 and 1.00; the last column the seeds' 50 / 40.
    # Seeds' goodput / AR 1.05 and 1.00: t(0.95, 1 degree of freedom) = 6.3138 over their log ratios.
    assert "| local | 0 | 4 | model | autoregressive | 1.00 | 1.02 | 1.025 | 0.878-1.195 | met | 1.25 |" in text


def test_the_interval_is_students_t_over_the_seeds_paired_log_ratios():
    goodput = {0: 0.95, 1: 0.955, 2: 0.96, 3: 1.10}  # seed 3: best did not run it, so it is not paired
    best = {0: 1.0, 1: 1.0, 2: 1.0}
    low, high = bench_throughput.paired_interval(goodput, best)
    logs = [math.log(0.95), math.log(0.955), math.log(0.96)]
    center, spread = statistics.fmean(logs), statistics.stdev(logs)
    half = 2.919986 * spread / math.sqrt(3)  # t(0.95, 2 degrees of freedom)
    assert low == pytest.approx(math.exp(center - half), rel=1e-6)
    assert high == pytest.approx(math.exp(center + half), rel=1e-6)
    assert high < 0.97  # three seeds all below the goal, closely: a miss, not noise
    # Pairing cancels what a seed's turns shared: best twice as fast in seed 1 moves nothing when
    # goodput was too (a per-policy interval would be as wide as the host's spread).
    assert bench_throughput.paired_interval({0: 1.0, 1: 2.0}, {0: 1.0, 1: 2.0}) == (1.0, 1.0)
    assert bench_throughput.paired_interval({0: 1.0}, {0: 1.0}) == (None, None)


def test_the_goal_verdict_tells_a_miss_from_noise():
    assert bench_throughput.goal_verdict(0.975, None) == "met"
    assert bench_throughput.goal_verdict(0.95, 0.98) == "within noise"
    assert bench_throughput.goal_verdict(0.95, 0.96) == "missed"
    assert bench_throughput.goal_verdict(0.95, None) == "below (one seed)"
    rows = [_row("autoregressive", 1.0), _row("g=1", 1.10), _row("goodput", 1.05)]
    text = bench_throughput.markdown(rows, SimpleNamespace(argv=[]))
    assert "Of the others, 0 lie within noise of it (the interval reaches 0.97) and 0 miss it" in text


def test_every_runtime_composes_the_job_it_names(tmp_path):
    # RUNTIMES is built from the variants: each name gives the job its runtime, TP size and variant.
    from scripts.common import RUNTIMES, base_job

    options = SimpleNamespace(tiny=False, dtype="bfloat16", overrides=[])
    jobs = {runtime: base_job(options, runtime, tmp_path / "records.jsonl") for runtime in RUNTIMES}
    assert set(RUNTIMES) >= {"local", "local-packed", "ray1", "ray2-draft-actor", "ray1-in-shard", "ray2-packed"}
    for runtime, job in jobs.items():
        base = runtime.partition("-")[0]
        assert job.parallel.runtime == ("local" if base == "local" else "ray")
        if base != "local":
            assert job.parallel.tp_size == int(base.removeprefix("ray"))
        assert job.model.cpu_prepack == runtime.endswith("-packed")
        assert job.parallel.draft_in_shard == {"in-shard": True, "draft-actor": False}.get(
            runtime.partition("-")[2], "auto"
        )


def test_policies_picks_the_named_ones_and_refuses_an_unknown_name():
    args = SimpleNamespace(num_draft_tokens=[2, 4], confidence=0.0, proposers=["model", "model+ngram"])
    every = bench_throughput.policies(args)
    chosen = bench_throughput.select_policies(every, ["goodput model+ngram", "autoregressive"])
    assert [policy.name for policy in chosen] == ["autoregressive", "goodput model+ngram"]
    assert bench_throughput.select_policies(every, None) == every
    with pytest.raises(SystemExit, match="no such policy"):
        bench_throughput.select_policies(every, ["g=3"])
