"""Where and how the models run (the Hydra group `parallel`, conf/parallel/*.yaml): one dataclass,
validated once, with device and backend resolved once.

Every field is a key of conf/parallel/; error messages name the key (`parallel.*`). The job resolves
`auto` once (`ParallelConfig.resolve`, called by the job's generator) and hands the resolved copy to
everything downstream: the local engine, the Ray coordinator, its placement and its actors. This
module imports neither torch nor Ray at import time (distributed_spec.config builds the job from it).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from distributed_spec.errors import require

logger = logging.getLogger(__name__)

RUNTIMES = ("local", "ray")
DEVICES = ("auto", "cpu", "cuda")
BACKENDS = ("auto", "gloo", "nccl")
DRAFT_DEVICES = ("auto", "cpu")
# "auto": bfloat16 on cuda, float32 on the CPU (wire.resolve_wire_dtype).
WIRE_DTYPES = ("auto", "float32", "bfloat16", "float16")
# parallel.verify: `gather` computes the full target logits on every rank and verifies on rank 0;
# `vocab_parallel` computes each rank's vocabulary slice only and verifies inside the group
# (verify_parallel/, docs/design.md section 4).
VERIFY_MODES = ("gather", "vocab_parallel")
PLACEMENT_STRATEGIES = ("STRICT_PACK", "PACK", "SPREAD", "STRICT_SPREAD")



def device_for(nodes: list[dict[str, float]]) -> str:
    """parallel.device=auto on a Ray cluster: cuda when its nodes have GPUs (the driver's do not count)."""
    return "cuda" if sum(node.get("GPU", 0.0) for node in nodes) > 0 else "cpu"


@dataclass
class ParallelConfig:
    """Where the models run: one process (`local`), or Ray actors (`ray`: target shards + a draft)."""

    # `local`: the single-process engine; `ray`: Ray actors with a tensor-parallel target.
    runtime: str = "local"
    # Tensor-parallel ranks of the target, one Ray actor each (runtime=ray only; local runs one process).
    tp_size: int = 1
    # `cpu`, `cuda` (one GPU per shard) or `auto`: cuda when a GPU is visible here, or, for runtime=ray
    # joining a cluster (ray_address), when the cluster has GPUs (see resolve).
    device: str = "auto"
    # Collective backend of the target's shard group: gloo, nccl (cuda only) or auto (nccl on cuda).
    backend: str = "auto"
    # Address of a Ray cluster ("auto" joins the running one, "ray://..."); None starts Ray in-process.
    ray_address: str | None = None
    # CPU threads per process for torch; null leaves torch's default.
    num_threads: int | None = None
    # runtime=ray: independent replicas of the whole runtime (shard group + draft), each taking
    # records from one work queue (jobs/replicas.py); `auto`: as many as the cluster's resources hold.
    # Each replica's threads: num_cpus_per_shard / num_cpus_draft (rounded, at least 1).
    num_replicas: Any = 1
    # The keys below are read by runtime=ray only.
    # Device of the draft: "auto" (the shards' device) or "cpu" (its own CPU bundle, no GPU).
    draft_device: str = "auto"
    # Run the draft inside target shard 0's actor instead of an actor of its own: a step is then one
    # Ray call per shard, and q never leaves rank 0's process (the other ranks get the block's ids
    # by broadcast inside the group). The draft runs between the shard's forwards on the shard's
    # device; at tp_size 1 its CPUs (num_cpus_draft) join the shard's bundle and threads;
    # num_gpus_draft is not read. Not with parallel.overlap, nor with verify=vocab_parallel at
    # tp_size > 1. `auto`: inside at tp_size 1 without overlap (where it was measured to pay:
    # docs/RESULTS.md, "The draft inside the shard"), an actor of its own otherwise; settled by
    # `resolve`.
    draft_in_shard: bool | str = "auto"
    # Logical CPUs reserved per shard bundle (fractions are fine; Ray does not pin cores).
    num_cpus_per_shard: float = 1.0
    # Logical CPUs reserved for the draft.
    num_cpus_draft: float = 1.0
    # GPUs of the draft on cuda: below 1 it shares shard 0's GPU (same bundle; shard 0 takes the rest),
    # so tp_size shards and the draft fit on tp_size GPUs; 1 or more gives it a bundle of its own.
    num_gpus_draft: float = 0.1
    # Placement strategy tried first; STRICT_PACK falls back to PACK when one node cannot hold all.
    placement_strategy: str = "STRICT_PACK"
    # Seconds to wait for the placement group before falling back (or failing).
    placement_timeout_s: float = 30.0
    # Precision of the draft probabilities on the wire; the draft samples from the same rounded q.
    # auto: bfloat16 on cuda (half the bytes, exact), float32 on the CPU.
    wire_dtype: str = "auto"
    # Send only the draft's top-k probabilities (0 = dense). Exact because the draft then samples
    # from its own top-k: q is exactly that sparse distribution.
    wire_top_k: int = 0
    # Draft the next block while the shards verify the current one (kept only when the whole block
    # is accepted and the bonus token equals the draft's guess for it).
    overlap: bool = False
    # How the shard group verifies: `gather` (full logits per rank, rank 0 verifies) or
    # `vocab_parallel` (each rank its vocabulary slice of the LM head and of q; parallel=ray only).
    # A per-batch setting: it is sent with every `begin`.
    verify: str = "gather"
    # Seconds a load call, or a batch's first iteration (it also processes the prompts), may take
    # (a load includes the one-time JIT build of the CPU all-reduce).
    load_timeout_s: float = 600.0
    # Seconds one iteration may take before the coordinator declares the group dead.
    step_timeout_s: float = 60.0
    # How many times a dead group is rebuilt before generate() gives up.
    max_restarts: int = 3
    # Print the placement plan against the cluster (or the nodes described below) and load nothing
    # (`python -m distributed_spec.plan` always does).
    plan_only: bool = False
    # A cluster to plan for instead of the live one: plan_num_nodes nodes of plan_gpus_per_node GPUs
    # and plan_cpus_per_node CPUs (null CPUs: as many as the bundles need). null GPUs: the live cluster.
    plan_num_nodes: int = 1
    plan_gpus_per_node: int | None = None
    plan_cpus_per_node: float | None = None

    def __post_init__(self) -> None:
        require(
            self.runtime in RUNTIMES,
            f"parallel.runtime={self.runtime!r} is unknown; choose one of {RUNTIMES}",
        )
        require(self.tp_size >= 1, f"parallel.tp_size must be >= 1, got {self.tp_size}")
        require(
            self.device in DEVICES, f"parallel.device={self.device!r} is unknown; choose one of {DEVICES}"
        )
        require(
            self.backend in BACKENDS,
            f"parallel.backend={self.backend!r} is unknown; choose one of {BACKENDS}",
        )
        require(
            not (self.runtime == "local" and self.tp_size > 1),
            f"parallel.runtime=local runs one process, so parallel.tp_size={self.tp_size} is impossible; "
            "set parallel.runtime=ray (or parallel.tp_size=1)",
        )
        require(
            not (self.backend == "nccl" and self.device == "cpu"),
            "parallel.backend=nccl needs parallel.device=cuda; use parallel.backend=gloo on the CPU",
        )
        require(
            self.num_threads is None or self.num_threads >= 1,
            f"parallel.num_threads must be >= 1 or null, got {self.num_threads}",
        )
        require(
            self.num_replicas == "auto" or (type(self.num_replicas) is int and self.num_replicas >= 1),
            f"parallel.num_replicas must be an integer >= 1 or auto, got {self.num_replicas!r}",
        )
        require(
            self.runtime == "ray" or self.num_replicas == 1,
            f"parallel.num_replicas={self.num_replicas} needs parallel=ray (replicas are Ray actors)",
        )
        require(
            self.draft_in_shard in (True, False, "auto"),
            f"parallel.draft_in_shard must be true, false or auto, got {self.draft_in_shard!r}",
        )
        require(
            self.draft_device in DRAFT_DEVICES,
            f"parallel.draft_device must be one of {DRAFT_DEVICES}, got {self.draft_device!r}",
        )
        # Device auto is checked as the backend implies; resolve() checks the settled copy again.
        gpu = self.device == "cuda" or (self.device == "auto" and self.backend == "nccl")
        require(
            not (
                self.runtime == "ray" and gpu and self.draft_device == "auto" and self.num_gpus_draft <= 0
                and not self.draft_runs_in_shard
            ),
            f"parallel.num_gpus_draft={self.num_gpus_draft} leaves the draft without a GPU on parallel.device=cuda; "
            "set parallel.num_gpus_draft to a fraction (e.g. 0.1: it shares shard 0's GPU) or parallel.draft_device=cpu",
        )
        require(
            self.num_gpus_draft <= 1 or self.num_gpus_draft == int(self.num_gpus_draft),
            f"parallel.num_gpus_draft={self.num_gpus_draft}: above 1 Ray needs a whole number of GPUs",
        )
        require(
            self.plan_num_nodes >= 1 and (self.plan_gpus_per_node is None or self.plan_gpus_per_node >= 0),
            "parallel.plan_num_nodes must be >= 1 and parallel.plan_gpus_per_node >= 0 or null",
        )
        require(
            self.placement_strategy in PLACEMENT_STRATEGIES,
            f"parallel.placement_strategy must be one of {PLACEMENT_STRATEGIES}, got {self.placement_strategy!r}",
        )
        require(
            self.wire_dtype in WIRE_DTYPES,
            f"parallel.wire_dtype must be one of {WIRE_DTYPES}, got {self.wire_dtype!r}",
        )
        require(self.wire_top_k >= 0, f"parallel.wire_top_k must be >= 0 (0 = dense), got {self.wire_top_k}")
        require(
            self.num_cpus_per_shard > 0 and self.num_cpus_draft > 0,
            "parallel.num_cpus_per_shard and parallel.num_cpus_draft must be > 0",
        )
        require(
            self.step_timeout_s > 0 and self.load_timeout_s > 0,
            "parallel.step_timeout_s and parallel.load_timeout_s must be > 0",
        )
        require(
            not (self.draft_in_shard is True and self.verify == "vocab_parallel" and self.tp_size > 1),
            "parallel.draft_in_shard=true shares the drafted block's ids with the other shards, not "
            "their slices of q that parallel.verify=vocab_parallel needs; set parallel.verify=gather "
            "or parallel.draft_in_shard=false",
        )
        require(
            not (self.draft_in_shard is True and self.overlap),
            "parallel.overlap=true drafts the next block while the shards verify, which a draft inside "
            "the shard's own process cannot do; set parallel.overlap=false or parallel.draft_in_shard=false",
        )
        require(self.max_restarts >= 0, f"parallel.max_restarts must be >= 0, got {self.max_restarts}")
        require(
            self.verify in VERIFY_MODES,
            f"parallel.verify={self.verify!r} is unknown; choose one of {VERIFY_MODES}",
        )
        require(
            self.runtime == "ray" or self.verify == "gather",
            f"parallel.verify={self.verify} shards the vocabulary over target processes, and "
            "parallel.runtime=local runs one; set parallel=ray (or parallel.verify=gather)",
        )

    def require_paths_supported(self, num_paths: int) -> None:
        """Raise ConfigError unless verifier.num_paths = num_paths runs with these settings.

        K > 1 paths need parallel.verify=gather: rank 0 verifies the K paths of a row on the full
        target logits (verify_paths, docs/design.md section 7), and that rule has no vocabulary-
        parallel form: each stage's residual T' and its prefix tests between paths need the whole
        distribution, where verify_parallel's collectives cover one path's block per row."""
        require(
            num_paths == 1 or self.verify == "gather",
            f"verifier.num_paths={num_paths} verifies its paths on the full logits and does not run with "
            f"parallel.verify={self.verify}; set parallel.verify=gather or verifier.num_paths=1",
        )

    # ---- device and backend, resolved once ------------------------------------------------------

    @property
    def is_resolved(self) -> bool:
        return self.device != "auto" and self.backend != "auto" and self.draft_in_shard != "auto"

    @property
    def draft_runs_in_shard(self) -> bool:
        """draft_in_shard with `auto` settled: inside shard 0 at tp_size 1 without overlap. At
        tp_size 2 on gloo it measured nothing either way, and the draft actor is the tested default
        there (docs/RESULTS.md)."""
        if self.draft_in_shard == "auto":
            return self.tp_size == 1 and not self.overlap
        return bool(self.draft_in_shard)

    def resolve(self, nodes: list[dict[str, float]] | None = None) -> ParallelConfig:
        """A copy with device in {cpu, cuda} and backend in {gloo, nccl} (itself when already so).

        device=auto: cuda when `nodes` (a Ray cluster's CPU/GPU totals) have GPUs; without `nodes`,
        runtime=ray with a ray_address asks that cluster (joining it: the driver of a job submitted to
        a GPU cluster may have no GPU), anything else this machine. backend=auto: nccl on cuda, gloo
        on cpu. draft_in_shard=auto becomes `draft_runs_in_shard`. The copy is checked again (e.g.
        backend=nccl where auto became cpu).
        """
        if self.is_resolved:
            return self
        device = self.device
        if device == "auto":
            if nodes is None and self.runtime == "ray" and self.ray_address is not None:
                from distributed_spec.distributed.cluster import cluster_nodes, connect

                connect(self.ray_address)
                nodes = cluster_nodes()
            if nodes is not None:
                device = device_for(nodes)
                gpus = sum(node.get("GPU", 0.0) for node in nodes)
                logger.info("parallel.device=auto: the Ray cluster has %g GPUs: %s", gpus, device)
            else:
                import torch

                device = "cuda" if torch.cuda.is_available() else "cpu"
        backend = self.backend if self.backend != "auto" else ("nccl" if device == "cuda" else "gloo")
        return dataclasses.replace(self, device=device, backend=backend, draft_in_shard=self.draft_runs_in_shard)

    # ---- derived (on a resolved config) ---------------------------------------------------------

    @property
    def num_gpus_per_shard(self) -> float:
        """One device per shard on GPUs, none on CPU."""
        return 1.0 if self.device == "cuda" else 0.0

    @property
    def draft_on_gpu(self) -> bool:
        """Whether the draft runs on a GPU (device cuda, draft_device auto)."""
        return self.device == "cuda" and self.draft_device == "auto"

    @property
    def draft_shares_gpu(self) -> bool:
        """Whether the draft actor shares shard 0's GPU (a fractional num_gpus_draft on cuda; a draft
        inside shard 0 has no actor: it uses the shard's GPU, see draft_in_shard)."""
        return self.draft_on_gpu and self.num_gpus_draft < 1 and not self.draft_runs_in_shard

    @property
    def resolved_draft_device(self) -> str:
        return self.device if self.draft_device == "auto" else self.draft_device
