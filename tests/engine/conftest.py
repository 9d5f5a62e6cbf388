"""Fixtures of the engine tests: tiny random Llama pairs and single-threaded torch.

On this 2-core machine shared with other jobs, multi-threaded small matmuls spin-wait and run 10-100x
slower than single-threaded ones, so every engine test runs with one torch thread.
"""

from __future__ import annotations

import pytest
import torch

from distributed_spec.models.tiny import perturbed_copy, tiny_llama


@pytest.fixture(autouse=True)
def _single_thread():
    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(num_threads)


@pytest.fixture(scope="module")
def tiny_pair():
    """(target, draft): V=64 target with peaky distributions and a perturbed copy as its draft."""
    target = tiny_llama(vocab_size=64, num_layers=2, hidden=32, seed=0, logit_scale=8.0)
    return target, perturbed_copy(target, noise=0.3, seed=1)
