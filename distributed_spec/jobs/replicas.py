"""`parallel.num_replicas` > 1 (or auto): data-parallel replicas of the Ray runtime behind the job's
one Generator (docs/distributed.md, Replicas).

Each replica is a Ray actor (jobs/replica_worker.py) that owns a whole runtime (its placement group,
rendezvous, AutoTP shard group and draft actor) and the engine's scheduler loop. Records go out
through one `ray.util.queue.Queue`: a replica takes the next record whenever its batch has room, so a
faster replica takes more, and continuous batching keeps every batch full. Replicas answer through a
second queue; only this driver writes output. Exactly once (jobs/replica_ledger.py): each result is
accepted once; when a replica dies (its actor, or its shard group beyond its own restarts) the records
it held go back into the queue for the others and the replica is relaunched, up to
parallel.max_restarts times per replica. A record's tokens depend only on (sampling.seed, its id), so
which replica decodes it, and how often, does not change its completion.

An ordinary error in a replica (bad numbers, out of memory) is the job's to handle as for one
runtime: the pool stops handing out records, lets the other replicas finish theirs, then raises it;
the records the failing replica held are then the job's in-flight records (retried one by one).
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import math
import time
from collections.abc import Iterable, Iterator
from typing import Any

import ray
from ray.util.placement_group import remove_placement_group
from ray.util.queue import Empty, Queue

from distributed_spec.config import ConfigError, JobConfig
from distributed_spec.distributed.coordinator import FAULT_ERRORS, GroupFailure
from distributed_spec.distributed.group import remove_shm_segments
from distributed_spec.distributed.placement import cluster_nodes, local_num_cpus
from distributed_spec.distributed.replica_placement import resolve_num_replicas
from distributed_spec.engine.config import RunStats
from distributed_spec.jobs.generator import GenerationItem
from distributed_spec.jobs.replica_ledger import WorkLedger
from distributed_spec.jobs.replica_worker import TAKEN, ReplicaWorker, pack, stop_message, unpack
from distributed_spec.models.tokenizers import load_tokenizer

logger = logging.getLogger(__name__)

# A replica whose run ended with one of these died (or its group did, past its own restarts).
REPLICA_FAULTS = (*FAULT_ERRORS, GroupFailure, ray.exceptions.WorkerCrashedError)


@dataclasses.dataclass
class Replica:
    index: int
    incarnation: int
    actor: Any
    # The run of the current stream; None when not running.
    run_ref: Any = None
    # The replica's shard group as last reported (GroupHandle), released here if the replica dies.
    group: Any = None
    alive: bool = True

    @property
    def slot(self) -> tuple[int, int]:
        return (self.index, self.incarnation)


class ReplicaPool:
    """The job's Generator over parallel.num_replicas replicas; see the module docstring."""

    def __init__(self, job: JobConfig) -> None:
        # Resolved once here; every replica gets this job, so none decides the device again.
        parallel = job.parallel.resolve()
        self.job = job = dataclasses.replace(job, parallel=parallel)
        self._started_ray = False
        self.replicas: list[Replica] = []
        self.work = self.results = None
        atexit.register(self.close)
        if not ray.is_initialized():
            # A cluster brings its own resources; a Ray started here gets enough logical CPUs for
            # the replicas asked for (auto: the machine's CPUs).
            local = {}
            if not parallel.ray_address:
                count = 1 if parallel.num_replicas == "auto" else parallel.num_replicas
                local = {"num_cpus": max(local_num_cpus(parallel), math.ceil(count * _replica_cpus(parallel)))}
            ray.init(address=parallel.ray_address, include_dashboard=False, log_to_driver=True, **local)
            self._started_ray = True
        try:
            self.num_replicas = resolve_num_replicas(parallel.num_replicas, parallel, cluster_nodes())
        except ValueError as err:
            self.close()
            raise ConfigError(f"parallel.num_replicas: {err}") from err
        self.max_restarts = parallel.max_restarts
        self.tokenizer = load_tokenizer(job.model)
        # The queue actors hold no CPU: they must not wait for resources the replicas' bundles took.
        self.work = Queue(actor_options={"num_cpus": 0})
        self.results = Queue(actor_options={"num_cpus": 0})
        self._dead: set[tuple[int, int]] = set()
        self._epoch = 0
        self._stats = RunStats()
        # (index, incarnation) -> the RunStats of its run in the current stream.
        self._snapshots: dict[tuple[int, int], RunStats] = {}
        self.restarts = [0] * self.num_replicas
        self._tokens = [0] * self.num_replicas
        self._records = [0] * self.num_replicas
        self._group_restarts_closed = [0.0] * self.num_replicas
        self._clock_start: float | None = None
        self.replicas = [self._launch(index, 0) for index in range(self.num_replicas)]
        logger.info("starting %d replica(s) of the runtime", self.num_replicas)
        try:
            infos = ray.get([replica.actor.start.remote() for replica in self.replicas])
        except ray.exceptions.RayTaskError as err:
            self.close()
            cause = getattr(err, "cause", None)
            if isinstance(cause, (ConfigError, ValueError)):
                raise ConfigError(str(cause)) from None
            raise
        except BaseException:
            self.close()
            raise
        for replica, info in zip(self.replicas, infos):
            replica.group = info["group"]
        self.max_context_len = min(info["max_context_len"] for info in infos)
        logger.info("%d replica(s) up", self.num_replicas)

    # ---- the Generator interface -------------------------------------------------------------

    @property
    def stats(self) -> RunStats:
        return self._stats

    def reconfigure(self, job: JobConfig) -> None:
        """Later streams decode with job's verifier, engine and sampling settings (same models)."""
        self.job = job = dataclasses.replace(job, parallel=self.job.parallel)
        ray.get([replica.actor.reconfigure.remote(job) for replica in self._live()])

    def stream(self, items: Iterable[GenerationItem]) -> Iterator[tuple[Any, Any]]:
        """Every item through the replicas; yields (handle, result) once per item as each finishes."""
        completed = False
        try:
            yield from self._stream(items)
            completed = True
        finally:
            if not completed:
                self._abandon()

    def _stream(self, items: Iterable[GenerationItem]) -> Iterator[tuple[Any, Any]]:
        if not self._live():
            raise GroupFailure("every replica failed past parallel.max_restarts; fix the cause and rerun to resume")
        self._epoch += 1
        epoch = self._epoch
        if self._clock_start is None:
            self._clock_start = time.perf_counter()
        self._close_snapshots()
        _drain(self.work)
        _drain(self.results)
        ledger = WorkLedger()
        for replica in self._live():
            replica.run_ref = replica.actor.run.remote(self.work, self.results, epoch)
        # Enough queued that a replica never waits for the driver, few enough to stay responsive.
        depth = 2 * self.num_replicas * self.job.data.batch_size
        source = iter(items)
        exhausted = False
        failure: BaseException | None = None
        failed: set[tuple[int, int]] = set()
        while True:
            while not exhausted and failure is None and ledger.num_outstanding < depth:
                item = next(source, None)
                if item is None:
                    exhausted = True
                    break
                self._put(ledger, epoch, ledger.add(item))
            running = [replica for replica in self.replicas if replica.run_ref is not None]
            # Done: nothing outstanding (or, after a failure, only what the failed replicas hold).
            if (exhausted or failure is not None) and all(
                ledger.holders.get(key) in failed for key in ledger.outstanding
            ):
                break
            if not running:
                break
            yield from self._collect(ledger, epoch, timeout_s=0.1)
            error = self._check_runs(ledger, epoch, feeding=True)
            if error is not None:
                failure = failure or error[1]
                failed.add(error[0])
        # Every running replica gets a stop message (after anything still queued) and ends its run.
        for replica in self.replicas:
            if replica.run_ref is not None:
                self._stop(ledger, epoch)
        while any(replica.run_ref is not None for replica in self.replicas):
            yield from self._collect(ledger, epoch, timeout_s=0.1)
            self._check_runs(ledger, epoch, feeding=False)
        yield from self._collect(ledger, epoch, timeout_s=0.0)
        if failure is not None:
            raise failure

    def replica_metrics(self) -> dict[str, float]:
        """Per replica: tokens/s over the job's wall clock, restarts (relaunches of the replica plus
        restarts of its shard group inside it) and records finished."""
        elapsed = time.perf_counter() - self._clock_start if self._clock_start is not None else 0.0
        metrics: dict[str, float] = {"replicas/live": float(len(self._live()))}
        for index in range(self.num_replicas):
            group_restarts = self._group_restarts_closed[index] + sum(
                stats.extra.get("num_restarts", 0.0) for slot, stats in self._snapshots.items() if slot[0] == index
            )
            metrics[f"replica/{index}/tokens_per_s"] = self._tokens[index] / elapsed if elapsed > 0 else 0.0
            metrics[f"replica/{index}/restarts"] = float(self.restarts[index] + group_restarts)
            metrics[f"replica/{index}/records"] = float(self._records[index])
        return metrics

    def shards(self, index: int) -> list:
        """Target shard actors of replica `index` (tests kill one)."""
        return ray.get(self.replicas[index].actor.shards.remote())

    def close(self) -> None:
        """Stop every replica (its runtime first), the queues, and Ray if this pool started it."""
        for replica in self.replicas:
            self._kill(replica)
        self.replicas = []
        for queue in (self.work, self.results):
            if queue is not None:
                try:
                    ray.kill(queue.actor)
                except Exception:  # noqa: BLE001 - already gone
                    pass
        self.work = self.results = None
        if self._started_ray and ray.is_initialized():
            ray.shutdown()
        self._started_ray = False
        atexit.unregister(self.close)

    # ---- inside ------------------------------------------------------------------------------

    def _live(self) -> list[Replica]:
        return [replica for replica in self.replicas if replica.alive]

    def _launch(self, index: int, incarnation: int) -> Replica:
        actor = (
            ray.remote(ReplicaWorker)
            # No CPU of its own (its shards and draft reserve theirs); start/run/close concurrently.
            .options(num_cpus=0, max_concurrency=3)
            .remote(self.job, index, incarnation)
        )
        return Replica(index, incarnation, actor)

    def _put(self, ledger: WorkLedger, epoch: int, key: int) -> None:
        wire = dataclasses.replace(ledger.outstanding[key], handle=key)
        self.work.put((epoch, key, pack(wire)))
        ledger.put(key)

    def _stop(self, ledger: WorkLedger, epoch: int) -> None:
        self.work.put(stop_message(epoch))
        ledger.put(None)

    def _collect(self, ledger: WorkLedger, epoch: int, timeout_s: float) -> Iterator[tuple[Any, Any]]:
        """Apply the replicas' messages; yield each record's result the first time it arrives."""
        try:
            messages = [self.results.get(block=True, timeout=timeout_s) if timeout_s > 0 else self.results.get_nowait()]
        except Empty:
            return
        num_more = self.results.qsize()
        if num_more:
            messages += self.results.get_nowait_batch(num_more)
        for message_epoch, index, incarnation, kind, key, payload in messages:
            if message_epoch != epoch:
                continue
            slot = (index, incarnation)
            if kind == TAKEN:
                if slot not in self._dead:
                    ledger.taken(key, slot)
                continue
            result, stats, group = unpack(payload)
            self._snapshots[slot] = stats
            self._tokens[index] += len(result.token_ids)
            replica = self.replicas[index]
            if replica.slot == slot and group is not None:
                replica.group = group
            item = ledger.done(key)
            if item is not None:
                self._records[index] += 1
                self._merge_stats()
                yield item.handle, result

    def _merge_stats(self) -> None:
        merged = RunStats()
        for stats in self._snapshots.values():
            merged = merged.merge(stats)
        self._stats = merged

    def _close_snapshots(self) -> None:
        for (index, _), stats in self._snapshots.items():
            self._group_restarts_closed[index] += stats.extra.get("num_restarts", 0.0)
        self._snapshots = {}
        self._stats = RunStats()

    def _check_runs(self, ledger: WorkLedger, epoch: int, feeding: bool) -> tuple[tuple[int, int], BaseException] | None:
        """Handle runs that ended: a replica that died is replaced (its records queued again); an
        ordinary error is returned as (slot, error)."""
        refs = [replica.run_ref for replica in self.replicas if replica.run_ref is not None]
        if not refs:
            return None
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        failure = None
        for replica in [replica for replica in self.replicas if replica.run_ref in ready]:
            ref, replica.run_ref = replica.run_ref, None
            try:
                self._snapshots[replica.slot] = ray.get(ref)
                self._merge_stats()
            except ray.exceptions.RayTaskError as err:
                cause = getattr(err, "cause", None)
                if isinstance(cause, REPLICA_FAULTS):
                    self._replace(replica, ledger, epoch, feeding, err)
                elif failure is None:
                    logger.warning("replica %d failed: %r", replica.index, cause)
                    failure = (replica.slot, err.as_instanceof_cause())
            except REPLICA_FAULTS as err:
                self._replace(replica, ledger, epoch, feeding, err)
        return failure

    def _replace(self, replica: Replica, ledger: WorkLedger, epoch: int, feeding: bool, error: BaseException) -> None:
        """The replica died: queue its records again for the others and relaunch it (up to max_restarts)."""
        self._dead.add(replica.slot)
        held = len(ledger.held_by(replica.slot))
        self._kill(replica)
        num_taken = len(ledger.puts) - self.work.qsize()
        lost = ledger.lost(self._dead, num_taken)
        for key in lost:
            self._put(ledger, epoch, key)
        index = replica.index
        self.restarts[index] += 1
        logger.warning(
            "replica %d died (%s); %d record(s) it held (%d reported) queued again for the others",
            index,
            f"{type(error).__name__}: {error}".splitlines()[0],
            len(lost),
            held,
        )
        if self.restarts[index] > self.max_restarts:
            replica.alive = False
            logger.error("replica %d failed %d times: left out (parallel.max_restarts)", index, self.restarts[index])
            if not self._live():
                raise GroupFailure(
                    f"every replica failed more than parallel.max_restarts={self.max_restarts} times "
                    f"(last: {error!r}); fix the cause and rerun to resume"
                ) from error
            return
        fresh = self._launch(index, replica.incarnation + 1)
        self.replicas[index] = fresh
        if feeding:
            # run() loads the runtime first; meanwhile the other replicas take the queued records.
            fresh.run_ref = fresh.actor.run.remote(self.work, self.results, epoch)

    def _abandon(self) -> None:
        """A stream left early (an error, the caller stopped reading): end every run before the next."""
        running = [replica for replica in self.replicas if replica.run_ref is not None]
        if not running:
            return
        _drain(self.work)
        for _ in running:
            self.work.put(stop_message(self._epoch))
        timeout_s = self.job.parallel.step_timeout_s * 4
        ready, _ = ray.wait([replica.run_ref for replica in running], num_returns=len(running), timeout=timeout_s)
        for replica in running:
            if replica.run_ref not in ready:
                logger.warning("replica %d did not stop within %.0f s; relaunching it", replica.index, timeout_s)
                self._kill(replica)
                self.replicas[replica.index] = self._launch(replica.index, replica.incarnation + 1)
            replica.run_ref = None

    def _kill(self, replica: Replica) -> None:
        """Tear the replica's runtime down (its actor may be dead already) and kill the actor."""
        try:
            ray.get(replica.actor.close.remote(), timeout=60)
        except Exception:  # noqa: BLE001 - a dead replica cannot close itself
            pass
        try:
            ray.kill(replica.actor, no_restart=True)
        except Exception:  # noqa: BLE001
            pass
        if replica.group is not None:
            release_group(replica.group)
            replica.group = None


def release_group(group) -> None:
    """Remove a dead replica's placement group and /dev/shm segments (its shard and draft actors die
    with their owner; these do not). Both are gone already when the replica closed itself."""
    try:
        remove_placement_group(group.placement_group)
    except Exception:  # noqa: BLE001 - removed already
        pass
    remove_shm_segments(list(group.node_ids), group.rendezvous)


def _replica_cpus(runtime) -> float:
    from distributed_spec.distributed.placement import runtime_bundles

    cpu_config = dataclasses.replace(runtime, device="cpu", backend="gloo")
    return sum(bundle.get("CPU", 0.0) for bundle in runtime_bundles(cpu_config))


def _drain(queue: Queue) -> None:
    """Drop what an abandoned stream left in a queue."""
    size = queue.qsize()
    if size:
        queue.get_nowait_batch(size)
