"""On the real SmolLM2-135M-Instruct: greedy speculative decoding == greedy autoregressive decoding.

    .venv/bin/python -m pytest tests/engine/test_smollm2.py -q

The draft is the target's first 4 layers (shared weights, no training): acceptance is low, so most
iterations reject and roll both caches back, which is what this test exercises on a real model.
The first run converts the cached GGUF to safetensors (about a minute); later runs load in seconds.
"""

from __future__ import annotations

import pytest

from distributed_spec.engine import EngineConfig, SpeculativeEngine
from distributed_spec.engine.config import SamplingConfig, VerifierConfig
from distributed_spec.models import ModelConfig, ModelSpec, load_pair

pytestmark = pytest.mark.slow

QUESTIONS = ["What is 2+2?", "Write a haiku about the sea."]
MAX_NEW_TOKENS = 16


def test_greedy_speculative_equals_autoregressive_on_smollm2():
    target, draft = load_pair(ModelConfig(target=ModelSpec("smollm2"), draft=ModelSpec(kind="truncated", num_layers=4)))
    tokenizer = target.tokenizer
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": question}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )["input_ids"]
        for question in QUESTIONS
    ]
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=MAX_NEW_TOKENS)
    eos = (tokenizer.eos_token_id,)
    expected = SpeculativeEngine(
        target.model, None, EngineConfig(VerifierConfig(method="autoregressive"), sampling, eos_token_ids=eos)
    ).generate(prompts)
    results, stats = SpeculativeEngine(
        target.model,
        draft.model,
        EngineConfig(VerifierConfig(method="block", num_draft_tokens=3), sampling, eos_token_ids=eos),
    ).generate_with_stats(prompts)
    assert [result.token_ids for result in results] == [result.token_ids for result in expected]
    assert [result.finish_reason for result in results] == [result.finish_reason for result in expected]
    assert "4" in tokenizer.decode(expected[0].token_ids)
    assert stats.num_target_calls <= MAX_NEW_TOKENS
