"""Typed configuration of the Ray runtime (`parallel.runtime=ray`): one dataclass, validated once.

Every field is a key of the Hydra group that mirrors it (`parallel.*`); error messages name the key.
"""

from __future__ import annotations

from dataclasses import dataclass

WIRE_DTYPES = ("float32", "bfloat16", "float16")
PLACEMENT_STRATEGIES = ("STRICT_PACK", "PACK", "SPREAD", "STRICT_SPREAD")
DEVICE_BACKENDS = {"cpu": ("gloo",), "cuda": ("nccl", "gloo")}


@dataclass
class RayRuntimeConfig:
    """Where the target shards and the draft run, how they talk, and how faults are handled."""

    # Number of target shards (tensor-parallel ranks), one Ray actor each.
    tp_size: int = 1
    # Device of every actor: "cpu" (CPU bundles) or "cuda" (one GPU per shard).
    device: str = "cpu"
    # torch.distributed backend of the shard group: "gloo" on cpu, "nccl" on cuda.
    backend: str = "gloo"
    # Logical CPUs reserved per shard bundle (fractions are fine; Ray does not pin cores).
    num_cpus_per_shard: float = 1.0
    # Logical CPUs reserved for the draft bundle.
    num_cpus_draft: float = 1.0
    # GPUs reserved for the draft bundle on cuda (a fraction shares a GPU with other work).
    num_gpus_draft: float = 1.0
    # Placement strategy tried first; STRICT_PACK falls back to PACK when one node cannot hold all.
    placement_strategy: str = "STRICT_PACK"
    # Seconds to wait for the placement group before falling back (or failing).
    placement_timeout_s: float = 30.0
    # Precision of the draft probabilities on the wire; the draft samples from the same rounded q.
    wire_dtype: str = "float32"
    # Send only the draft's top-k probabilities (0 = dense). Exact because the draft then samples
    # from its own top-k: q is exactly that sparse distribution.
    wire_top_k: int = 0
    # Draft the next block while the shards verify the current one (kept only when the whole block
    # is accepted and the bonus token equals the draft's guess for it).
    overlap: bool = False
    # Seconds a load call, or a batch's first iteration (it also processes the prompts), may take
    # (a load includes the one-time JIT build of the CPU all-reduce).
    load_timeout_s: float = 600.0
    # Seconds one iteration may take before the coordinator declares the group dead.
    step_timeout_s: float = 60.0
    # How many times a dead group is rebuilt before generate() gives up.
    max_restarts: int = 3
    # Address of an existing Ray cluster ("auto", "ray://..."); None starts or reuses a local one.
    ray_address: str | None = None

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
        if self.placement_strategy not in PLACEMENT_STRATEGIES:
            raise ValueError(
                f"parallel.placement_strategy must be one of {PLACEMENT_STRATEGIES}, got {self.placement_strategy!r}"
            )
        if self.wire_dtype not in WIRE_DTYPES:
            raise ValueError(f"parallel.wire_dtype must be one of {WIRE_DTYPES}, got {self.wire_dtype!r}")
        if self.wire_top_k < 0:
            raise ValueError(f"parallel.wire_top_k must be >= 0 (0 = dense), got {self.wire_top_k}")
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
