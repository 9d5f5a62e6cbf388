"""One replica of the job (a Ray actor): its own RayGenerator, i.e. its own placement group, target
shard group and draft actor, driven by the engine's scheduler loop, fed from the shared work queue.

`run(work, results, epoch)` admits records from the work queue as its batch has room (continuous
batching: a finished row's place goes to the next queued record) and answers through the results
queue: TAKEN when it takes a record (before decoding it), DONE with the result when it finishes. Each
message carries (epoch, replica index, incarnation) so the driver can drop stale ones. With rows
running and the queue empty the scheduler is told NOT_READY (decode on, ask again next step); with
no rows the replica blocks on the queue. A stop message ends the run once the rows in flight are done.
A fault of the shard group is handled inside (RayCoordinator relaunches it, the rows are re-admitted);
only a failure beyond parallel.max_restarts (GroupFailure) or the actor's own death reaches the driver.
"""

from __future__ import annotations

import dataclasses
import pickle
import threading
from collections.abc import Iterator
from typing import Any

from ray.util.queue import Empty

from distributed_spec.engine.scheduler import NOT_READY

# Message kinds on the results queue.
TAKEN = "taken"
DONE = "done"




def stop_message(epoch: int) -> tuple[int, None, None]:
    """Put once per running replica when the driver has nothing left for this epoch."""
    return (epoch, None, None)


# Payloads cross the queues pickled here: the queue actors then never unpickle (and so never import)
# the engine's classes, which costs seconds on a queue's first message.
pack = pickle.dumps
unpack = pickle.loads


@dataclasses.dataclass(frozen=True)
class GroupHandle:
    """What the driver needs to clean up after a replica that died: a placement group outlives the
    actor that created it, and DeepSpeed's CPU all-reduce segments in /dev/shm outlive everything."""

    placement_group: Any
    rendezvous: Any
    node_ids: tuple[str, ...]


class ReplicaWorker:
    """The actor class (jobs/replicas.py starts it with num_cpus=0 and max_concurrency=2, so that
    `close` and `shards` answer while `run` decodes)."""

    def __init__(self, job, index: int, incarnation: int) -> None:
        self.job = job
        self.index = index
        self.incarnation = incarnation
        self.generator = None
        # start() runs once, whichever call comes first (a relaunched replica gets run() at once).
        self._start_lock = threading.Lock()

    def start(self) -> dict[str, Any]:
        """Launch this replica's runtime (placement group, shards, draft) and load the models."""
        with self._start_lock:
            if self.generator is None:
                import torch

                from distributed_spec.jobs.ray_generator import RayGenerator

                # The scheduler's own tensors are tiny; the models' threads are the shards' and the draft's.
                torch.set_num_threads(1)
                self.generator = RayGenerator(self.job)
        return {"max_context_len": self.generator.max_context_len, "group": self._group()}

    def _group(self) -> GroupHandle | None:
        actors = self.generator.coordinator.actors
        if actors is None:
            return None
        return GroupHandle(actors.placement_group, actors.rendezvous, tuple(actors.shard_node_ids))

    def reconfigure(self, job) -> None:
        self.job = job
        self.generator.reconfigure(job)

    def shards(self) -> list:
        """Handles of the target shard actors (tests kill one)."""
        actors = self.generator.coordinator.actors if self.generator is not None else None
        return list(actors.shards) if actors is not None else []

    def close(self) -> None:
        if self.generator is not None:
            self.generator.close()

    def run(self, work, results, epoch: int):
        """Decode records from `work` until a stop message of this epoch; returns the run's RunStats."""
        from distributed_spec.engine.speculative import to_result
        from distributed_spec.jobs.scheduler_generator import request_for_item

        self.start()
        generator = self.generator
        tag = (epoch, self.index, self.incarnation)
        scheduler = generator.backend.scheduler()
        vocab_size = generator.backend.vocab_size
        num_in_batch = 0

        def requests() -> Iterator[Any]:
            nonlocal num_in_batch
            while True:
                if num_in_batch:
                    try:
                        message = work.get(block=False)
                    except Empty:
                        yield NOT_READY
                        continue
                else:
                    message = work.get(block=True)
                message_epoch, key, item = message
                if message_epoch != epoch:
                    continue  # left over from an abandoned stream
                if key is None:
                    return  # a stop
                # Reported before decoding starts, so the driver knows who holds it if this replica dies.
                results.put((*tag, TAKEN, key, None))
                num_in_batch += 1
                yield request_for_item(unpack(item), generator._config, vocab_size, generator.max_context_len)

        for request in scheduler.run(requests()):
            num_in_batch -= 1
            # Stats so far and the current group (a relaunched shard group is a new one).
            payload = (to_result(request), scheduler.stats, self._group())
            results.put((*tag, DONE, request.key, pack(payload)))
        return scheduler.stats
