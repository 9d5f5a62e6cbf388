"""Distributed runtime: Ray actors for the target shard group (DeepSpeed AutoTP) and the draft.

    from distributed_spec.distributed import RayCoordinator
    from distributed_spec.config import ParallelConfig

Layout: config.py (ParallelConfig, the `parallel` keys), cluster.py (the live Ray cluster),
placement.py (placement group), rendezvous.py (process-group formation), wire.py (draft blocks on the
wire), messages.py, target_shard.py (TargetShard actor), draft_worker.py (DraftWorker actor), group.py
(launch/teardown), coordinator.py (the loop).
This package imports verify/, models/ and engine/; they never import it.

The names below are imported on first use: distributed_spec.config imports config.py, which must not
pull torch, Ray and the coordinator in with this package.
"""

from distributed_spec.lazy_exports import lazy_exports

_EXPORTS = {
    "config": ("ParallelConfig",),
    "wire": ("DraftBlock", "WireFormat"),
    "coordinator": ("GroupFailure", "RayCoordinator", "RuntimeTimings"),
}

__all__ = sorted(name for names in _EXPORTS.values() for name in names)
__getattr__ = lazy_exports(__name__, _EXPORTS)
