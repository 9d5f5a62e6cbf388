"""The job loop on a fake generator: outputs, errors, resume, batch failures, stop strings."""

from __future__ import annotations

import json

import pytest

from distributed_spec.config import DataConfig, JobConfig, SamplingConfig, TrackingConfig, VerifierConfig
from distributed_spec.jobs.io import RecordSampling
from distributed_spec.jobs.runner import cut_at_stop, run
from tests.jobs.fakes import FakeGenerator

RECORDS = [
    {"id": "a", "prompt": "hello"},
    {"id": "b", "messages": [{"role": "user", "content": "hi there"}]},
    "not json",
    {"id": "c", "prompt": "x" * 80},  # over the fake's 64-token context
    {"id": "d", "prompt": "bye"},
    {"id": "e", "prompt": "     "},
    {"id": 5, "prompt": "five"},
]


def _write_input(path, records):
    with open(path, "w") as file:
        for record in records:
            file.write((record if isinstance(record, str) else json.dumps(record)) + "\n")


def _job(tmp_path, **data_overrides) -> JobConfig:
    input_path = tmp_path / "in.jsonl"
    if not input_path.exists():
        _write_input(input_path, RECORDS)
    data = DataConfig(
        input_path=str(input_path), output_dir=str(tmp_path / "out"), batch_size=2, fsync_every=1
    )
    for key, value in data_overrides.items():
        setattr(data, key, value)
    return JobConfig(
        verifier=VerifierConfig(method="block", num_draft_tokens=2),
        sampling=SamplingConfig(max_new_tokens=4),
        data=data,
        tracking=TrackingConfig(mode="disabled", progress=False),
    )


def _lines(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_outputs_errors_and_summary(tmp_path):
    generator = FakeGenerator()
    summary = run(_job(tmp_path), generator=generator)
    out = tmp_path / "out"
    completions = _lines(out / "completions.jsonl")
    assert [record["id"] for record in completions] == ["a", "b", "d", 5]
    first = completions[0]
    assert first["prompt"] == "hello" and first["completion"] == "hell" and first["finish_reason"] == "length"
    assert first["completion_ids"] == generator.tokenizer.encode("hell")
    assert first["stats"]["num_new_tokens"] == 4 and first["stats"]["block_efficiency"] == 2.0
    chat = completions[1]
    assert chat["prompt"] == "user: hi there\nassistant: " and chat["messages"][0]["content"] == "hi there"
    errors = {error["line"]: error for error in _lines(out / "errors.jsonl")}
    assert sorted(errors) == [3, 4, 6]
    assert errors[4]["id"] == "c" and errors[4]["reason"].startswith("prompt over the context length")
    assert summary["records"] == 4 and summary["errors"] == 3 and summary["errors_total"] == 3
    assert summary["new_tokens"] == 4 + 4 + 4 + 4
    assert summary["block_efficiency"] == 2.0
    assert summary["acceptance_per_position"] == [1.0, 0.0]
    # Runtime-specific counters are summed over the run (0.25 per record here).
    assert summary["runtime/transfer_s"] == 1.0
    assert json.loads((out / "summary.json").read_text())["records_total"] == 4
    assert generator.closed


def test_rerun_skips_finished_ids_and_repairs_a_torn_line(tmp_path):
    run(_job(tmp_path), generator=FakeGenerator())
    out = tmp_path / "out"
    completions = (out / "completions.jsonl").read_bytes().splitlines(keepends=True)
    # As after a SIGKILL: the last two records lost, one of them half written.
    (out / "completions.jsonl").write_bytes(b"".join(completions[:2]) + completions[2][:15])
    generator = FakeGenerator()
    summary = run(_job(tmp_path), generator=generator)
    ids = [record["id"] for record in _lines(out / "completions.jsonl")]
    assert sorted(map(str, ids)) == ["5", "a", "b", "d"] and len(ids) == 4
    assert summary["records"] == 2 and summary["records_skipped"] == 2 and summary["records_total"] == 4
    # Errors are not written twice either.
    assert len(_lines(out / "errors.jsonl")) == 3 and summary["errors"] == 0 and summary["errors_total"] == 3
    assert [len(ids) for ids, _ in generator.calls] == [2]


def test_resume_false_starts_over(tmp_path):
    run(_job(tmp_path), generator=FakeGenerator())
    summary = run(_job(tmp_path, resume=False), generator=FakeGenerator())
    assert summary["records"] == 4 and len(_lines(tmp_path / "out" / "completions.jsonl")) == 4


def test_a_failing_record_costs_only_itself(tmp_path):
    # Token id of "y" in the tiny tokenizer: the fake raises on any prompt containing it.
    generator = FakeGenerator()
    generator.fail_on = generator.tokenizer.encode("y")[0]
    summary = run(_job(tmp_path), generator=generator)
    completions = _lines(tmp_path / "out" / "completions.jsonl")
    assert [record["id"] for record in completions] == ["a", "b", 5]
    errors = _lines(tmp_path / "out" / "errors.jsonl")
    assert {"line": 5, "id": "d", "reason": "generation failed: RuntimeError: fake engine failure"} in errors
    assert summary["errors"] == 4


def test_limit_processes_the_first_records(tmp_path):
    summary = run(_job(tmp_path, limit=2), generator=FakeGenerator())
    assert summary["records"] == 2 and summary["errors"] == 0


def test_stop_strings_cut_the_completion_text():
    assert cut_at_stop("abc\n\nUser: x", ["\n\n", "User:"]) == "abc"
    assert cut_at_stop("abc", ["zz"]) == "abc"
    assert cut_at_stop("abc", []) == "abc"


def test_each_record_is_seeded_by_its_id(tmp_path):
    """The generator gets each record's id as its seed key (with sampling.seed it seeds the record's
    own random stream), whatever batch the record lands in."""
    generator = FakeGenerator()
    run(_job(tmp_path), generator=generator)
    assert [key for _, keys in generator.calls for key in keys] == ['"a"', '"b"', '"d"', "5"]  # id_key: ids as JSON


def test_a_records_own_sampling_settings_reach_the_generator(tmp_path):
    """The job's own format carries per-record settings as OpenAI batch files do (jobs/io.py)."""
    _write_input(tmp_path / "in.jsonl", [
        {"id": "t", "prompt": "hello", "temperature": 0.0, "max_new_tokens": 2},
        {"id": "s", "prompt": "bye", "temperature": 1.3, "top_p": 0.5, "seed": 9, "stop": ["zz"]},
        {"id": "j", "prompt": "job's settings"},
    ])  # fmt: skip
    generator = FakeGenerator()
    run(_job(tmp_path), generator=generator)
    items = {item.handle.record.id: item for item in generator.items}
    assert items["t"].max_new_tokens == 2 and items["t"].sampling == RecordSampling(temperature=0.0)
    assert items["s"].sampling == RecordSampling(temperature=1.3, top_p=0.5, seed=9, stop=("zz",))
    assert items["j"].max_new_tokens is None and items["j"].sampling == RecordSampling()


def test_generation_failures_are_retried_on_rerun(tmp_path):
    failing = FakeGenerator()
    failing.fail_on = failing.tokenizer.encode("y")[0]
    run(_job(tmp_path), generator=failing)
    summary = run(_job(tmp_path), generator=FakeGenerator())
    completions = _lines(tmp_path / "out" / "completions.jsonl")
    assert sorted(str(record["id"]) for record in completions) == ["5", "a", "b", "d"]
    errors = _lines(tmp_path / "out" / "errors.jsonl")
    assert sorted(error["line"] for error in errors) == [3, 4, 6]
    assert summary["records"] == 1 and summary["errors_total"] == 3


def test_a_broken_runtime_stops_the_job(tmp_path):
    input_path = tmp_path / "in.jsonl"
    _write_input(input_path, [{"id": index, "prompt": "y"} for index in range(20)])
    generator = FakeGenerator()
    generator.fail_on = generator.tokenizer.encode("y")[0]
    with pytest.raises(RuntimeError, match="8 times in a row"):
        run(_job(tmp_path), generator=generator)
    assert len(_lines(tmp_path / "out" / "errors.jsonl")) == 8
    assert generator.closed


def test_failures_spread_over_the_run_do_not_stop_it(tmp_path):
    # A failing record between good batches: the failures are not in a row, so the job finishes.
    input_path = tmp_path / "in.jsonl"
    _write_input(input_path, [{"id": index, "prompt": "y" if index % 3 == 2 else "ok"} for index in range(30)])
    generator = FakeGenerator()
    generator.fail_on = generator.tokenizer.encode("y")[0]
    summary = run(_job(tmp_path, batch_size=1), generator=generator)
    assert summary["records"] == 20 and summary["errors"] == 10
