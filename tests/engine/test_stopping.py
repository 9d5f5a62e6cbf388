"""Rows finish on EOS, stop strings and max_new_tokens, independently, and never emit past them.

.venv/bin/python -m pytest tests/engine/test_stopping.py -q
"""

from __future__ import annotations

import pytest

from distributed_spec.engine import EngineConfig, SpeculativeEngine
from distributed_spec.engine.config import SamplingConfig, VerifierConfig
from distributed_spec.models.tiny import tiny_tokenizer
from distributed_spec.verify import SamplingParams

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = [[5, 6, 7], [8], [9, 10, 11, 12, 13, 14, 15], [30, 4], [40, 41, 42]]
MAX_NEW_TOKENS = 20


@pytest.fixture(scope="module")
def free_running(tiny_pair):
    """Greedy outputs without any stop condition but the length."""
    target, _ = tiny_pair
    config = EngineConfig(
        verifier=VerifierConfig(method="autoregressive"),
        sampling=SamplingConfig(temperature=0.0, max_new_tokens=MAX_NEW_TOKENS),
    )
    return [result.token_ids for result in SpeculativeEngine(target, None, config).generate(PROMPTS)]


@pytest.mark.parametrize("method", ["autoregressive", "block", "token"])
def test_eos_truncates_each_row_at_its_first_eos(tiny_pair, free_running, method):
    target, draft = tiny_pair
    eos_id = free_running[0][5]
    config = EngineConfig(
        verifier=VerifierConfig(method=method, num_draft_tokens=3),
        sampling=SamplingConfig(temperature=0.0, max_new_tokens=MAX_NEW_TOKENS),
        eos_token_ids=(eos_id,),
        max_batch_size=4,
    )
    results = SpeculativeEngine(target, draft, config).generate(PROMPTS)
    for result, expected in zip(results, free_running):
        if eos_id in expected:
            assert result.token_ids == expected[: expected.index(eos_id) + 1]
            assert result.finish_reason == "eos"
        else:
            assert result.token_ids == expected
            assert result.finish_reason == "length"
    assert {result.finish_reason for result in results} == {"eos", "length"}


def test_stop_string_truncates_after_the_completing_token(tiny_pair, free_running):
    target, draft = tiny_pair
    tokenizer = tiny_tokenizer(64)
    stop = tokenizer.decode(free_running[1][6:8])
    config = EngineConfig(
        verifier=VerifierConfig(method="block", num_draft_tokens=4),
        sampling=SamplingConfig(temperature=0.0, max_new_tokens=MAX_NEW_TOKENS, stop=[stop]),
    )
    results = SpeculativeEngine(target, draft, config, tokenizer=tokenizer).generate(PROMPTS)
    for result, expected in zip(results, free_running):
        cut = next(
            (length for length in range(1, len(expected) + 1) if stop in tokenizer.decode(expected[:length])),
            None,
        )
        assert result.token_ids == (expected if cut is None else expected[:cut])
        assert result.finish_reason == ("length" if cut is None else "stop")
    assert results[1].finish_reason == "stop"


def test_max_new_tokens_is_exact_for_every_gamma(tiny_pair):
    target, draft = tiny_pair
    for max_new_tokens in (1, 2, 7):
        config = EngineConfig(
            verifier=VerifierConfig(method="block", num_draft_tokens=5),
            sampling=SamplingConfig(max_new_tokens=max_new_tokens, seed=3),
        )
        results = SpeculativeEngine(target, draft, config).generate(PROMPTS)
        assert all(len(result.token_ids) == max_new_tokens for result in results)
        assert all(result.finish_reason == "length" for result in results)


def test_sampling_is_reproducible_from_the_seed(tiny_pair):
    target, draft = tiny_pair

    def run(seed: int) -> list[list[int]]:
        config = EngineConfig(
            verifier=VerifierConfig(method="block", num_draft_tokens=3),
            sampling=SamplingConfig(max_new_tokens=16, seed=seed),
            max_batch_size=2,
        )
        return [result.token_ids for result in SpeculativeEngine(target, draft, config).generate(PROMPTS)]

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_batches_and_row_stats_add_up(tiny_pair):
    target, draft = tiny_pair
    config = EngineConfig(
        verifier=VerifierConfig(method="token", num_draft_tokens=3),
        sampling=SamplingConfig(max_new_tokens=12, seed=1),
        max_batch_size=2,
    )
    engine = SpeculativeEngine(target, draft, config)
    results, stats = engine.generate_with_stats(PROMPTS)
    assert stats.num_tokens == sum(len(result.token_ids) for result in results) == 12 * len(PROMPTS)
    assert stats.num_row_iterations == sum(result.stats.num_iterations for result in results)
    # No separate prefill forward: the prompts go in with each batch's first draft and target forwards.
    assert engine.target_runner.num_forward_calls == stats.num_target_calls
    assert engine.draft_runner.num_forward_calls == stats.num_draft_calls
    assert sum(stats.num_accepted_per_position) == sum(result.stats.num_accepted for result in results)
    assert stats.total_s >= stats.draft_s + stats.target_s + stats.verify_s
