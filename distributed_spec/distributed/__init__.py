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

__all__ = ["DraftBlock", "GroupFailure", "ParallelConfig", "RayCoordinator", "RuntimeTimings", "WireFormat"]


def __getattr__(name: str):
    if name == "ParallelConfig":
        from distributed_spec.distributed import config as module
    elif name in ("DraftBlock", "WireFormat"):
        from distributed_spec.distributed import wire as module
    elif name in ("GroupFailure", "RayCoordinator", "RuntimeTimings"):
        from distributed_spec.distributed import coordinator as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(module, name)
