"""Coordinator pieces that need no Ray cluster: finishing rows, signals, config checks."""

import signal
from dataclasses import replace

import pytest

from distributed_spec.distributed import RayCoordinator
from distributed_spec.distributed.coordinator import decode_settings
from distributed_spec.distributed.factories import TinyLlamaFactory
from distributed_spec.engine import EngineConfig
from distributed_spec.engine.config import SamplingConfig, VerifierConfig
from distributed_spec.engine.stopping import StopChecker
from tests.configs import engine_replace
from tests.distributed.conftest import ray_config

CONFIG = EngineConfig(
    verifier=VerifierConfig(method="block", num_draft_tokens=4),
    sampling=SamplingConfig(max_new_tokens=6),
    eos_token_ids=(1,),
)


@pytest.mark.parametrize(
    ("output", "new_tokens", "budget", "expected_output", "expected_reason"),
    [
        ([], [5, 6, 7], 6, [5, 6, 7], None),
        ([4, 4], [5, 1, 7], 6, [4, 4, 5, 1], "eos"),
        ([4, 4, 4, 4], [5, 6, 7], 6, [4, 4, 4, 4, 5, 6], "length"),
        ([], [1], 6, [1], "eos"),
    ],
)
def test_rows_finish_at_eos_or_budget(output, new_tokens, budget, expected_output, expected_reason):
    """Both runtimes finish rows with the scheduler's StopChecker: EOS kept, nothing past it."""
    output = list(output)
    assert StopChecker(CONFIG.eos_token_ids, ()).append(output, new_tokens, budget) == expected_reason
    assert output == expected_output


def test_greedy_verification_sends_no_probabilities():
    runtime = ray_config(wire_dtype="bfloat16", wire_top_k=16)
    assert not decode_settings(
        engine_replace(CONFIG, verifier=replace(CONFIG.verifier, method="greedy")), runtime, "cpu"
    ).wire.send_probs
    wire = decode_settings(CONFIG, runtime, "cpu").wire
    assert wire.send_probs and wire.dtype == "bfloat16" and wire.top_k == 16


def test_the_default_wire_is_bfloat16_on_cuda_and_float32_on_the_cpu():
    runtime = ray_config()
    assert runtime.wire_dtype == "auto"
    assert decode_settings(CONFIG, runtime, "cuda").wire.dtype == "bfloat16"
    assert decode_settings(CONFIG, runtime, "cpu").wire.dtype == "float32"
    assert decode_settings(CONFIG, replace(runtime, wire_dtype="float16"), "cuda").wire.dtype == "float16"


def test_a_draft_method_needs_a_draft_factory():
    with pytest.raises(ValueError, match="verifier.method=autoregressive"):
        RayCoordinator(TinyLlamaFactory(), None, CONFIG, ray_config())
    with pytest.raises(ValueError, match="verifier.proposer=ngram"):
        RayCoordinator(
            TinyLlamaFactory(),
            None,
            engine_replace(CONFIG, verifier=replace(CONFIG.verifier, proposer="model+ngram")),
            ray_config(),
        )
    # n-gram blocks need no draft model.
    RayCoordinator(
        TinyLlamaFactory(),
        None,
        engine_replace(CONFIG, verifier=replace(CONFIG.verifier, proposer="ngram")),
        ray_config(),
    ).close()


def test_sigterm_becomes_system_exit_so_close_runs():
    coordinator = RayCoordinator(TinyLlamaFactory(), TinyLlamaFactory(seed=1), CONFIG, ray_config())
    previous = signal.getsignal(signal.SIGTERM)
    coordinator._install_signal_handlers()
    try:
        with pytest.raises(SystemExit):
            signal.raise_signal(signal.SIGTERM)
    finally:
        coordinator.close()
    assert signal.getsignal(signal.SIGTERM) is previous
