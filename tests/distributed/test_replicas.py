"""Replicas (parallel.num_replicas): the job through 2 replicas of the Ray runtime writes what one
runtime writes, every record exactly once, when a replica's shard is killed, when a replica itself
dies, and when the driver is SIGKILLed and the job resumed with another replica count.

    timeout 900 .venv/bin/python -m pytest tests/distributed/test_replicas.py -x -q

Tiny random models saved to disk (the job's real loader); one runtime and one 2-replica pool are
launched once for the module and reused through `jobs.runner.run` (each test its own output dir).
"""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path

import pytest
import ray

from distributed_spec.config import (
    DataConfig,
    JobConfig,
    ModelConfig,
    ModelSpec,
    ParallelConfig,
    SamplingConfig,
    TrackingConfig,
    VerifierConfig,
)
from distributed_spec.distributed.placement import cluster_nodes
from distributed_spec.distributed.replica_placement import resolve_num_replicas
from distributed_spec.jobs.ray_generator import RayGenerator
from distributed_spec.jobs.replicas import ReplicaPool
from distributed_spec.jobs.runner import run
from tests.distributed.conftest import ray_config
from tests.jobs.cli_runs import cli, sigkill_after_lines
from tests.jobs.fakes import save_tiny_pair

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]

NUM_RECORDS = 16
SHM_SEGMENTS = f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_*"
MAX_NEW_TOKENS = 12


@pytest.fixture(scope="module")
def ray_cluster():
    # Logical GPUs only for the `auto` test (every runtime here is on the CPU).
    ray.init(num_cpus=8, num_gpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("replicas")
    target, draft = save_tiny_pair(root / "pair")
    words = ["alpha", "beta", "g", "delta", "echo", "fox", "golf", "hotel"]
    lines = [json.dumps({"id": f"r{i:02d}", "prompt": f"{words[i % 8]} {i} says"}) for i in range(NUM_RECORDS)]
    (root / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    return root, target, draft


def make_job(workdir, out: Path, num_replicas=1, temperature: float = 1.0, **parallel) -> JobConfig:
    root, target, draft = workdir
    return JobConfig(
        model=ModelConfig(
            name="tiny", target=ModelSpec(str(target), "dir"), draft=ModelSpec(str(draft), "dir")
        ),
        parallel=ParallelConfig(
            runtime="ray",
            device="cpu",
            num_replicas=num_replicas,
            num_cpus_per_shard=0.5,
            num_cpus_draft=0.5,
            **parallel,
        ),
        # A schedule of the row's own history: sampled completions are reproducible record by record.
        verifier=VerifierConfig(method="block", num_draft_tokens=3, draft_len_schedule="constant"),
        sampling=SamplingConfig(temperature=temperature, max_new_tokens=MAX_NEW_TOKENS, seed=0),
        data=DataConfig(input_path=str(root / "prompts.jsonl"), output_dir=str(out), batch_size=3, fsync_every=1),
        tracking=TrackingConfig(mode="disabled", progress=False),
    )


class Borrowed:
    """A generator lent to one `run` (which closes its generator at the end); `on_result` is called
    with the number of results so far (a test kills something there)."""

    def __init__(self, generator, on_result=None) -> None:
        self.generator = generator
        self.on_result = on_result

    def __getattr__(self, name):
        return getattr(self.generator, name)

    def stream(self, items):
        for count, pair in enumerate(self.generator.stream(items), start=1):
            yield pair
            if self.on_result is not None:
                self.on_result(count)

    def close(self) -> None:
        pass


def completions(out: Path) -> dict[str, list[int]]:
    """id -> completion ids; fails on a repeated id."""
    records = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    ids = [record["id"] for record in records]
    assert len(ids) == len(set(ids)), "a record was written twice"
    return {record["id"]: record["completion_ids"] for record in records}


@pytest.fixture(scope="module")
def single(ray_cluster, workdir, tmp_path_factory):
    """Today's path: one runtime (parallel.num_replicas=1 builds a RayGenerator)."""
    generator = RayGenerator(make_job(workdir, tmp_path_factory.mktemp("unused")))
    yield generator
    generator.close()


@pytest.fixture(scope="module")
def pool(ray_cluster, workdir, tmp_path_factory):
    generator = ReplicaPool(make_job(workdir, tmp_path_factory.mktemp("unused"), num_replicas=2))
    yield generator
    generator.close()


_REFERENCE: dict[float, dict[str, list[int]]] = {}


def reference(single, workdir, tmp_path_factory, temperature: float = 1.0) -> dict[str, list[int]]:
    """The one-runtime completions at this temperature (computed once)."""
    if temperature not in _REFERENCE:
        job = make_job(workdir, tmp_path_factory.mktemp("single"), temperature=temperature)
        single.reconfigure(job)
        run(job, generator=Borrowed(single))
        _REFERENCE[temperature] = completions(Path(job.data.output_dir))
    return _REFERENCE[temperature]


def run_pool(pool, workdir, out: Path, temperature: float = 1.0, on_result=None) -> dict:
    job = make_job(workdir, out, num_replicas=2, temperature=temperature)
    pool.reconfigure(job)
    return run(job, generator=Borrowed(pool, on_result))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_two_replicas_write_what_one_runtime_writes(single, pool, workdir, tmp_path, tmp_path_factory, temperature):
    expected = reference(single, workdir, tmp_path_factory, temperature)
    before = pool.replica_metrics()  # the pool's counters run over its life (one job, outside tests)
    summary = run_pool(pool, workdir, tmp_path, temperature)
    assert completions(tmp_path) == expected
    assert len(expected) == NUM_RECORDS
    # Both replicas took records; each reports its own tokens/s.
    taken = [summary[f"replica/{index}/records"] - before[f"replica/{index}/records"] for index in (0, 1)]
    assert sum(taken) == NUM_RECORDS and min(taken) > 0
    assert summary["replica/0/tokens_per_s"] > 0 and summary["replica/1/tokens_per_s"] > 0


def test_a_killed_shard_of_one_replica_changes_nothing(single, pool, workdir, tmp_path, tmp_path_factory):
    """The replica's own coordinator relaunches its shard group; the other replica goes on."""
    expected = reference(single, workdir, tmp_path_factory)

    def kill_shard(count: int) -> None:
        if count == 3:
            ray.kill(pool.shards(0)[0], no_restart=True)

    before = pool.replica_metrics()
    summary = run_pool(pool, workdir, tmp_path, on_result=kill_shard)
    assert completions(tmp_path) == expected
    assert summary["replica/0/restarts"] - before["replica/0/restarts"] >= 1
    assert summary["replica/1/restarts"] == before["replica/1/restarts"]


def test_a_dead_replica_is_relaunched_and_its_records_go_to_the_other(single, pool, workdir, tmp_path, tmp_path_factory):
    expected = reference(single, workdir, tmp_path_factory)
    killed = []

    def kill_replica(count: int) -> None:
        if count == 3:
            killed.append(pool.replicas[1].incarnation)
            ray.kill(pool.replicas[1].actor, no_restart=True)

    summary = run_pool(pool, workdir, tmp_path, on_result=kill_replica)
    assert completions(tmp_path) == expected
    assert killed == [0] and pool.replicas[1].incarnation == 1 and pool.restarts[1] == 1
    assert summary["replica/1/restarts"] >= 1
    # The relaunched replica serves the next job.
    again = tmp_path / "again"
    run_pool(pool, workdir, again)
    assert completions(again) == expected


def test_auto_counts_replicas_from_the_clusters_logical_resources(ray_cluster):
    nodes = cluster_nodes()
    # 8 logical CPUs, 1 shard + 1 draft CPU per CPU replica.
    assert resolve_num_replicas("auto", ray_config(tp_size=1), nodes) == 4
    # 4 logical GPUs, TP = 2 with the draft on shard 0's GPU.
    assert resolve_num_replicas("auto", ray_config(tp_size=2, device="cuda", backend="nccl"), nodes) == 2


def test_sigkill_with_two_replicas_then_resume_with_one(single, workdir, tmp_path, tmp_path_factory):
    expected = reference(single, workdir, tmp_path_factory)
    root, target, draft = workdir
    out = tmp_path / "out"
    args = [
        "model.name=tiny",
        f"model.target.source={target}",
        "model.target.kind=dir",
        f"model.draft.source={draft}",
        "model.draft.kind=dir",
        f"data.input_path={root / 'prompts.jsonl'}",
        f"data.output_dir={out}",
        "data.batch_size=3",
        "data.fsync_every=1",
        "parallel=ray",
        "parallel.device=cpu",
        "parallel.num_cpus_per_shard=0.5",
        "parallel.num_cpus_draft=0.5",
        f"sampling.max_new_tokens={MAX_NEW_TOKENS}",
        "sampling.temperature=1.0",
        "sampling.seed=0",
        "verifier.num_draft_tokens=3",
        "verifier.draft_len_schedule=constant",
        "tracking=disabled",
        f"hydra.run.dir={tmp_path / 'hydra'}",
    ]
    segments_before = set(glob.glob(SHM_SEGMENTS))
    process = cli([*args, "parallel.num_replicas=2"])
    completions_path = out / "completions.jsonl"
    sigkill_after_lines(process, completions_path, 3, timeout_s=300)
    # Nothing is left to delete the killed replicas' all-reduce segments: the test does.
    killed_segments = set(glob.glob(SHM_SEGMENTS)) - segments_before
    try:
        num_before = completions_path.read_bytes().count(b"\n")
        assert 3 <= num_before < NUM_RECORDS

        rerun = cli([*args, "parallel.num_replicas=1"])
        output, _ = rerun.communicate(timeout=300)
        assert rerun.returncode == 0, output
        assert completions(out) == expected
        summary = json.loads((out / "summary.json").read_text())
        assert summary["records_total"] == NUM_RECORDS and summary["records_skipped"] == num_before
    finally:
        for path in killed_segments:
            Path(path).unlink(missing_ok=True)



def test_an_ordinary_error_ends_the_stream_after_the_other_replicas_finish(pool):
    """A record the models cannot take (a token id past the vocabulary) fails its replica's batch: the
    pool raises once the other replica is done, having yielded every record not in that batch, and
    serves the next stream as before."""
    from distributed_spec.jobs.generator import GenerationItem

    items = [GenerationItem(handle=i, prompt_ids=[5, 6, 7 + i], seed_key=str(i)) for i in range(10)]
    items[4] = GenerationItem(handle=4, prompt_ids=[5, 10_000], seed_key="4")
    done = []
    with pytest.raises(Exception, match="index|out of range"):
        for handle, _ in pool.stream(items):
            done.append(handle)
    assert 4 not in done and len(done) == len(set(done)) and len(done) >= 10 - 3  # the failed batch: data.batch_size = 3 rows
    good = [item for item in items if item.handle != 4]
    assert sorted(handle for handle, _ in pool.stream(good)) == [item.handle for item in good]
