"""Typed configuration of the Ray runtime (`parallel.runtime=ray`): one dataclass, validated once.

Every field is a key of the Hydra group that mirrors it (`parallel.*`); error messages name the key.
"""

from __future__ import annotations

from dataclasses import dataclass

# "auto": bfloat16 on cuda, float32 on the CPU (wire.resolve_wire_dtype).
WIRE_DTYPES = ("auto", "float32", "bfloat16", "float16")
PLACEMENT_STRATEGIES = ("STRICT_PACK", "PACK", "SPREAD", "STRICT_SPREAD")
# "auto": decided from the Ray cluster's resources at launch (placement.resolve_device).
DEVICE_BACKENDS = {"cpu": ("gloo",), "cuda": ("nccl", "gloo"), "auto": ("auto", "gloo", "nccl")}
DRAFT_DEVICES = ("auto", "cpu")
# parallel.verify: `gather` computes the full target logits on every rank and verifies on rank 0;
# `vocab_parallel` computes each rank's vocabulary slice only and verifies inside the group
# (verify_parallel/, docs/design.md section 4). Mirrored by distributed_spec.config.VERIFY_MODES.
VERIFY_MODES = ("gather", "vocab_parallel")


@dataclass
class RayRuntimeConfig:
    """Where the target shards and the draft run, how they talk, and how faults are handled."""

    # Number of target shards (tensor-parallel ranks), one Ray actor each.
    tp_size: int = 1
    # Device of the shards: "cpu" (CPU bundles), "cuda" (one GPU per shard) or "auto" (cuda when the
    # Ray cluster has GPUs, decided at launch from the cluster's resources, not the driver's).
    device: str = "cpu"
    # torch.distributed backend of the shard group: "gloo" on cpu, "nccl" on cuda ("auto" with device auto).
    backend: str = "gloo"
    # Device of the draft: "auto" (the shards' device) or "cpu" (its own CPU bundle, no GPU).
    draft_device: str = "auto"
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
    # How the shard group verifies (VERIFY_MODES). Per-batch setting: sent with every `begin`.
    # (Mirrors ParallelConfig.verify field by field until the two configs are merged.)
    verify: str = "gather"
    # Seconds a load call, or a batch's first iteration (it also processes the prompts), may take
    # (a load includes the one-time JIT build of the CPU all-reduce).
    load_timeout_s: float = 600.0
    # Seconds one iteration may take before the coordinator declares the group dead.
    step_timeout_s: float = 60.0
    # How many times a dead group is rebuilt before generate() gives up.
    max_restarts: int = 3
    # Address of an existing Ray cluster ("auto", "ray://..."); None starts or reuses a local one.
    ray_address: str | None = None
    # Print the placement plan against the cluster (or the nodes described below) and load nothing.
    plan_only: bool = False
    # A cluster to plan for instead of the live one: plan_num_nodes nodes of plan_gpus_per_node GPUs
    # and plan_cpus_per_node CPUs (null CPUs: as many as the bundles need). null GPUs: the live cluster.
    plan_num_nodes: int = 1
    plan_gpus_per_node: int | None = None
    plan_cpus_per_node: float | None = None

    def __post_init__(self) -> None:
        if self.tp_size < 1:
            raise ValueError(f"parallel.tp_size must be >= 1, got {self.tp_size}")
        if self.device not in DEVICE_BACKENDS:
            raise ValueError(f"parallel.device must be one of {sorted(DEVICE_BACKENDS)}, got {self.device!r}")
        if self.backend not in DEVICE_BACKENDS[self.device]:
            raise ValueError(
                f"parallel.backend={self.backend!r} does not work with parallel.device={self.device!r}; "
                f"use one of {DEVICE_BACKENDS[self.device]}"
            )
        if self.draft_device not in DRAFT_DEVICES:
            raise ValueError(f"parallel.draft_device must be one of {DRAFT_DEVICES}, got {self.draft_device!r}")
        if self.device == "cuda" and self.draft_on_gpu and self.num_gpus_draft <= 0:
            raise ValueError(
                f"parallel.num_gpus_draft={self.num_gpus_draft} leaves the draft without a GPU on parallel.device=cuda; "
                "set parallel.num_gpus_draft to a fraction (e.g. 0.1: it shares shard 0's GPU) or parallel.draft_device=cpu"
            )
        if self.num_gpus_draft > 1 and self.num_gpus_draft != int(self.num_gpus_draft):
            raise ValueError(
                f"parallel.num_gpus_draft={self.num_gpus_draft}: above 1 Ray needs a whole number of GPUs"
            )
        if self.plan_num_nodes < 1 or (self.plan_gpus_per_node is not None and self.plan_gpus_per_node < 0):
            raise ValueError("parallel.plan_num_nodes must be >= 1 and parallel.plan_gpus_per_node >= 0 or null")
        if self.placement_strategy not in PLACEMENT_STRATEGIES:
            raise ValueError(
                f"parallel.placement_strategy must be one of {PLACEMENT_STRATEGIES}, got {self.placement_strategy!r}"
            )
        if self.wire_dtype not in WIRE_DTYPES:
            raise ValueError(f"parallel.wire_dtype must be one of {WIRE_DTYPES}, got {self.wire_dtype!r}")
        if self.wire_top_k < 0:
            raise ValueError(f"parallel.wire_top_k must be >= 0 (0 = dense), got {self.wire_top_k}")
        if self.verify not in VERIFY_MODES:
            raise ValueError(f"parallel.verify must be one of {VERIFY_MODES}, got {self.verify!r}")
        if self.num_cpus_per_shard <= 0 or self.num_cpus_draft <= 0:
            raise ValueError("parallel.num_cpus_per_shard and parallel.num_cpus_draft must be > 0")
        if self.step_timeout_s <= 0 or self.load_timeout_s <= 0:
            raise ValueError("parallel.step_timeout_s and parallel.load_timeout_s must be > 0")
        if self.max_restarts < 0:
            raise ValueError(f"parallel.max_restarts must be >= 0, got {self.max_restarts}")

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
        """Whether the draft shares shard 0's GPU (a fractional num_gpus_draft on cuda)."""
        return self.draft_on_gpu and self.num_gpus_draft < 1

    @property
    def resolved_draft_device(self) -> str:
        return self.device if self.draft_device == "auto" else self.draft_device
