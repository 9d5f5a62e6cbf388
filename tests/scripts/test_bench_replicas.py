"""scripts/bench_replicas.py --rounds: the configurations take turns, each round's ratio and their mean
are reported, and every run's completions are checked against the first run's. The jobs are replaced by
a fake (the real ones are the script's work, minutes each; tests/distributed/test_replicas.py runs them)."""

import json

import pytest

from scripts import bench_replicas


@pytest.fixture
def fake_jobs(monkeypatch):
    """run() writes completions.jsonl and reports tokens/s from a script of (replicas, threads) -> values."""
    import ray

    import distributed_spec.jobs.runner as runner

    calls = []
    speeds = {(2, 1): [30.0, 26.0], (1, 2): [20.0, 20.0]}
    # The second 2-replica run writes another completion for record b001.
    completion_of = {("b001", 2, 1, 1): [9, 9]}

    def fake_run(job):
        layout = (job.parallel.num_replicas, int(job.parallel.num_cpus_per_shard))
        index = sum(1 for call in calls if call == layout)
        calls.append(layout)
        out = bench_replicas.Path(job.data.output_dir)
        out.mkdir(parents=True)
        with open(out / "completions.jsonl", "w", encoding="utf-8") as file:
            for record_id in ("b000", "b001"):
                ids = completion_of.get((record_id, *layout, index), [1, 2])
                file.write(json.dumps({"id": record_id, "completion_ids": ids}) + "\n")
        return {"records": 2, "new_tokens": 4, "wall_time_s": 1.0, "tokens_per_s": speeds[layout][index],
                "block_efficiency": 1.5}

    monkeypatch.setattr(runner, "run", fake_run)
    monkeypatch.setattr(ray, "init", lambda **_: None)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(bench_replicas, "model_config", lambda tiny, root, dtype: None)
    monkeypatch.setattr(bench_replicas, "read_bench_prompts", lambda: [{"prompt": "hi"}])
    return calls


def test_rounds_take_turns_and_average_their_ratios(fake_jobs, tmp_path):
    results = bench_replicas.main(["--rounds", "2", "--num-records", "2", "--out", str(tmp_path)])
    assert fake_jobs == [(2, 1), (1, 2), (2, 1), (1, 2)]
    assert results["ratios"] == pytest.approx([1.5, 1.3])
    assert results["ratio"] == pytest.approx(1.4)
    # A later round that writes another completion is caught, naming the record.
    assert results["identical"] is False and results["mismatched"] == ["b001"]
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["ratio"] == pytest.approx(1.4) and len(saved["rounds"]) == 2
    assert saved["runs"]["2 replicas x 1 thread"]["tokens_per_s"] == 30.0


def test_one_round_is_the_ratio_of_its_two_runs(fake_jobs, tmp_path):
    results = bench_replicas.main(["--num-records", "2", "--out", str(tmp_path)])
    assert results["ratio"] == pytest.approx(1.5) and results["identical"] is True


def test_rounds_must_be_positive(tmp_path):
    with pytest.raises(SystemExit):
        bench_replicas.main(["--rounds", "0", "--out", str(tmp_path)])
