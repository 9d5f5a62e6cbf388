"""The local Ray cluster the Ray tests of a module share (one per module, shut down after it)."""

import pytest
import ray

from distributed_spec.config import ParallelConfig


@pytest.fixture(scope="module")
def ray_cluster():
    """4 logical CPUs: a TP = 2 runtime with half-CPU actors fits twice over."""
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def ray_config(**overrides) -> ParallelConfig:
    """parallel=ray settled on the CPU (gloo) unless `overrides` say otherwise."""
    return ParallelConfig(**{"runtime": "ray", "device": "cpu", "backend": "gloo", **overrides})
