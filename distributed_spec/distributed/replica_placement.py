"""How many replicas of one runtime a cluster holds (parallel.num_replicas=auto), and their plan.

A replica is one whole runtime (placement.plan_placement: tp_size shard bundles, the draft beside
shard 0 or in a bundle of its own). Replicas are fitted one after another into what the earlier
ones left free, each the way its placement group will be reserved (placement.assign_bundles:
STRICT_PACK on one node, else PACK), so `auto` never asks for a replica Ray cannot place. The
replica actors that drive the runtimes reserve nothing (num_cpus=0): only the bundles count.
"""

from __future__ import annotations

from distributed_spec.distributed.config import ParallelConfig
from distributed_spec.distributed.placement import (
    PlacementError,
    Resources,
    assign_bundles,
    check_fits,
    format_plan,
    plan_placement,
)

# A described cluster without a CPU count (parallel.plan_cpus_per_node=null) holds CPU replicas without end.
MAX_REPLICAS = 1024


def fit_replicas(config: ParallelConfig, nodes: list[Resources], limit: int | None = None) -> list[list[int]]:
    """Node index of every bundle, per replica, for as many replicas as `nodes` hold (at most `limit`)."""
    bundles = plan_placement(config).bundles
    free = [dict(node) for node in nodes]
    replicas: list[list[int]] = []
    while len(replicas) < (MAX_REPLICAS if limit is None else limit):
        assignment = assign_bundles(bundles, free, config.placement_strategy)
        if assignment is None:
            break
        for bundle, node in zip(bundles, assignment):
            for key in ("CPU", "GPU"):
                free[node][key] = free[node].get(key, 0.0) - bundle.get(key, 0.0)
        replicas.append(assignment)
    return replicas


def resolve_num_replicas(requested: int | str, config: ParallelConfig, nodes: list[Resources]) -> int:
    """parallel.num_replicas for these nodes: `auto` is as many as fit (at least one must); a number
    is taken as given (Ray queues a replica whose bundles are not free yet)."""
    config = config.resolve(nodes)
    if requested != "auto":
        return int(requested)
    fitted = fit_replicas(config, nodes)
    if not fitted:
        # The one-runtime check names the keys to change.
        check_fits(config, plan_placement(config), nodes)
        raise PlacementError("the cluster holds no replica of the runtime")
    return len(fitted)


def replicas_report(requested: int | str, config: ParallelConfig, nodes: list[Resources]) -> str:
    """The plan of every replica on these nodes (python -m distributed_spec.plan), one runtime's
    plan first; raises PlacementError when not even one fits."""
    config = config.resolve(nodes)
    placement = plan_placement(config)
    first = check_fits(config, placement, nodes)
    count = resolve_num_replicas(requested, config, nodes)
    fitted = fit_replicas(config, nodes, limit=count)
    lines = [
        f"replicas: {count} (parallel.num_replicas={requested}), {len(fitted)} placed at once on these nodes",
        format_plan(config, placement, nodes, first),
    ]
    for index, assignment in enumerate(fitted):
        lines.append(f"  replica {index}: node(s) {', '.join(str(node) for node in sorted(set(assignment)))}")
    if len(fitted) < count:
        lines.append(f"  replicas {len(fitted)}..{count - 1}: wait for free resources (or lower parallel.num_replicas)")
    return "\n".join(lines)
