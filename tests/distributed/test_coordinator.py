"""Coordinator pieces that need no Ray cluster: finishing rows, signals, config checks."""

import signal
from dataclasses import replace

import pytest

from distributed_spec.distributed import RayCoordinator, RayRuntimeConfig
from distributed_spec.distributed.coordinator import append_tokens, decode_settings
from distributed_spec.distributed.factories import TinyLlamaFactory
from distributed_spec.engine import EngineConfig, SpeculativeEngine

CONFIG = EngineConfig(method="block", gamma=4, max_new_tokens=6, eos_token_ids=(1,))


@pytest.mark.parametrize(
    ("output", "new_tokens", "budget"),
    [([], [5, 6, 7], 6), ([4, 4], [5, 1, 7], 6), ([4, 4, 4, 4], [5, 6, 7], 6), ([], [1], 6)],
)
def test_rows_finish_like_the_engine(output, new_tokens, budget):
    engine = SpeculativeEngine(TinyLlamaFactory()(), TinyLlamaFactory(seed=1)(), CONFIG)
    expected_output = list(output)
    expected_reason = engine._append(expected_output, new_tokens, budget, None)
    actual_output = list(output)
    assert append_tokens(actual_output, new_tokens, budget, CONFIG, None) == expected_reason
    assert actual_output == expected_output


def test_greedy_verification_sends_no_probabilities():
    runtime = RayRuntimeConfig(wire_dtype="bfloat16", wire_top_k=16)
    assert not decode_settings(replace(CONFIG, method="greedy"), runtime).wire.send_probs
    wire = decode_settings(CONFIG, runtime).wire
    assert wire.send_probs and wire.dtype == "bfloat16" and wire.top_k == 16


def test_a_draft_method_needs_a_draft_factory():
    with pytest.raises(ValueError, match="engine.method=autoregressive"):
        RayCoordinator(TinyLlamaFactory(), None, CONFIG, RayRuntimeConfig())


def test_sigterm_becomes_system_exit_so_close_runs():
    coordinator = RayCoordinator(TinyLlamaFactory(), TinyLlamaFactory(seed=1), CONFIG, RayRuntimeConfig())
    previous = signal.getsignal(signal.SIGTERM)
    coordinator._install_signal_handlers()
    try:
        with pytest.raises(SystemExit):
            signal.raise_signal(signal.SIGTERM)
    finally:
        coordinator.close()
    assert signal.getsignal(signal.SIGTERM) is previous
