"""Process-group formation from explicit rendezvous values (passed in, never discovered).

The coordinator picks the master address and port with a tiny task on the first bundle of the
placement group (it binds port 0, so the kernel hands out a free port) and passes rank, world size,
local rank, local size, address and port to every shard. `set_distributed_env` must run before
`deepspeed` is imported anywhere in the process: DeepSpeed reads these variables at import and its
CPU shared-memory all-reduce segfaults when LOCAL_SIZE is missing.
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup

from distributed_spec.distributed.cpu_comm_op import build_shm_op
from distributed_spec.distributed.placement import bundle_strategy


@dataclass(frozen=True)
class Rendezvous:
    """Where the shard group meets: master address and port, and the group's size."""

    master_addr: str
    master_port: int
    world_size: int


@dataclass(frozen=True)
class ShardPlacement:
    """One shard's coordinates in the group, computed by the coordinator from the actors' nodes."""

    rank: int
    local_rank: int
    # Number of shards on this shard's node (DeepSpeed's LOCAL_SIZE).
    local_size: int


@ray.remote(num_cpus=0)
def _pick_address_and_port() -> tuple[str, int]:
    """Runs on bundle 0: its node's IP and a port that was free a moment ago (bound to 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        port = sock.getsockname()[1]
    return ray.util.get_node_ip_address(), port


def pick_rendezvous(group: PlacementGroup, world_size: int, timeout_s: float = 60.0) -> Rendezvous:
    """Address and a fresh port on the node of the group's first bundle (where rank 0 runs)."""
    ref = _pick_address_and_port.options(scheduling_strategy=bundle_strategy(group, 0)).remote()
    # Host sync: the shards cannot be told where to meet before the port is known.
    addr, port = ray.get(ref, timeout=timeout_s)
    return Rendezvous(master_addr=addr, master_port=port, world_size=world_size)


def shard_placements(node_ids: list[str]) -> list[ShardPlacement]:
    """Local rank and local size of each rank, from the node each rank's actor landed on."""
    placements = []
    for rank, node_id in enumerate(node_ids):
        same_node = [r for r, other in enumerate(node_ids) if other == node_id]
        placements.append(
            ShardPlacement(rank=rank, local_rank=same_node.index(rank), local_size=len(same_node))
        )
    return placements


def set_distributed_env(rendezvous: Rendezvous, placement: ShardPlacement, device: str) -> None:
    """Every variable torch.distributed and DeepSpeed read; call before importing deepspeed.

    On cuda Ray gives each shard actor exactly one visible GPU, so the device index (LOCAL_RANK as
    DeepSpeed uses it for `set_device`) is 0 whatever the shard's local rank.
    """
    os.environ["DS_ACCELERATOR"] = device
    os.environ["RANK"] = str(placement.rank)
    os.environ["WORLD_SIZE"] = str(rendezvous.world_size)
    os.environ["LOCAL_RANK"] = "0" if device == "cuda" else str(placement.local_rank)
    os.environ["LOCAL_SIZE"] = str(placement.local_size)
    os.environ["MASTER_ADDR"] = rendezvous.master_addr
    os.environ["MASTER_PORT"] = str(rendezvous.master_port)


def init_shard_group(
    rendezvous: Rendezvous, placement: ShardPlacement, device: str, backend: str, timeout_s: float
) -> None:
    """Join the shard group through DeepSpeed (which also initialises torch.distributed)."""
    set_distributed_env(rendezvous, placement, device)
    import deepspeed  # noqa: PLC0415 - must follow set_distributed_env

    if device == "cpu":
        build_shm_op()  # what init_distributed builds, but safe from a killed earlier build

    deepspeed.init_distributed(
        dist_backend=backend,
        auto_mpi_discovery=False,
        distributed_port=rendezvous.master_port,
        verbose=False,
        timeout=datetime.timedelta(seconds=timeout_s),
        rank=placement.rank,
        world_size=rendezvous.world_size,
    )
