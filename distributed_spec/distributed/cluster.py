"""The live Ray cluster: join it, and read its nodes' CPU and GPU totals.

Apart from placement.py because ParallelConfig.resolve (distributed/config.py) reads the cluster too,
and placement.py imports the config: this module imports neither.
"""

from __future__ import annotations

import ray

Resources = dict[str, float]


def connect(address: str | None) -> None:
    """Join the Ray cluster at `address` (None: start one here) unless this process already has."""
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=True)


def cluster_nodes() -> list[Resources]:
    """CPU and GPU totals of every live node of the connected Ray cluster."""
    return [
        {"CPU": node["Resources"].get("CPU", 0.0), "GPU": node["Resources"].get("GPU", 0.0)}
        for node in ray.nodes()
        if node.get("Alive")
    ]
