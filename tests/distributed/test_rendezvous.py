"""Rendezvous values and runtime config validation (no Ray cluster needed)."""

import os

import pytest

from distributed_spec.distributed.placement import local_num_cpus, runtime_bundles
from distributed_spec.distributed.rendezvous import (
    Rendezvous,
    ShardPlacement,
    set_distributed_env,
    shard_placements,
)
from tests.distributed.conftest import ray_config


def test_local_ranks_and_sizes_follow_nodes() -> None:
    placements = shard_placements(["a", "b", "a", "a"])
    assert [(p.rank, p.local_rank, p.local_size) for p in placements] == [(0, 0, 3), (1, 0, 1), (2, 1, 3), (3, 2, 3)]


def test_distributed_env_has_every_variable_deepspeed_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT", "DS_ACCELERATOR"):
        # setenv (not delenv) so that monkeypatch removes what set_distributed_env writes: a leaked
        # RANK=1 would silence the rank-zero logger of every later subprocess.
        monkeypatch.setenv(key, "")
    set_distributed_env(Rendezvous("10.0.0.1", 29555, 2), ShardPlacement(rank=1, local_rank=1, local_size=2), "cpu")
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]) == ("1", "2", "1")
    assert (os.environ["LOCAL_SIZE"], os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == ("2", "10.0.0.1", "29555")
    assert os.environ["DS_ACCELERATOR"] == "cpu"
    # On cuda Ray shows each shard one GPU: its device index is 0 whatever its local rank.
    set_distributed_env(Rendezvous("10.0.0.1", 29555, 2), ShardPlacement(rank=1, local_rank=1, local_size=2), "cuda")
    assert os.environ["LOCAL_RANK"] == "0"


def test_bundles_one_gpu_per_shard_on_cuda() -> None:
    assert runtime_bundles(ray_config(tp_size=2, num_cpus_per_shard=0.5)) == [
        {"CPU": 0.5}, {"CPU": 0.5}, {"CPU": 1.0}
    ]
    # The draft shares shard 0's GPU by default (tests/distributed/test_placement.py has the rest).
    cuda = runtime_bundles(ray_config(tp_size=2, device="cuda", backend="nccl"))
    assert [bundle.get("GPU") for bundle in cuda] == [1.0, 1.0]


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [({"tp_size": 0}, "parallel.tp_size"), ({"backend": "nccl"}, "parallel.backend"),
     ({"wire_dtype": "int8"}, "parallel.wire_dtype"), ({"placement_strategy": "X"}, "parallel.placement_strategy")],
)
def test_config_errors_name_the_key(kwargs: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key):
        ray_config(**kwargs)


def test_a_local_ray_gets_enough_logical_cpus_for_every_bundle() -> None:
    # TP = 2 + draft on a 2-core machine: 3 one-CPU bundles must still be placeable.
    assert local_num_cpus(ray_config(tp_size=2)) >= 3
    assert local_num_cpus(ray_config(tp_size=4, num_cpus_per_shard=2.0)) >= 9
