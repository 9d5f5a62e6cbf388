"""Model loading: safetensors directories, truncated and distilled drafts, vocabulary checks, specs.

.venv/bin/python -m pytest tests/models/test_loading.py -q
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types

import pytest
import torch

from distributed_spec.errors import ConfigError
from distributed_spec.models import (
    LoadedModel,
    ModelConfig,
    ModelSpec,
    check_pair,
    load_model,
    load_pair,
    torch_dtype,
    truncated_draft,
)
from distributed_spec.models.tiny import tiny_llama, tiny_tokenizer


def _loaded(model, tokenizer=None, name="m") -> LoadedModel:
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, spec=ModelSpec(name))


def test_local_directory_round_trip(tmp_path):
    model = tiny_llama(vocab_size=40, seed=3)
    model.save_pretrained(tmp_path, safe_serialization=True)
    tiny_tokenizer(40).save_pretrained(tmp_path)
    assert list(tmp_path.glob("*.safetensors")) and not list(tmp_path.glob("*.bin"))
    spec = ModelSpec(str(tmp_path))
    assert spec.resolved_kind == "dir"
    loaded = load_model(spec)
    input_ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(input_ids).logits, model(input_ids).logits)
    assert loaded.tokenizer.decode(loaded.tokenizer.encode("abc")) == "abc"
    assert next(loaded.model.parameters()).dtype == torch.float32


def test_load_pair_loads_and_checks_the_configured_pair(tmp_path):
    tiny_llama(vocab_size=40, num_layers=2, seed=3).save_pretrained(tmp_path, safe_serialization=True)
    tiny_tokenizer(40).save_pretrained(tmp_path)
    model = ModelConfig(target=ModelSpec(str(tmp_path), "dir"), draft=ModelSpec(kind="truncated", num_layers=1))
    target, draft = load_pair(model, device="cpu")
    assert draft.name == f"{tmp_path}[:1 layers]" and draft.model.model.embed_tokens is target.model.model.embed_tokens
    assert next(draft.model.parameters()).dtype == torch.float32
    with pytest.raises(ConfigError, match=r"model\.max_context_len=300 exceeds the 256 positions"):
        load_pair(dataclasses.replace(model, max_context_len=300))


def test_directory_without_safetensors_is_refused(tmp_path):
    model = tiny_llama(vocab_size=40, seed=3)
    model.save_pretrained(tmp_path, safe_serialization=False)
    for weights in tmp_path.glob("*.safetensors"):
        weights.unlink()
    with pytest.raises((OSError, EnvironmentError, ValueError)):
        load_model(ModelSpec(str(tmp_path)))


def test_truncated_draft_shares_the_target_weights():
    target = tiny_llama(vocab_size=32, num_layers=4, seed=0)
    draft = truncated_draft(target, 2)
    assert len(draft.model.layers) == 2 and draft.config.num_hidden_layers == 2
    assert target.config.num_hidden_layers == 4
    assert draft.model.layers[1] is target.model.layers[1]
    assert draft.lm_head.weight.data_ptr() == target.lm_head.weight.data_ptr()
    with torch.no_grad():
        logits = draft(torch.tensor([[3, 4, 5]])).logits
    assert logits.shape == (1, 3, 32) and torch.isfinite(logits).all()
    with pytest.raises(ValueError, match="num_layers must be in"):
        truncated_draft(target, 5)


def test_truncated_spec_derives_from_the_target():
    target = _loaded(tiny_llama(vocab_size=32, num_layers=3, seed=0), name="tiny")
    draft = load_model(ModelSpec(kind="truncated", num_layers=1), target=target, role="draft")
    assert draft.name == "tiny[:1 layers]" and len(draft.model.model.layers) == 1
    with pytest.raises(ValueError, match="load the target first"):
        load_model(ModelSpec(kind="truncated", num_layers=1), role="draft")
    with pytest.raises(ValueError, match=r"model\.dtype"):
        load_model(ModelSpec(kind="truncated", num_layers=1), dtype="bfloat16", target=target, role="draft")


def test_distilled_kind_calls_the_distillation_loader(monkeypatch):
    calls = []
    target = _loaded(tiny_llama(vocab_size=32, seed=0), tokenizer=tiny_tokenizer(32), name="tiny")
    small = tiny_llama(vocab_size=32, num_layers=1, seed=1)

    def load_distilled_draft(checkpoint_dir, target_model):
        calls.append((checkpoint_dir, target_model))
        return small

    fake = types.ModuleType("distributed_spec.models.distilled")
    fake.load_distilled_draft = load_distilled_draft
    monkeypatch.setitem(sys.modules, "distributed_spec.models.distilled", fake)
    draft = load_model(ModelSpec("ckpt/dir", kind="distilled"), target=target, role="draft")
    assert calls == [("ckpt/dir", target.model)]
    assert draft.model is small and draft.tokenizer is target.tokenizer


def test_vocabulary_mismatch_names_both_models():
    target = _loaded(tiny_llama(vocab_size=32), name="big-target")
    with pytest.raises(ValueError, match="draft 'small-draft' and target 'big-target'.*32 vs 40"):
        check_pair(target.facts, _loaded(tiny_llama(vocab_size=40), name="small-draft").facts, None)


def test_tokenizer_mismatch_of_equal_size_is_caught():
    tokenizer = tiny_tokenizer(40)
    swapped = tiny_tokenizer(40)
    swapped.add_tokens(["<extra>"])
    target = _loaded(tiny_llama(vocab_size=48), tokenizer, name="t")
    draft = _loaded(tiny_llama(vocab_size=48, seed=1), swapped, name="d")
    with pytest.raises(ValueError, match="tokenizer vocabularies differ"):
        check_pair(target.facts, draft.facts, None)
    check_pair(target.facts, _loaded(tiny_llama(vocab_size=48, seed=2), tiny_tokenizer(40), name="d2").facts, None)


def test_spec_validation_and_resolution(tmp_path):
    assert ModelSpec().resolved_kind == "smollm2"
    assert ModelSpec("some/model.gguf").resolved_kind == "gguf"
    assert ModelSpec("HuggingFaceTB/SmolLM2-135M-Instruct").resolved_kind == "hub"
    assert ModelSpec(str(tmp_path)).resolved_kind == "dir"
    assert torch_dtype("auto", "cpu") == torch.float32
    assert torch_dtype("auto", "cuda") == torch.bfloat16
    assert torch_dtype("float16", "cuda") == torch.float16
    with pytest.raises(ValueError, match="model kind"):
        load_model(ModelSpec(kind="pickle"))
    with pytest.raises(ValueError, match="model dtype"):
        torch_dtype("int8", "cpu")
    with pytest.raises(ValueError, match="num_layers"):
        load_model(ModelSpec(kind="truncated"), target=_loaded(tiny_llama(vocab_size=32)), role="draft")
    with pytest.raises(ValueError, match="not a GGUF file"):
        load_model(ModelSpec(str(tmp_path / "missing.gguf")), role="target")


def test_converted_smollm2_config_drops_the_gguf_quantization_config(tmp_path):
    """The de-quantised copy is plain float32: its config must not make transformers attach a GGUF
    quantizer on load. Copies written before the fix are mended in place; the rest is kept."""
    from distributed_spec.models.loading import _drop_gguf_quantization_config

    model = tiny_llama(vocab_size=40, seed=3)
    model.config.quantization_config = {"quant_method": "gguf", "dequantize": False, "gguf_file": "m.gguf"}
    model.save_pretrained(tmp_path, safe_serialization=True)
    assert "quantization_config" in json.loads((tmp_path / "config.json").read_text())
    _drop_gguf_quantization_config(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert "quantization_config" not in config and config["vocab_size"] == 40
    _drop_gguf_quantization_config(tmp_path)  # nothing left to drop: unchanged
    assert json.loads((tmp_path / "config.json").read_text()) == config
    loaded = load_model(ModelSpec(str(tmp_path), kind="dir"), role="target").model
    assert getattr(loaded, "hf_quantizer", None) is None
