"""Faults inside a step of the Ray runtime, through the job loop: a hang, an exception, out of memory.

    timeout 600 .venv/bin/python -m pytest tests/distributed/test_step_faults.py -x -q

The target's forward fails on cue (tests/distributed/faulty.py). Each test runs the job
(jobs.runner.run) over the coordinator and ends with every record exactly once in completions +
errors, the completions token for token those of the single-process engine.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from distributed_spec.config import DataConfig, JobConfig, SamplingConfig, TrackingConfig, VerifierConfig
from distributed_spec.distributed import RayCoordinator
from distributed_spec.distributed.factories import TinyLlamaFactory
from distributed_spec.engine import SpeculativeEngine
from distributed_spec.jobs.runner import run
from distributed_spec.jobs.scheduler_generator import SchedulerGenerator
from distributed_spec.models.tokenizers import eos_ids
from tests.distributed.conftest import ray_config
from tests.distributed.faulty import FaultyTarget
from tests.jobs.cli_runs import read_jsonl
from tests.jobs.fakes import tiny_chat_tokenizer

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

TARGET = TinyLlamaFactory(seed=0, logit_scale=4.0)
DRAFT = TinyLlamaFactory(seed=0, logit_scale=4.0, noise=0.3)
RUNTIME = ray_config(tp_size=2, num_cpus_per_shard=0.5, num_cpus_draft=0.5, step_timeout_s=15.0)
TOKENIZER = tiny_chat_tokenizer()
POISON_TEXT = "§§§"  # three <unk> ids, which no other prompt holds


class _Generator(SchedulerGenerator):
    """The job's Generator over a given backend (a RayCoordinator or the engine)."""

    def __init__(self, backend, config) -> None:
        self.backend, self._config = backend, config
        self.tokenizer = TOKENIZER
        self.max_context_len = 256

    def close(self) -> None:
        pass


def _job(tmp_path, name: str, prompts: list[str], batch_size: int) -> JobConfig:
    input_path = tmp_path / "in.jsonl"
    input_path.write_text(
        "".join(json.dumps({"id": f"r{i}", "prompt": p}) + "\n" for i, p in enumerate(prompts))
    )
    return JobConfig(
        verifier=VerifierConfig(method="block", num_draft_tokens=3, draft_len_schedule="constant"),
        sampling=SamplingConfig(max_new_tokens=12, temperature=1.0),
        data=DataConfig(input_path=str(input_path), output_dir=str(tmp_path / name), batch_size=batch_size),
        tracking=TrackingConfig(mode="disabled", progress=False),
    )


def _run_with(target, job: JobConfig) -> tuple[tuple[dict, dict], RayCoordinator]:
    """Run the job on a TP = 2 runtime of `target`; returns completion ids and error reasons by id."""
    config = job.engine_config(eos_ids(TOKENIZER, None))
    coordinator = RayCoordinator(target, DRAFT, config, RUNTIME, tokenizer=TOKENIZER)
    try:
        run(job, generator=_Generator(coordinator, config))
    finally:
        coordinator.close()
    return _outputs(job), coordinator


def _outputs(job: JobConfig) -> tuple[dict, dict]:
    """Completion ids and error reasons by record id, each record written at most once."""
    out = Path(job.data.output_dir)
    completions, errors = read_jsonl(out / "completions.jsonl"), read_jsonl(out / "errors.jsonl")
    ids = [record["id"] for record in completions] + [error["id"] for error in errors]
    assert len(ids) == len(set(ids)), "a record was written twice"
    return {record["id"]: record["completion_ids"] for record in completions}, {
        error["id"]: error["reason"] for error in errors
    }


def _reference(tmp_path, job: JobConfig) -> dict:
    """Completion ids of the same job on the single-process engine (no faults)."""
    job = replace(job, data=replace(job.data, output_dir=str(tmp_path / "reference")))
    config = job.engine_config(eos_ids(TOKENIZER, None))
    run(job, generator=_Generator(SpeculativeEngine(TARGET(), DRAFT(), config, TOKENIZER), config))
    completions, errors = _outputs(job)
    assert not errors
    return completions


def test_an_exception_in_the_step_becomes_that_records_error_without_reloading(ray_cluster, tmp_path):
    prompts = ["alpha one", "beta two", f"g {POISON_TEXT} three", "delta four", "echo five"]
    job = _job(tmp_path, "out", prompts, batch_size=4)
    target = FaultyTarget(TARGET, "value_error", poison=tuple(TOKENIZER.encode(POISON_TEXT)))
    (completions, errors), coordinator = _run_with(target, job)
    assert list(errors) == ["r2"] and errors["r2"].startswith("generation failed: ValueError: injected")
    expected = _reference(tmp_path, job)  # the same records without the fault
    assert completions == {key: expected[key] for key in ("r0", "r1", "r3", "r4")}
    assert coordinator._num_launches == 1  # the models were never reloaded


def test_out_of_memory_retries_once_at_half_the_rows(ray_cluster, tmp_path):
    """At most 1 row fits: 4 rows fail, then 2 fail again (their records become errors); the 3 left
    fail at 3 rows and go through one at a time."""
    prompts = [
        f"{word} {index}"
        for index, word in enumerate(["alpha", "beta", "g", "delta", "echo", "fox", "golf"])
    ]
    job = _job(tmp_path, "out", prompts, batch_size=4)
    (completions, errors), coordinator = _run_with(FaultyTarget(TARGET, "oom", max_rows=1), job)
    assert sorted(errors) == ["r0", "r1", "r2", "r3"]
    assert all("OutOfMemoryError: CUDA out of memory" in reason for reason in errors.values())
    expected = _reference(tmp_path, job)
    assert completions == {key: expected[key] for key in ("r4", "r5", "r6")}
    assert coordinator._num_launches == 1


def test_a_hung_step_relaunches_the_group_and_the_output_is_unchanged(ray_cluster, tmp_path):
    prompts = ["alpha one", "beta two", "g three", "delta four", "echo five"]
    job = _job(tmp_path, "out", prompts, batch_size=4)
    target = FaultyTarget(TARGET, "hang", at_call=3, marker_dir=str(tmp_path))
    (completions, errors), coordinator = _run_with(target, job)
    assert sorted(path.name for path in tmp_path.glob("hung-rank*")) == ["hung-rank0", "hung-rank1"]
    assert not errors
    assert completions == _reference(tmp_path, job)
    assert coordinator._num_launches == 2  # torn down after parallel.step_timeout_s and relaunched
