"""Fetching model files before the shards load: hub snapshots (huggingface_hub mocked: no network
here), local directories, derived drafts, and the factories' fetch/checkpoint verbs.

    .venv/bin/python -m pytest tests/models/test_fetch.py -q
"""

from __future__ import annotations

import huggingface_hub
import pytest
import torch
from huggingface_hub.errors import LocalEntryNotFoundError

from distributed_spec.distributed.factories import SpecFactory
from distributed_spec.models import ModelSpec, loading
from distributed_spec.models.fetch import HUB_PATTERNS
from distributed_spec.models.loading import checkpoint_dir, gguf_converted_dir
from distributed_spec.models.tiny import tiny_llama


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    """snapshot_download that 'downloads' a tiny Llama once and afterwards serves it from the cache."""
    snapshot = tmp_path / "snapshot"
    calls = []

    def snapshot_download(repo_id, revision=None, allow_patterns=None, local_files_only=False, **kwargs):
        calls.append({"repo_id": repo_id, "revision": revision, "allow_patterns": allow_patterns,
                      "local_files_only": local_files_only})
        if not snapshot.exists():
            if local_files_only:
                raise LocalEntryNotFoundError("not cached")
            tiny_llama(vocab_size=40, seed=3).save_pretrained(snapshot)
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return snapshot, calls


def test_hub_model_is_downloaded_once_then_read_from_the_cache(fake_hub):
    snapshot, calls = fake_hub
    spec = ModelSpec("org/tiny", revision="v1")
    with pytest.raises(FileNotFoundError, match="org/tiny is not in this node's Hugging Face cache"):
        checkpoint_dir(spec)
    assert checkpoint_dir(spec, download=True) == snapshot
    assert checkpoint_dir(spec) == snapshot
    assert [call["local_files_only"] for call in calls] == [True, False, True]
    assert all(call["revision"] == "v1" and call["repo_id"] == "org/tiny" for call in calls)
    # Safetensors and configs only: never pickled weights nor a repository's `original/` copies.
    assert calls[1]["allow_patterns"] == list(HUB_PATTERNS)
    assert not any(pattern.endswith((".bin", ".pth", ".pt")) for pattern in HUB_PATTERNS)


def test_spec_factory_fetches_then_hands_the_shards_a_local_checkpoint(fake_hub):
    snapshot, calls = fake_hub
    factory = SpecFactory(ModelSpec("org/tiny"), dtype="bfloat16")
    factory.fetch()
    checkpoint = factory.checkpoint()
    assert checkpoint.directory == snapshot and checkpoint.dtype == torch.bfloat16
    assert calls[-1]["local_files_only"]  # the shard side never downloads


def test_local_directories_and_derived_drafts_fetch_nothing(tmp_path, fake_hub):
    _, calls = fake_hub
    tiny_llama(vocab_size=40).save_pretrained(tmp_path / "m")
    assert checkpoint_dir(ModelSpec(str(tmp_path / "m")), download=True) == tmp_path / "m"
    truncated = ModelSpec(kind="truncated", num_layers=1)
    assert checkpoint_dir(truncated, download=True) is None
    assert SpecFactory(truncated, target_spec=ModelSpec(str(tmp_path / "m"))).checkpoint() is None
    assert calls == []


def test_a_gguf_file_is_converted_once_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTRIBUTED_SPEC_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "model.Q4.gguf"
    gguf.write_bytes(b"GGUF")
    spec = ModelSpec(str(gguf))
    with pytest.raises(FileNotFoundError, match="fetch the weights first"):
        checkpoint_dir(spec)  # a shard never de-quantises on its own
    converted = gguf_converted_dir(gguf)
    assert converted.parent == tmp_path / "cache" / "gguf" and converted.name.startswith("model.Q4-")
    conversions = []
    monkeypatch.setattr(loading, "AutoModelForCausalLM", _CountingLoader(conversions))
    tiny_llama(vocab_size=40).save_pretrained(converted)  # what a finished conversion leaves
    assert checkpoint_dir(spec, download=True) == converted == checkpoint_dir(spec)
    assert conversions == []  # already converted: not de-quantised again
    gguf.write_bytes(b"GGUF, replaced")
    assert gguf_converted_dir(gguf) != converted  # a replaced file converts again


class _CountingLoader:
    def __init__(self, calls: list) -> None:
        self.calls = calls

    def from_pretrained(self, *args, **kwargs):
        self.calls.append(args)
        raise AssertionError("converted twice")
