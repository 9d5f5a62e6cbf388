"""Runtime selection and the checks that run before any model is loaded."""

from __future__ import annotations

import importlib.util
import json

import pytest

from distributed_spec.config import ConfigError, JobConfig, ModelConfig, ModelSpec, ParallelConfig
from distributed_spec.jobs import runner
from distributed_spec.jobs.runner import check_runtime_available
from distributed_spec.models.pair import check_declared_pair


def _model_dir(path, vocab_size):
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": vocab_size}))
    return str(path)


def _pair(target, draft) -> ModelConfig:
    return ModelConfig(
        name="pair",
        target=ModelSpec(source=target, kind="dir"),
        draft=ModelSpec(source=draft, kind="dir"),
    )


def test_vocabulary_mismatch_fails_before_loading(tmp_path):
    model = _pair(_model_dir(tmp_path / "t", 64), _model_dir(tmp_path / "d", 80))
    with pytest.raises(ConfigError, match=r"model\.draft\.source has vocabulary size 80 but .* has 64"):
        check_declared_pair(model)


def test_matching_or_unknown_vocabularies_pass(tmp_path):
    check_declared_pair(_pair(_model_dir(tmp_path / "t", 64), _model_dir(tmp_path / "d", 64)))
    # Derived drafts and GGUF targets are checked by the loader after loading.
    check_declared_pair(ModelConfig())


def test_missing_ray_runtime_fails_with_not_available_yet(monkeypatch):
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args):
        return None if name.startswith("distributed_spec.distributed") else real_find_spec(name, *args)

    monkeypatch.setattr(runner.importlib.util, "find_spec", find_spec)
    job = JobConfig(parallel=ParallelConfig(runtime="ray"))
    with pytest.raises(ConfigError, match="parallel.runtime=ray is not available yet"):
        check_runtime_available(job)
    check_runtime_available(JobConfig())
