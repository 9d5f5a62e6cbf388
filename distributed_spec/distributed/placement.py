"""Placement of one runtime: its bundles, which actor goes in which, and whether the cluster fits them.

Bundles [shard_0 .. shard_{tp-1}] (+ a draft bundle). On cuda each shard bundle holds one GPU; the
draft, unless it runs on the CPU (parallel.draft_device=cpu) or asks for whole GPUs
(parallel.num_gpus_draft >= 1), shares shard 0's GPU: it sits in shard 0's bundle with a fraction
num_gpus_draft of the GPU, shard 0 takes the rest. So tp_size shards and the draft fit on tp_size
GPUs, e.g. a 70B target over the 8 GPUs of one node with its 1B draft beside shard 0. With
parallel.draft_in_shard the draft has no actor and no bundle: it runs inside shard 0's, which at
tp_size 1 takes its CPUs (num_cpus_draft) as well.

Shards are packed on one node where possible (STRICT_PACK), so the CPU all-reduce can use shared
memory and NCCL can use NVLink; when no single node can hold them the group falls back to PACK.
`plan_placement` + `check_fits` run before anything is reserved: a plan the cluster's nodes (Ray's,
not the driver's) cannot hold fails at once, in one line naming the keys to change.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from distributed_spec.distributed.cluster import Resources, cluster_nodes, connect
from distributed_spec.distributed.config import ParallelConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ActorSlot:
    """Where one actor goes: its bundle and the resources it asks of that bundle."""

    bundle: int
    num_cpus: float
    num_gpus: float


@dataclass(frozen=True)
class RuntimePlacement:
    """Bundles of the placement group and the slot of every actor in them."""

    bundles: list[Resources]
    # Rank order.
    shards: list[ActorSlot]
    draft: ActorSlot
    # "cpu" or "cuda": where the draft's model runs.
    draft_device: str
    # The draft runs inside shard 0's actor (parallel.draft_in_shard): `draft` is then shard 0's slot.
    draft_in_shard: bool = False


def plan_placement(config: ParallelConfig) -> RuntimePlacement:
    """Bundles and actor slots for a resolved config (device cpu or cuda; see the module docstring)."""
    gpu = config.device == "cuda"
    shard = {"CPU": config.num_cpus_per_shard} | ({"GPU": 1.0} if gpu else {})
    bundles = [dict(shard) for _ in range(config.tp_size)]
    shards = [ActorSlot(rank, config.num_cpus_per_shard, shard.get("GPU", 0.0)) for rank in range(config.tp_size)]
    if config.draft_runs_in_shard:
        if config.tp_size == 1:
            # The one shard runs the draft too: it takes the draft's CPUs (and threads, group.launch).
            # Not at tp_size > 1: the ranks meet at every layer's all-reduce, and rank 0 with more
            # threads than its peers on shared cores stalls the group (ray2-in-shard, B = 1, rank 0
            # on 2 threads and rank 1 on 1 over 2 cores: no 64-record run done in 6 min, against
            # ~55 s on 1 thread each; docs/RESULTS.md).
            bundles[0]["CPU"] += config.num_cpus_draft
            shards[0] = ActorSlot(0, config.num_cpus_per_shard + config.num_cpus_draft, shards[0].num_gpus)
        return RuntimePlacement(bundles, shards, shards[0], config.resolved_draft_device, draft_in_shard=True)
    if config.draft_shares_gpu:
        bundles[0]["CPU"] += config.num_cpus_draft
        shards[0] = ActorSlot(0, config.num_cpus_per_shard, 1.0 - config.num_gpus_draft)
        draft = ActorSlot(0, config.num_cpus_draft, config.num_gpus_draft)
    else:
        draft_gpus = config.num_gpus_draft if config.draft_on_gpu else 0.0
        bundles.append({"CPU": config.num_cpus_draft} | ({"GPU": draft_gpus} if draft_gpus else {}))
        draft = ActorSlot(config.tp_size, config.num_cpus_draft, draft_gpus)
    return RuntimePlacement(bundles, shards, draft, config.resolved_draft_device)


def runtime_bundles(config: ParallelConfig) -> list[Resources]:
    """The placement group's bundles (see plan_placement)."""
    return plan_placement(config).bundles


def local_num_cpus(config: ParallelConfig) -> int:
    """Logical CPUs for a Ray started in this process: enough for every bundle of the runtime.

    On a small machine (2 cores, TP = 2 + draft = 3 one-CPU bundles) the bundles then share the
    physical cores instead of waiting forever for a placement that cannot exist.
    """
    cpu_config = dataclasses.replace(config, device="cpu", backend="gloo")  # CPU counts do not depend on it
    needed = sum(bundle.get("CPU", 0.0) for bundle in runtime_bundles(cpu_config))
    return max(os.cpu_count() or 1, math.ceil(needed))


def draft_bundle_index(config: ParallelConfig) -> int:
    return plan_placement(config).draft.bundle


# ---- the cluster -----------------------------------------------------------------------------


def described_nodes(config: ParallelConfig) -> list[Resources] | None:
    """The cluster that parallel.plan_* describes, or None to use the live one."""
    if config.plan_gpus_per_node is None:
        return None
    cpus = config.plan_cpus_per_node if config.plan_cpus_per_node is not None else math.inf
    return [{"CPU": cpus, "GPU": float(config.plan_gpus_per_node)} for _ in range(config.plan_num_nodes)]


def _total(nodes: list[Resources], key: str) -> float:
    return sum(node.get(key, 0.0) for node in nodes)


def assign_bundles(bundles: list[Resources], nodes: list[Resources], strategy: str) -> list[int] | None:
    """Node index of every bundle (first fit, largest bundles first), or None when they do not fit.

    STRICT_PACK tries one node first and, as create_placement_group does, falls back to PACK;
    STRICT_SPREAD needs a distinct node per bundle.
    """
    if strategy == "STRICT_PACK":
        for index, node in enumerate(nodes):
            if all(_total(bundles, key) <= node.get(key, 0.0) for key in ("CPU", "GPU")):
                return [index] * len(bundles)
    free = [dict(node) for node in nodes]
    used: set[int] = set()
    assignment = [-1] * len(bundles)
    order = sorted(range(len(bundles)), key=lambda b: (-bundles[b].get("GPU", 0.0), -bundles[b].get("CPU", 0.0)))
    for b in order:
        fits = [
            n
            for n, node in enumerate(free)
            if all(bundles[b].get(key, 0.0) <= node.get(key, 0.0) + 1e-9 for key in ("CPU", "GPU"))
            and not (strategy == "STRICT_SPREAD" and n in used)
        ]
        if not fits:
            return None
        assignment[b] = fits[0]
        used.add(fits[0])
        for key in ("CPU", "GPU"):
            free[fits[0]][key] = free[fits[0]].get(key, 0.0) - bundles[b].get(key, 0.0)
    return assignment


class PlacementError(ValueError):
    """The cluster cannot hold the runtime's bundles; the message names the keys to change."""


def check_fits(config: ParallelConfig, placement: RuntimePlacement, nodes: list[Resources]) -> list[int]:
    """Node index of every bundle; raises PlacementError, in one line naming the keys, when they do not fit."""
    assignment = assign_bundles(placement.bundles, nodes, config.placement_strategy)
    if assignment is not None:
        return assignment
    need_gpus, have_gpus = _total(placement.bundles, "GPU"), _total(nodes, "GPU")
    most_gpus = max((node.get("GPU", 0.0) for node in nodes), default=0.0)
    if config.device == "cuda" and (need_gpus > have_gpus or most_gpus < 1):
        draft = (
            "(the draft inside shard 0)"
            if placement.draft_in_shard
            else f"+ {config.num_gpus_draft:g} for the draft (parallel.num_gpus_draft)"
            if placement.draft.bundle == config.tp_size and placement.draft.num_gpus
            else "(the draft shares shard 0's GPU)" if config.draft_shares_gpu else "(the draft on the CPU)"
        )
        raise PlacementError(
            f"parallel.tp_size={config.tp_size} on parallel.device=cuda needs {need_gpus:g} GPUs "
            f"({config.tp_size} shards {draft}) but the cluster has {have_gpus:g} ({len(nodes)} node(s), "
            f"at most {most_gpus:g} on one); lower parallel.tp_size, set parallel.num_gpus_draft below 1 "
            "or parallel.draft_device=cpu, or add GPU nodes"
        )
    raise PlacementError(
        f"the cluster's nodes ({_describe(nodes)}) cannot hold the bundles {placement.bundles} with "
        f"parallel.placement_strategy={config.placement_strategy}; lower parallel.num_cpus_per_shard / "
        "parallel.num_cpus_draft or parallel.tp_size, or use parallel.placement_strategy=PACK"
    )


def _describe(nodes: list[Resources]) -> str:
    return ", ".join(f"{_count(node.get('CPU', 0.0))} CPU + {node.get('GPU', 0.0):g} GPU" for node in nodes) or "none"


def _count(value: float) -> str:
    return "any" if math.isinf(value) else f"{value:g}"


def format_plan(config: ParallelConfig, placement: RuntimePlacement, nodes: list[Resources], assignment: list[int]) -> str:
    """A human-readable placement: one line per node, the actors on it and what they hold."""
    lines = [
        f"placement: {config.tp_size} target shard(s) on {config.device} ({config.backend}), "
        f"draft on {placement.draft_device}, strategy {config.placement_strategy}; "
        f"{len(nodes)} node(s): {_describe(nodes)}"
    ]
    for node in sorted(set(assignment)):
        actors = [
            f"shard {rank} ({slot.num_gpus:g} GPU, {slot.num_cpus:g} CPU)"
            + (" with the draft inside it" if rank == 0 and placement.draft_in_shard else "")
            for rank, slot in enumerate(placement.shards)
            if assignment[slot.bundle] == node
        ]
        if not placement.draft_in_shard and assignment[placement.draft.bundle] == node:
            actors.append(f"draft ({placement.draft.num_gpus:g} GPU, {placement.draft.num_cpus:g} CPU)")
        used = {key: sum(placement.bundles[b].get(key, 0.0) for b, n in enumerate(assignment) if n == node)
                for key in ("GPU", "CPU")}
        lines.append(
            f"  node {node}: {used['GPU']:g}/{nodes[node].get('GPU', 0.0):g} GPU, "
            f"{used['CPU']:g}/{_count(nodes[node].get('CPU', 0.0))} CPU: " + ", ".join(actors)
        )
    return "\n".join(lines)


def plan_report(config: ParallelConfig) -> str:
    """The placement for the cluster parallel.plan_* describes, else for the live one (joined or
    started here); raises PlacementError when it does not fit. Loads no model."""
    nodes = described_nodes(config)
    if nodes is None:
        connect(config.ray_address)
        nodes = cluster_nodes()
    config, placement, assignment = plan_runtime(config, nodes)
    return format_plan(config, placement, nodes, assignment)


def plan_runtime(config: ParallelConfig, nodes: list[Resources]) -> tuple[ParallelConfig, RuntimePlacement, list[int]]:
    """Plan the bundles and check that the nodes hold them. A config still at device=auto (one not
    resolved by a job, e.g. built in a test or script) is resolved here, for these nodes."""
    config = config.resolve(nodes)
    placement = plan_placement(config)
    return config, placement, check_fits(config, placement, nodes)


def create_placement_group(config: ParallelConfig) -> PlacementGroup:
    """Reserve the bundles; STRICT_PACK falls back to PACK when it is not ready in time."""
    bundles = runtime_bundles(config)
    strategies = [config.placement_strategy]
    if config.placement_strategy == "STRICT_PACK":
        strategies.append("PACK")
    for strategy in strategies:
        group = placement_group(bundles, strategy=strategy)
        ready, _ = ray.wait([group.ready()], timeout=config.placement_timeout_s)
        if ready:
            logger.info("placement group ready: %d bundles, strategy %s", len(bundles), strategy)
            return group
        remove_placement_group(group)
        logger.warning(
            "placement group with strategy %s not ready after %.0f s", strategy, config.placement_timeout_s
        )
    raise TimeoutError(
        f"no placement for {bundles} with strategies {strategies} within {config.placement_timeout_s} s; "
        "lower parallel.tp_size / parallel.num_cpus_per_shard or raise parallel.placement_timeout_s"
    )


def bundle_strategy(group: PlacementGroup, bundle_index: int) -> PlacementGroupSchedulingStrategy:
    """Scheduling strategy that pins a task or actor to one bundle of the group."""
    return PlacementGroupSchedulingStrategy(
        placement_group=group,
        placement_group_bundle_index=bundle_index,
        placement_group_capture_child_tasks=False,
    )


def remove_group(group: PlacementGroup | None) -> None:
    """Release the reservation; safe to call twice or on an already removed group."""
    if group is None:
        return
    try:
        remove_placement_group(group)
    except Exception as error:  # noqa: BLE001 - teardown must go on whatever the group's state
        logger.warning("removing placement group failed: %s", error)
