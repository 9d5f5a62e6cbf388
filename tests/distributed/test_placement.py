"""Placement that fits real nodes, planned against the cluster's resources (not the driver's), and
model files fetched before the load timeout starts.

    timeout 600 .venv/bin/python -m pytest tests/distributed/test_placement.py -q

Plans and fit checks are pure functions; the Ray tests run on this CPU machine with Ray's logical
GPUs (`ray.init(num_gpus=2)`): probe actors take the planned slots (no device work) and report the
GPU ids Ray gave them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import ray
import torch

from distributed_spec.config import ConfigError, JobConfig, ParallelConfig, check_devices
from distributed_spec.distributed.factories import SpecFactory, TinyLlamaFactory
from distributed_spec.distributed.group import launch, teardown
from distributed_spec.distributed.placement import (
    PlacementError,
    bundle_strategy,
    check_fits,
    cluster_nodes,
    create_placement_group,
    format_plan,
    plan_placement,
    plan_runtime,
    remove_group,
)
from distributed_spec.engine import EngineConfig
from distributed_spec.engine.config import SamplingConfig, VerifierConfig
from distributed_spec.models import ModelSpec, torch_dtype
from distributed_spec.plan import compose_job, main, plan_text
from tests.distributed.conftest import ray_config

CUDA = {"device": "cuda", "backend": "nccl"}


def node(gpus: float, cpus: float = 64.0) -> dict[str, float]:
    return {"CPU": cpus, "GPU": gpus}


# ---- plans ------------------------------------------------------------------------------------


def test_the_draft_shares_shard_zero_gpu_so_n_shards_fit_n_gpus():
    config = ray_config(tp_size=8, **CUDA)
    plan = plan_placement(config)
    assert [bundle["GPU"] for bundle in plan.bundles] == [1.0] * 8
    assert plan.bundles[0]["CPU"] == 2.0  # shard 0 and the draft
    assert plan.draft.bundle == 0 and plan.draft.num_gpus == pytest.approx(0.1)
    assert plan.shards[0].num_gpus + plan.draft.num_gpus == pytest.approx(1.0)
    assert plan.draft_device == "cuda"
    assert check_fits(config, plan, [node(8)]) == [0] * 8


def test_whole_gpus_for_the_draft_need_a_bundle_and_a_gpu_of_its_own():
    config = ray_config(tp_size=8, num_gpus_draft=1.0, **CUDA)
    plan = plan_placement(config)
    assert len(plan.bundles) == 9 and plan.draft.bundle == 8 and plan.bundles[8]["GPU"] == 1.0
    with pytest.raises(PlacementError) as error:
        check_fits(config, plan, [node(8)])
    message = str(error.value)
    assert "\n" not in message and "needs 9 GPUs" in message
    assert "parallel.num_gpus_draft" in message and "parallel.draft_device=cpu" in message
    assert check_fits(config, plan, [node(8), node(8)]) is not None  # PACK over two nodes


def test_a_draft_inside_shard_zero_takes_no_bundle_and_its_cpus_go_to_the_shard():
    config = ray_config(tp_size=1, draft_in_shard=True, num_cpus_draft=1.5, **CUDA)
    plan = plan_placement(config)
    # The shard's bundle only: the draft runs on its GPU, on its CPUs and the draft's (threads too).
    assert plan.bundles == [{"CPU": 2.5, "GPU": 1.0}]
    assert plan.shards[0].num_cpus == 2.5 and plan.shards[0].num_gpus == 1.0
    assert plan.draft_in_shard and plan.draft == plan.shards[0] and plan.draft_device == "cuda"
    assert not config.draft_shares_gpu
    text = format_plan(config, plan, [node(1)], check_fits(config, plan, [node(1)]))
    assert "shard 0 (1 GPU, 2.5 CPU) with the draft inside it" in text and "draft (" not in text
    # At tp_size > 1 the ranks keep equal CPUs (and threads): they meet at every all-reduce.
    wide = plan_placement(replace(config, tp_size=2))
    assert wide.bundles == [{"CPU": 1.0, "GPU": 1.0}] * 2 and wide.shards[0].num_cpus == 1.0
    with pytest.raises(PlacementError, match=r"needs 1 GPUs \(1 shards \(the draft inside shard 0\)\)"):
        check_fits(config, plan, [node(0)])
    # num_gpus_draft is not read: no actor of its own to leave without a GPU.
    ray_config(tp_size=1, draft_in_shard=True, num_gpus_draft=0.0, **CUDA)


def test_a_cpu_draft_takes_no_gpu():
    plan = plan_placement(ray_config(tp_size=4, draft_device="cpu", **CUDA))
    assert plan.draft_device == "cpu" and plan.draft.num_gpus == 0 and "GPU" not in plan.bundles[4]
    assert plan.shards[0].num_gpus == 1.0


def test_a_draft_sent_to_the_cpu_builds_there_with_its_target():
    factory = SpecFactory(ModelSpec(kind="truncated", num_layers=2), ModelSpec("smollm2"), device="cuda")
    factory = factory.on_device("cpu")
    assert factory.device == "cpu" and factory.target_spec == ModelSpec("smollm2")  # the target loads there too
    assert factory.checkpoint() is None and torch_dtype(factory.dtype, factory.device) == torch.float32


def test_a_cpu_runtime_keeps_one_bundle_per_actor():
    plan = plan_placement(ray_config(tp_size=2, num_cpus_per_shard=0.5))
    assert plan.bundles == [{"CPU": 0.5}, {"CPU": 0.5}, {"CPU": 1.0}] and plan.draft_device == "cpu"


def test_no_gpu_for_the_draft_on_cuda_is_refused_naming_the_keys():
    with pytest.raises(ValueError, match="parallel.num_gpus_draft=0.*parallel.draft_device=cpu"):
        ray_config(tp_size=2, num_gpus_draft=0.0, **CUDA)
    assert ray_config(tp_size=2, num_gpus_draft=0.0, draft_device="cpu", **CUDA).draft_device == "cpu"
    with pytest.raises(ConfigError, match="parallel.num_gpus_draft"):
        ParallelConfig(runtime="ray", tp_size=2, device="cuda", num_gpus_draft=0.0)


def test_too_few_gpus_or_cpus_fail_in_one_line_naming_the_keys():
    config = ray_config(tp_size=4, **CUDA)
    with pytest.raises(PlacementError, match="parallel.tp_size=4 .* needs 4 GPUs .* has 2"):
        check_fits(config, plan_placement(config), [node(2)])
    cpu_heavy = ray_config(tp_size=2, num_cpus_per_shard=8.0, **CUDA)
    with pytest.raises(PlacementError, match="parallel.num_cpus_per_shard"):
        check_fits(cpu_heavy, plan_placement(cpu_heavy), [node(8, cpus=4)])


def test_device_auto_is_decided_by_the_cluster():
    auto = ray_config(tp_size=2, device="auto", backend="auto")
    assert auto.resolve([node(0), node(4)]).device == "cuda"
    assert auto.resolve([node(4)]).backend == "nccl"
    assert auto.resolve([node(0)]).device == "cpu"
    assert auto.resolve([node(0)]).backend == "gloo"


def test_resolve_settles_device_and_backend_once():
    # auto on this machine (the CPU test machine: cpu/gloo), for the local engine and a Ray started here.
    here = ("cuda", "nccl") if torch.cuda.is_available() else ("cpu", "gloo")
    for runtime in ("local", "ray"):
        resolved = ParallelConfig(runtime=runtime).resolve()
        assert (resolved.device, resolved.backend) == here and resolved.is_resolved
        assert resolved.resolve() is resolved
    # Explicit values are kept; backend auto follows the device.
    explicit = ray_config(device="cuda", backend="gloo", tp_size=2, draft_in_shard=False)
    assert explicit.resolve() is explicit
    assert ParallelConfig(runtime="ray", device="cuda").resolve().backend == "nccl"
    assert ParallelConfig(runtime="ray", device="cpu").resolve().backend == "gloo"
    with pytest.raises(ConfigError, match="parallel.backend=nccl needs parallel.device=cuda"):
        ParallelConfig(runtime="ray", device="cpu", backend="nccl")
    # The settled copy is checked again: nccl where auto turned out to be cpu.
    with pytest.raises(ConfigError, match="parallel.backend=nccl needs parallel.device=cuda"):
        ParallelConfig(runtime="ray", backend="nccl").resolve([node(0)])


def test_a_ray_job_does_not_need_a_gpu_on_the_driver():
    # This machine has no GPU: the cluster, not the driver, is checked (at launch).
    check_devices(ParallelConfig(runtime="ray", tp_size=8, device="cuda"))
    with pytest.raises(ConfigError, match="parallel.device=cuda"):
        check_devices(ParallelConfig(runtime="local", device="cuda"))


# ---- the plan command -------------------------------------------------------------------------

LLAMA_70B_ON_8 = ["model=llama3_70b_1b", "parallel=ray", "parallel.tp_size=8", "parallel.device=cuda"]


def test_plan_shows_llama_70b_on_one_8_gpu_node(capsys):
    text = plan_text(compose_job([*LLAMA_70B_ON_8, "parallel.plan_gpus_per_node=8"]))
    assert "node 0: 8/8 GPU" in text and "draft (0.1 GPU" in text and "node 1" not in text
    assert main([*LLAMA_70B_ON_8, "parallel.plan_gpus_per_node=8", "parallel.num_gpus_draft=1"]) == 2
    assert "parallel.num_gpus_draft" in capsys.readouterr().err


def test_plan_keys_exist_in_the_parallel_group():
    job: JobConfig = compose_job(["parallel=ray", "parallel.plan_only=true", "parallel.draft_device=cpu"])
    assert job.parallel.plan_only and job.parallel.num_gpus_draft == pytest.approx(0.1)
    assert replace(job.parallel, device="cuda").resolve().draft_device == "cpu"


# ---- on a Ray cluster with logical GPUs ---------------------------------------------------------


@pytest.fixture(scope="module")
def gpu_cluster():
    ray.init(num_cpus=4, num_gpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@ray.remote
class Probe:
    def gpu_ids(self) -> list:
        return ray.get_gpu_ids()


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_planned_slots_on_logical_gpus_co_locate_the_draft(gpu_cluster):
    nodes = cluster_nodes()
    assert sum(n["GPU"] for n in nodes) == 2
    config, plan, _ = plan_runtime(ray_config(tp_size=2, device="auto", backend="auto"), nodes)
    assert config.device == "cuda"
    # A job joining this cluster resolves auto from the cluster's GPUs, not the driver's (none here).
    assert ray_config(device="auto", backend="auto", ray_address="auto").resolve().device == "cuda"
    group = create_placement_group(config)
    try:
        slots = [*plan.shards, plan.draft]
        probes = [
            Probe.options(
                num_cpus=slot.num_cpus,
                num_gpus=slot.num_gpus,
                scheduling_strategy=bundle_strategy(group, slot.bundle),
            ).remote()
            for slot in slots
        ]
        shard0, shard1, draft = ray.get([probe.gpu_ids.remote() for probe in probes], timeout=60)
        assert len(shard0) == len(shard1) == len(draft) == 1
        assert draft == shard0 and shard0 != shard1  # the draft shares shard 0's GPU
    finally:
        remove_group(group)
    with pytest.raises(PlacementError, match="needs 3 GPUs"):
        plan_runtime(ray_config(tp_size=3, **CUDA), nodes)


@dataclass(frozen=True)
class SlowFetchFactory(TinyLlamaFactory):
    """A tiny target whose files take longer to 'download' than the load may take."""

    marker: str = ""
    fetch_s: float = 0.0

    def fetch(self) -> None:
        time.sleep(self.fetch_s)
        Path(self.marker).write_text("fetched")

    def __call__(self):
        if Path(self.marker).read_text() != "fetched":
            raise RuntimeError("loaded before the files were fetched")
        return super().__call__()


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_files_are_fetched_before_loading_and_outside_the_load_timeout(gpu_cluster, tmp_path):
    # The load itself gets a 60 s budget (a busy 2-core machine can take 30 s to start an actor); the
    # fetch takes longer than that budget, so the launch only succeeds if the fetch is outside it.
    config = ray_config(tp_size=1, num_cpus_per_shard=0.5, num_cpus_draft=0.5, load_timeout_s=60.0)
    engine = EngineConfig(
        verifier=VerifierConfig(method="autoregressive"), sampling=SamplingConfig(temperature=0.0)
    )
    target = SlowFetchFactory(marker=str(tmp_path / "marker"), fetch_s=75.0)
    start = time.perf_counter()
    actors = launch(config, engine, target, None, draft_seed=0)
    try:
        assert time.perf_counter() - start > 75.0
        assert actors.vocab_size == 64 and actors.shard_memory[0]["parameter_bytes"] > 0
    finally:
        teardown(actors)


@pytest.mark.parametrize(
    ("changes", "inside"),
    [
        ({"tp_size": 1}, True),
        ({"tp_size": 2}, False),
        ({"tp_size": 1, "overlap": True}, False),
        ({"tp_size": 4, "verify": "vocab_parallel"}, False),
    ],
)
def test_draft_in_shard_auto_puts_the_draft_inside_at_tp_size_one_without_overlap(changes, inside):
    config = ParallelConfig(runtime="ray", draft_in_shard="auto", **changes)
    assert not config.is_resolved
    resolved = config.resolve([{"CPU": 8.0}])
    assert resolved.draft_in_shard is inside and resolved.is_resolved and resolved.device == "cpu"
    assert plan_placement(resolved).draft_in_shard is inside
    # A config already on a device settles auto alone.
    assert ray_config(draft_in_shard="auto", **changes).resolve().draft_in_shard is inside


def test_draft_in_shard_takes_true_false_or_auto_only():
    with pytest.raises(ConfigError, match="parallel.draft_in_shard must be true, false or auto"):
        ray_config(draft_in_shard="yes")
