"""A `parallel=ray` job killed mid-run (SIGTERM, SIGKILL) and resumed, end to end through the CLI.

    timeout 900 .venv/bin/python -m pytest tests/distributed/test_job_faults.py -x -q

Each job is a subprocess on the tiny pair (tests/jobs/fakes.py) that joins this module's Ray cluster
(`parallel.ray_address`), so the test sees its actors and placement groups. Every resumed run must
end with each record exactly once, token for token what an uninterrupted run writes.
"""

from __future__ import annotations

import glob
import os
import re
import signal
import time

import pytest
import ray
from ray.util.placement_group import placement_group_table

from tests.jobs.cli_runs import cli, read_jsonl, tiny_args, write_prompts
from tests.jobs.fakes import save_tiny_pair

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]

NUM_RECORDS = 12


@pytest.fixture(scope="module")
def job_inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("job_faults")
    input_path = root / "prompts.jsonl"
    write_prompts(input_path, NUM_RECORDS)
    return save_tiny_pair(root), input_path


def _args(job_inputs, out, *extra: str) -> list[str]:
    tiny_pair, input_path = job_inputs
    return tiny_args(
        tiny_pair,
        input_path,
        f"data.output_dir={out}",
        f"hydra.run.dir={out / 'hydra'}",
        "data.batch_size=2",
        "data.fsync_every=1",
        "sampling.max_new_tokens=24",
        "sampling.temperature=1.0",
        # A schedule of the row's own history: sampled completions are reproducible record by record.
        "verifier.draft_len_schedule=constant",
        *extra,
    )


def _ray_args(job_inputs, out) -> list[str]:
    return _args(
        job_inputs,
        out,
        "parallel=ray",
        "parallel.tp_size=2",
        "parallel.num_cpus_per_shard=0.5",
        "parallel.num_cpus_draft=0.5",
        f"parallel.ray_address={ray.get_runtime_context().gcs_address}",
    )


@pytest.fixture(scope="module")
def reference(job_inputs, tmp_path_factory):
    """Completion ids per record of one uninterrupted run (the local engine: the Ray runtime
    reproduces it token for token, docs/design.md section 5)."""
    out = tmp_path_factory.mktemp("reference")
    process = cli(_args(job_inputs, out, "parallel=local"))
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    return {record["id"]: record["completion_ids"] for record in read_jsonl(out / "completions.jsonl")}


def _start_and_wait_for(args, completions, num_lines: int):
    process = cli(args)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        if completions.exists() and completions.read_bytes().count(b"\n") >= num_lines:
            return process
        time.sleep(0.05)
    output = process.communicate(timeout=60)[0] if process.poll() is not None else "(still running)"
    os.killpg(process.pid, signal.SIGKILL)
    pytest.fail(f"the job did not write {num_lines} completions in time:\n{output}")


def _group_port(output: str) -> int:
    """The port of the (last) shard group the job's log names."""
    return int(re.findall(r"runtime up: 2 target shard\(s\) at [^:\s]+:(\d+)", output)[-1])


def _segments(port: int) -> list[str]:
    return glob.glob(f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_*_{port}_*")


def _live_actors_and_groups() -> tuple[list, list]:
    actors = [
        actor
        for actor in ray._private.state.actors().values()
        if actor["State"] != "DEAD" and actor["ActorClassName"] in ("TargetShard", "DraftWorker")
    ]
    groups = [key for key, entry in placement_group_table().items() if entry["state"] != "REMOVED"]
    return actors, groups


def _wait_until_nothing_is_left(timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while _live_actors_and_groups() != ([], []) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _live_actors_and_groups() == ([], [])


def _resume_and_check(args, out, reference) -> None:
    rerun = cli(args)
    output, _ = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, output
    records = read_jsonl(out / "completions.jsonl")
    ids = [record["id"] for record in records]
    assert len(ids) == len(set(ids)) == NUM_RECORDS
    assert {record["id"]: record["completion_ids"] for record in records} == reference
    errors = read_jsonl(out / "errors.jsonl")
    assert [error["line"] for error in errors] == [7]  # the malformed line, once
    _wait_until_nothing_is_left(60)


def test_sigterm_mid_job_exits_cleanly_and_resume_completes(ray_cluster, job_inputs, reference, tmp_path):
    out = tmp_path / "out"
    args = _ray_args(job_inputs, out)
    completions = out / "completions.jsonl"
    process = _start_and_wait_for(args, completions, 2)
    process.send_signal(signal.SIGTERM)  # the job's own process, as a scheduler or `kill` would
    output, _ = process.communicate(timeout=120)
    # SystemExit(128 + SIGTERM): non-zero, but through every finally (not killed by the signal).
    assert process.returncode == 128 + signal.SIGTERM, output
    # What was written is flushed and whole: every line parses.
    num_before = len(read_jsonl(completions))
    assert 2 <= num_before < NUM_RECORDS
    # close() ran: the group's actors, placement group and /dev/shm segments are gone.
    assert not _segments(_group_port(output))
    _wait_until_nothing_is_left(30)
    _resume_and_check(args, out, reference)


def test_sigkill_mid_job_then_resume_completes_and_clears_dev_shm(
    ray_cluster, job_inputs, reference, tmp_path
):
    out = tmp_path / "out"
    args = _ray_args(job_inputs, out)
    completions = out / "completions.jsonl"
    process = _start_and_wait_for(args, completions, 2)
    os.killpg(process.pid, signal.SIGKILL)
    output, _ = process.communicate(timeout=60)
    port = _group_port(output)
    # Ray ends a dead driver's actors and placement groups; DeepSpeed's segments stay behind.
    _wait_until_nothing_is_left(60)
    assert _segments(port)
    # A SIGKILL can land mid-write: leave a torn line as it would.
    with open(completions, "ab") as file:
        file.write(b'{"id": "r999", "prompt": "torn')
    _resume_and_check(args, out, reference)
    assert not _segments(port)  # removed at the resumed job's start (nothing held them)
