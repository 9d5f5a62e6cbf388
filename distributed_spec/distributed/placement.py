"""Placement group of one runtime: one bundle per target shard, then one for the draft.

Shards are packed on one node where possible (STRICT_PACK), so the CPU all-reduce can use shared
memory and NCCL can use NVLink; when no single node can hold them the group falls back to PACK.
"""

from __future__ import annotations

import logging
import math
import os

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from distributed_spec.distributed.config import RayRuntimeConfig

logger = logging.getLogger(__name__)


def runtime_bundles(config: RayRuntimeConfig) -> list[dict[str, float]]:
    """Bundles [shard_0 .. shard_{tp-1}, draft]: CPU bundles on cpu, one GPU per shard on cuda."""
    shard = {"CPU": config.num_cpus_per_shard}
    draft = {"CPU": config.num_cpus_draft}
    if config.device == "cuda":
        shard["GPU"] = config.num_gpus_per_shard
        draft["GPU"] = config.num_gpus_draft
    return [dict(shard) for _ in range(config.tp_size)] + [draft]


def local_num_cpus(config: RayRuntimeConfig) -> int:
    """Logical CPUs for a Ray started in this process: enough for every bundle of the runtime.

    On a small machine (2 cores, TP = 2 + draft = 3 one-CPU bundles) the bundles then share the
    physical cores instead of waiting forever for a placement that cannot exist.
    """
    needed = sum(bundle.get("CPU", 0.0) for bundle in runtime_bundles(config))
    return max(os.cpu_count() or 1, math.ceil(needed))


def draft_bundle_index(config: RayRuntimeConfig) -> int:
    return config.tp_size


def create_placement_group(config: RayRuntimeConfig) -> PlacementGroup:
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
