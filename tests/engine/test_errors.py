"""Bad input fails early with a ValueError that names the setting to change.

.venv/bin/python -m pytest tests/engine/test_errors.py -q
"""

from __future__ import annotations

import pytest

from distributed_spec.engine import EngineConfig, SpeculativeEngine
from distributed_spec.engine.config import SamplingConfig, SchedulingConfig, VerifierConfig
from distributed_spec.models.tiny import tiny_llama


def test_empty_prompt_is_rejected(tiny_pair):
    target, draft = tiny_pair
    engine = SpeculativeEngine(
        target,
        draft,
        EngineConfig(verifier=VerifierConfig(num_draft_tokens=2), sampling=SamplingConfig(max_new_tokens=4)),
    )
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        engine.generate([[3, 4], []])


def test_prompt_longer_than_context_is_rejected():
    target = tiny_llama(vocab_size=32, max_position_embeddings=16)
    draft = tiny_llama(vocab_size=32, seed=1, max_position_embeddings=16)
    engine = SpeculativeEngine(
        target,
        draft,
        EngineConfig(verifier=VerifierConfig(num_draft_tokens=2), sampling=SamplingConfig(max_new_tokens=4)),
    )
    with pytest.raises(ValueError, match="prompt 0 has 16 tokens, the model context is 16"):
        engine.generate([[3] * 16])


def test_generation_stops_at_the_context_length():
    target = tiny_llama(vocab_size=32, max_position_embeddings=16)
    draft = tiny_llama(vocab_size=32, seed=1, max_position_embeddings=16)
    engine = SpeculativeEngine(
        target,
        draft,
        EngineConfig(verifier=VerifierConfig(num_draft_tokens=3), sampling=SamplingConfig(max_new_tokens=50)),
    )
    results = engine.generate([[3] * 10, [4] * 2])
    assert [len(result.token_ids) for result in results] == [6, 14]
    assert all(result.finish_reason == "length" for result in results)


def test_token_ids_outside_the_vocabulary_are_rejected(tiny_pair):
    target, draft = tiny_pair
    engine = SpeculativeEngine(target, draft, EngineConfig(verifier=VerifierConfig(num_draft_tokens=2)))
    with pytest.raises(ValueError, match="outside"):
        engine.generate([[3, 64]])


def test_mismatched_vocabularies_are_rejected(tiny_pair):
    target, _ = tiny_pair
    draft = tiny_llama(vocab_size=48, seed=2)
    with pytest.raises(ValueError, match="vocabulary size 48 but target .* has 64"):
        SpeculativeEngine(target, draft, EngineConfig(verifier=VerifierConfig(num_draft_tokens=2)))


@pytest.mark.parametrize("num_draft_tokens", [0, -1])
def test_num_draft_tokens_below_one_is_rejected(num_draft_tokens):
    with pytest.raises(ValueError, match="verifier.num_draft_tokens"):
        VerifierConfig(method="block", num_draft_tokens=num_draft_tokens)


@pytest.mark.parametrize(
    ("config", "field", "value", "message"),
    [
        (VerifierConfig, "method", "beam", "verifier.method"),
        (SamplingConfig, "max_new_tokens", 0, "sampling.max_new_tokens"),
        (SamplingConfig, "temperature", -1.0, "sampling.temperature"),
        (EngineConfig, "max_batch_size", 0, "data.batch_size"),
        (SamplingConfig, "stop", [""], "sampling.stop"),
        (SchedulingConfig, "prefill_chunk_tokens", 0, "engine.prefill_chunk_tokens"),
    ],
)
def test_bad_engine_settings_name_the_key(config, field, value, message):
    with pytest.raises(ValueError, match=message):
        config(**{field: value})


def test_speculative_method_without_draft_is_rejected(tiny_pair):
    target, _ = tiny_pair
    with pytest.raises(ValueError, match="verifier.method=autoregressive"):
        SpeculativeEngine(target, None, EngineConfig(verifier=VerifierConfig(method="token")))


def test_stop_strings_need_a_tokenizer(tiny_pair):
    target, draft = tiny_pair
    engine = SpeculativeEngine(target, draft, EngineConfig(sampling=SamplingConfig(stop=["x"])))
    with pytest.raises(ValueError, match="needs a tokenizer"):
        engine.generate([[3, 4]])
