"""Host memory of each target shard while it loads, against the full model's weights (Ray runtime).

    .venv/bin/python -m scripts.measure_shard_memory                       # SmolLM2, TP = 2
    .venv/bin/python -m scripts.measure_shard_memory --tp-size 2 --compare-full --out shard_memory.json

Launches the runtime's target shard group (group.launch, as a job does: files fetched per node, then
each shard loads) with no draft, reads what every shard reported, and tears it down. Per shard:
- parameter bytes it holds after loading (a tied weight once);
- peak growth of its resident memory during the load (/proc VmHWM reset before it; includes the
  checkpoint pages mapped while reading, but not the process's imports or the process group);
both as a fraction of the full model's weights (the checkpoint's tensor bytes at the model's dtype).
`--compare-full` measures the old path too: every shard builds the whole model and AutoTP cuts it.
The goal of the per-shard load: at most 0.6x the full weights plus runtime.
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import ray
import torch
from safetensors import safe_open

from distributed_spec.config import ParallelConfig
from distributed_spec.distributed.factories import SpecFactory
from distributed_spec.distributed.group import launch, teardown
from distributed_spec.distributed.placement import local_num_cpus
from distributed_spec.distributed.shard_loading import tensor_files
from distributed_spec.engine import EngineConfig
from distributed_spec.engine.config import SamplingConfig, VerifierConfig
from distributed_spec.models import ModelSpec
from distributed_spec.models.loading import checkpoint_dir, torch_dtype

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FullBuildFactory(SpecFactory):
    """The old path: no checkpoint to slice, so every shard builds the whole model and AutoTP cuts it."""

    def checkpoint(self):
        return None


def full_weight_bytes(spec: ModelSpec) -> int:
    """Bytes of the checkpoint's tensors at the model's dtype (what one full copy holds)."""
    files = tensor_files(checkpoint_dir(spec, download=True))
    itemsize = torch.empty((), dtype=torch_dtype("auto", "cpu")).element_size()  # SpecFactory's default
    total = 0
    for name, path in files.items():
        with safe_open(path, framework="pt") as handle:
            shape = handle.get_slice(name).get_shape()
        total += itemsize * int(torch.Size(shape).numel())
    return total


def measure(factory: SpecFactory, tp_size: int) -> list[dict[str, int]]:
    """Launch the shard group alone, return each shard's reported memory, tear it down."""
    config = ParallelConfig(
        runtime="ray", device="cpu", backend="gloo", tp_size=tp_size, num_cpus_per_shard=1.0, load_timeout_s=1800.0
    )
    engine = EngineConfig(
        verifier=VerifierConfig(method="autoregressive"), sampling=SamplingConfig(temperature=0.0)
    )
    actors = launch(config, engine, factory, None, draft_seed=0)
    try:
        return actors.shard_memory
    finally:
        teardown(actors)


def report(label: str, shards: list[dict[str, int]], full_bytes: int) -> list[dict]:
    rows = []
    for rank, memory in enumerate(shards):
        row = {
            "path": label,
            "rank": rank,
            "parameter_mb": memory["parameter_bytes"] / 2**20,
            "parameter_x_full": memory["parameter_bytes"] / full_bytes,
            "load_peak_rss_mb": memory["load_peak_rss_bytes"] / 2**20,
            "load_peak_rss_x_full": memory["load_peak_rss_bytes"] / full_bytes,
        }
        rows.append(row)
        print(
            f"{label:>12} rank {rank}: parameters {row['parameter_mb']:7.1f} MB ({row['parameter_x_full']:.2f}x), "
            f"peak resident growth while loading {row['load_peak_rss_mb']:7.1f} MB ({row['load_peak_rss_x_full']:.2f}x)"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default="smollm2", help="target source (smollm2, hub id, directory, .gguf)"
    )
    parser.add_argument("--tp-size", type=int, default=2)
    parser.add_argument(
        "--compare-full", action="store_true", help="also measure the build-whole-then-cut path"
    )
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    spec = ModelSpec(args.model)
    full_bytes = full_weight_bytes(spec)
    print(f"{args.model}: full weights {full_bytes / 2**20:.1f} MB ({torch_dtype('auto', 'cpu')}), TP = {args.tp_size}")
    config = ParallelConfig(runtime="ray", device="cpu", backend="gloo", tp_size=args.tp_size)
    ray.init(num_cpus=local_num_cpus(config), include_dashboard=False, log_to_driver=False)
    try:
        rows = report("per-shard", measure(SpecFactory(spec), args.tp_size), full_bytes)
        if args.compare_full:
            rows += report("full-then-cut", measure(FullBuildFactory(spec), args.tp_size), full_bytes)
    finally:
        ray.shutdown()
    if args.out:
        args.out.write_text(
            json.dumps({"model": args.model, "full_bytes": full_bytes, "rows": rows}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
