"""Grouped-query attention on the CPU (models/cpu_attention.py): bitwise transformers' sdpa path,
taken by the runner's masked forwards of several positions, and left alone where it does not apply.

    .venv/bin/python -m pytest tests/models/test_cpu_attention.py -q
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from distributed_spec.engine import ModelRunner
from distributed_spec.models import cpu_attention
from distributed_spec.models.cpu_attention import GQA_ATTENTION, matches_repeated_heads, use_gqa_attention


def _llama(num_heads: int = 8, num_kv_heads: int = 2, dtype: torch.dtype = torch.float32, **extra) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads, max_position_embeddings=128, **extra,
    )
    return LlamaForCausalLM(config).eval().to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(8, 2, 8), (9, 3, 64), (32, 8, 128)])
def test_grouped_sdpa_is_the_repeated_heads_result_bitwise_here(dtype, num_heads, num_kv_heads, head_dim):
    assert matches_repeated_heads(num_heads, num_kv_heads, head_dim, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_runners_forwards_give_sdpas_logits_bitwise_and_skip_the_copy(dtype, monkeypatch):
    delegated = []
    original = cpu_attention.sdpa_attention_forward

    def spy(module, query, *args, **kwargs):
        delegated.append(query.shape[2])
        return original(module, query, *args, **kwargs)

    monkeypatch.setattr(cpu_attention, "sdpa_attention_forward", spy)
    grouped_model = _llama(dtype=dtype)
    sdpa_model = copy.deepcopy(grouped_model)
    grouped, sdpa = ModelRunner(grouped_model), ModelRunner(sdpa_model)
    assert grouped.gqa_attention and grouped_model.config._attn_implementation == GQA_ATTENTION
    sdpa_model.set_attn_implementation("sdpa")

    def both(verb, *args):
        return [getattr(runner, verb)(*args) for runner in (sdpa, grouped)]

    prompts = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    outputs = both("prefill", prompts)
    outputs += both("forward_tokens", torch.tensor([[20, 21, 22], [23, 24, 25], [26, 27, 28]]))
    # Rows keep 0, 2 and 3 of those slots: holes in the cache, masked in the next forwards.
    both("rollback", torch.tensor([0, 2, 3]), 3)
    outputs += both("forward_tokens", torch.tensor([[30, 31], [32, 33], [34, 35]]))
    outputs += both("forward_tokens", torch.tensor([[40], [41], [42]]))
    for from_sdpa, from_grouped in zip(outputs[::2], outputs[1::2]):
        assert torch.equal(from_sdpa, from_grouped)
    # The grouped model sent only its one-position forward (2 layers) to transformers' path; the
    # prefill and the 3- and 2-position forwards took SDPA's grouped heads.
    assert delegated == [1, 1]


def test_models_it_does_not_apply_to_are_left_as_they_are(monkeypatch):
    full_heads = _llama(num_heads=4, num_kv_heads=4)
    assert not use_gqa_attention(full_heads) and full_heads.config._attn_implementation == "sdpa"
    eager = _llama(attn_implementation="eager")
    assert not use_gqa_attention(eager) and eager.config._attn_implementation == "eager"
    # A module that only looks like one (a config, no transformers model around it).
    wrapper = torch.nn.Module()
    wrapper.inner = _llama()
    wrapper.config = wrapper.inner.config
    assert not use_gqa_attention(wrapper) and wrapper.config._attn_implementation == "sdpa"
    monkeypatch.setattr(cpu_attention, "matches_repeated_heads", lambda *args: False)
    differs = _llama()
    assert not use_gqa_attention(differs) and differs.config._attn_implementation == "sdpa"
    assert not ModelRunner(_llama()).gqa_attention
