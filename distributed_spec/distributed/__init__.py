"""Distributed runtime: Ray actors for the target shard group (DeepSpeed AutoTP) and the draft.

    from distributed_spec.distributed import RayCoordinator, RayRuntimeConfig

Layout: config.py (RayRuntimeConfig), placement.py (placement group), rendezvous.py (process-group
formation), wire.py (draft blocks on the wire), messages.py, target_shard.py (TargetShard actor),
draft_worker.py (DraftWorker actor), group.py (launch/teardown), coordinator.py (the loop).
This package imports verify/, models/ and engine/; they never import it.
"""

from distributed_spec.distributed.config import RayRuntimeConfig
from distributed_spec.distributed.coordinator import GroupFailure, RayCoordinator, RuntimeTimings
from distributed_spec.distributed.wire import DraftBlock, WireFormat

__all__ = ["DraftBlock", "GroupFailure", "RayCoordinator", "RayRuntimeConfig", "RuntimeTimings", "WireFormat"]
