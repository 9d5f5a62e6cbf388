"""Launch and tear down one runtime: placement group, target shard group, draft actor.

`launch` reserves the bundles, picks the rendezvous (fresh port each time, so a restarted group
never meets the remains of a dead one), starts the actors, fetches the model files once per node
(hub downloads, GGUF conversion; no time limit, as a cold 70B download takes long) and then loads
the models within parallel.load_timeout_s (a `LoadTimeoutError` past it); `teardown` kills
every actor (`ray.kill`, no restart), removes the placement group and deletes the shared-memory
segments the CPU all-reduce leaves in /dev/shm (DeepSpeed never unlinks them); `launch` first
deletes stale segments on the shard nodes (left by a job killed with SIGKILL, shm_segments.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import ray
import torch
from ray.actor import ActorHandle
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from distributed_spec.distributed.config import ParallelConfig
from distributed_spec.distributed.draft_worker import DraftWorker
from distributed_spec.distributed.placement import (
    bundle_strategy,
    cluster_nodes,
    create_placement_group,
    format_plan,
    plan_runtime,
    remove_group,
)
from distributed_spec.distributed.rendezvous import Rendezvous, pick_rendezvous, shard_placements
from distributed_spec.distributed.shm_segments import group_segments, remove_segments, stale_segments
from distributed_spec.distributed.target_shard import TargetShard
from distributed_spec.engine.config import EngineConfig
from distributed_spec.models.pair import check_pair

logger = logging.getLogger(__name__)

ModelFactory = Callable[[], torch.nn.Module]


class LoadTimeoutError(TimeoutError):
    """The actors did not start or load within parallel.load_timeout_s (model files already fetched)."""


@dataclass
class RuntimeActors:
    """Handles of one launched runtime."""

    placement_group: PlacementGroup
    rendezvous: Rendezvous
    # Rank order: shards[0] is rank 0.
    shards: list[ActorHandle]
    draft: ActorHandle | None
    # The draft runs inside shards[0] (parallel.draft_in_shard; `draft` is then None).
    draft_in_shard: bool = False
    # The shards' device, "cpu" or "cuda" (parallel.device=auto decided).
    device: str = "cpu"
    shard_node_ids: list[str] = field(default_factory=list)
    vocab_size: int = 0
    max_context: int | None = None
    # Per rank: what each shard's load reported (parameter bytes, peak resident growth).
    shard_memory: list[dict[str, int]] = field(default_factory=list)
    # Linears model.cpu_prepack packed: per shard in rank order, then the draft's (if it has one).
    packed_linears: list[int] = field(default_factory=list)

    @property
    def all_actors(self) -> list[ActorHandle]:
        return self.shards + ([self.draft] if self.draft is not None else [])


def _get_within_load_timeout(refs: list[ray.ObjectRef], config: ParallelConfig) -> list:
    try:
        return ray.get(refs, timeout=config.load_timeout_s)
    except ray.exceptions.GetTimeoutError as error:
        raise LoadTimeoutError(
            f"the actors did not start and load within parallel.load_timeout_s = {config.load_timeout_s:.0f} s "
            "(model files were already fetched); raise parallel.load_timeout_s. A first run on a CPU "
            "machine also compiles DeepSpeed's shared-memory all-reduce, which takes minutes on busy cores"
        ) from error


@ray.remote(num_cpus=0)
def _fetch_on_node(factories: list[ModelFactory]) -> None:
    for factory in factories:
        factory.fetch()


def fetch_on_nodes(factories: list[ModelFactory | None], node_ids: list[str]) -> None:
    """Run each factory's `fetch` (download, convert) once on every node that will load a model.

    No time limit: a cold download of a large model takes as long as the network needs (its
    progress bars reach the driver's log). Factories without `fetch` (built in code) are skipped.
    """
    fetchable = [factory for factory in factories if factory is not None and hasattr(factory, "fetch")]
    if not fetchable:
        return
    nodes = sorted(set(node_ids))
    logger.info("fetching model files on %d node(s) before loading", len(nodes))
    # Host sync: nothing may load before its files are on its node.
    ray.get(
        [
            _fetch_on_node.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
            ).remote(fetchable)
            for node_id in nodes
        ]
    )


def factory_on_device(factory: ModelFactory, device: str) -> ModelFactory:
    """The factory building its model on `device` (a SpecFactory names its device; others are moved by
    the actor after building)."""
    return factory.on_device(device) if hasattr(factory, "on_device") else factory


def launch(
    config: ParallelConfig,
    engine: EngineConfig,
    target_factory: ModelFactory,
    draft_factory: ModelFactory | None,
    draft_seed: int,
    max_context_len: int | None = None,
) -> RuntimeActors:
    """Start and load every actor; on any failure tear down what was started and re-raise.

    The plan is checked against the cluster's nodes first (placement.PlacementError, one line naming
    the keys, when they cannot hold it). The job's config arrives resolved (ParallelConfig.resolve);
    one still at device=auto (a test's, a script's) is resolved there, for the cluster's nodes.
    """
    nodes = cluster_nodes()
    config, plan, assignment = plan_runtime(config, nodes)
    logger.info("%s", format_plan(config, plan, nodes, assignment))
    group = create_placement_group(config)
    actors = None
    try:
        rendezvous = pick_rendezvous(group, config.tp_size, timeout_s=config.placement_timeout_s)
        shard_class = ray.remote(TargetShard)
        shards = [
            shard_class.options(
                num_cpus=slot.num_cpus,
                num_gpus=slot.num_gpus,
                scheduling_strategy=bundle_strategy(group, slot.bundle),
            ).remote(num_threads=max(1, round(slot.num_cpus)))
            for slot in plan.shards
        ]
        draft = None
        uses_draft = engine.verifier.uses_draft_model
        draft_in_shard = uses_draft and plan.draft_in_shard
        if uses_draft:
            draft_factory = factory_on_device(draft_factory, plan.draft_device)
        if uses_draft and not draft_in_shard:
            slot = plan.draft
            draft = (
                ray.remote(DraftWorker)
                .options(
                    num_cpus=slot.num_cpus,
                    num_gpus=slot.num_gpus,
                    scheduling_strategy=bundle_strategy(group, slot.bundle),
                )
                .remote(num_threads=max(1, round(config.num_cpus_draft)))
            )
        actors = RuntimeActors(
            placement_group=group,
            rendezvous=rendezvous,
            shards=shards,
            draft=draft,
            draft_in_shard=draft_in_shard,
            device=config.device,
        )
        # Host sync: local ranks and LOCAL_SIZE depend on where Ray put each shard.
        node_ids = _get_within_load_timeout([actor.node_id.remote() for actor in actors.all_actors], config)
        actors.shard_node_ids = node_ids[: len(shards)]
        # Segments of groups killed without a teardown would pile up in /dev/shm (RAM) run after run.
        remove_shm_segments(actors.shard_node_ids, None)
        fetch_on_nodes([target_factory], actors.shard_node_ids)
        if uses_draft:
            fetch_on_nodes([draft_factory], node_ids[len(shards) :] or actors.shard_node_ids[:1])
        placements = shard_placements(actors.shard_node_ids)
        load_refs = [
            shard.load.remote(
                target_factory,
                rendezvous,
                placement,
                config.device,
                config.backend,
                config.step_timeout_s,
                engine.scheduling.compact_fraction,
            )
            for shard, placement in zip(shards, placements)
        ]
        if uses_draft:
            # Shard 0 runs its calls in order: its target loads first, then the draft beside it.
            load = draft.load if draft is not None else shards[0].load_draft
            load_refs.append(load.remote(draft_factory, plan.draft_device, engine.scheduling.compact_fraction, draft_seed))
        # Host sync: nothing can be prefilled before every model is loaded.
        loaded = _get_within_load_timeout(load_refs, config)
        actors.shard_memory = [
            {key: info[key] for key in ("parameter_bytes", "load_peak_rss_bytes")} for info in loaded[: len(shards)]
        ]
        actors.packed_linears = [int(info.get("packed_linears", 0)) for info in loaded]
        if any(actors.packed_linears):
            logger.info("model.cpu_prepack: linears packed per shard, then the draft: %s", actors.packed_linears)
        # What the actors built, checked as one pair (models/pair.py): vocabulary, context.
        target_facts = loaded[0]["facts"]
        draft_facts = loaded[-1]["facts"] if uses_draft else None
        actors.vocab_size = int(target_facts.vocab_size)
        actors.max_context = check_pair(target_facts, draft_facts, max_context_len)
        logger.info(
            "runtime up: %d target shard(s) at %s:%d, draft %s",
            config.tp_size,
            rendezvous.master_addr,
            rendezvous.master_port,
            "inside shard 0" if draft_in_shard else "yes" if draft else "no",
        )
        return actors
    except BaseException:
        if actors is not None:
            teardown(actors)
        else:
            remove_group(group)
        raise


def teardown(actors: RuntimeActors) -> None:
    """Kill every actor, delete the CPU all-reduce segments, release the placement group."""
    for actor in actors.all_actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception as error:  # noqa: BLE001 - an already dead actor is fine
            logger.debug("ray.kill failed: %s", error)
    remove_shm_segments(actors.shard_node_ids, actors.rendezvous)
    remove_group(actors.placement_group)


def remove_shm_segments(node_ids: list[str], rendezvous: Rendezvous | None) -> None:
    """On each node: delete the CPU all-reduce segments of `rendezvous`'s group, or with None the
    stale ones (that no process holds). A failure is logged: the segments only cost memory."""
    for node_id in sorted(set(node_ids)):
        try:
            removed = ray.get(
                _remove_shm_segments.options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
                ).remote(rendezvous),
                timeout=30,
            )
        except Exception as error:  # noqa: BLE001 - teardown and launch go on
            logger.warning("could not remove /dev/shm segments on node %s: %s", node_id, error)
            continue
        if removed and rendezvous is None:
            logger.info("removed %d stale /dev/shm all-reduce segment(s) on node %s", removed, node_id)


@ray.remote(num_cpus=0)
def _remove_shm_segments(rendezvous: Rendezvous | None) -> int:
    if rendezvous is None:
        return remove_segments(stale_segments())
    return remove_segments(group_segments(rendezvous.master_addr, rendezvous.master_port))
