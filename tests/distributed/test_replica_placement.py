"""parallel.num_replicas=auto: as many whole runtimes as the cluster's nodes hold, planned the way
their placement groups are reserved; the plan command shows them. No Ray needed."""

from __future__ import annotations

import pytest

from distributed_spec.config import ConfigError, ParallelConfig
from distributed_spec.distributed.placement import PlacementError
from distributed_spec.distributed.replica_placement import fit_replicas, resolve_num_replicas
from distributed_spec.plan import compose_job, plan_text
from tests.distributed.conftest import ray_config

EIGHT_GPU_NODE = {"CPU": 16.0, "GPU": 8.0}


@pytest.mark.parametrize(
    ("config", "nodes", "expected"),
    [
        # TP = 8 with the draft on shard 0's GPU: one replica per 8-GPU node.
        (ray_config(tp_size=8, device="cuda", backend="nccl"), [EIGHT_GPU_NODE] * 4, 4),
        # TP = 2: four per node, limited by GPUs (3 CPUs each: 16 CPUs would hold five).
        (ray_config(tp_size=2, device="cuda", backend="nccl"), [EIGHT_GPU_NODE] * 2, 8),
        # A draft with a GPU of its own: 3 GPUs per replica, two per node.
        (ray_config(tp_size=2, device="cuda", backend="nccl", num_gpus_draft=1), [EIGHT_GPU_NODE], 2),
        # CPU replicas are counted in CPUs: 1 shard + 1 draft CPU each.
        (ray_config(tp_size=1), [{"CPU": 5.0, "GPU": 0.0}], 2),
        (ray_config(tp_size=1, num_cpus_per_shard=0.5, num_cpus_draft=0.5), [{"CPU": 2.0, "GPU": 0.0}], 2),
    ],
)
def test_auto_fills_the_nodes(config, nodes, expected):
    assert resolve_num_replicas("auto", config, nodes) == expected
    assert len(fit_replicas(config, nodes)) == expected


def test_a_given_count_is_kept_and_auto_needs_room_for_one():
    config = ray_config(tp_size=8, device="cuda", backend="nccl")
    assert resolve_num_replicas(3, config, [EIGHT_GPU_NODE]) == 3
    with pytest.raises(PlacementError, match="parallel.tp_size=8"):
        resolve_num_replicas("auto", config, [{"CPU": 16.0, "GPU": 4.0}])


def test_replicas_spread_over_nodes_whole():
    config = ray_config(tp_size=4, device="cuda", backend="nccl")
    assert fit_replicas(config, [EIGHT_GPU_NODE] * 2) == [[0] * 4, [0] * 4, [1] * 4, [1] * 4]


def test_plan_command_shows_the_replicas():
    job = compose_job(
        [
            "model=llama3_70b_1b",
            "parallel=ray",
            "parallel.tp_size=8",
            "parallel.device=cuda",
            "parallel.num_replicas=auto",
            "parallel.plan_num_nodes=4",
            "parallel.plan_gpus_per_node=8",
            "parallel.plan_cpus_per_node=16",
        ]
    )
    text = plan_text(job)
    assert text.splitlines()[0].startswith("replicas: 4 (parallel.num_replicas=auto)")
    assert "replica 3: node(s) 3" in text


@pytest.mark.parametrize("value", [0, -1, "two", 1.5])
def test_bad_replica_counts_name_the_key(value):
    with pytest.raises(ConfigError, match="parallel.num_replicas"):
        ParallelConfig(runtime="ray", device="cpu", num_replicas=value)


def test_replicas_need_the_ray_runtime():
    with pytest.raises(ConfigError, match="parallel=ray"):
        ParallelConfig(runtime="local", num_replicas=2)
    assert ParallelConfig(runtime="ray", device="cpu", num_replicas="auto").num_replicas == "auto"
