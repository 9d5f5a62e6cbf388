"""models.check_pair: the one check of a target/draft pair (vocabulary, context), from whatever facts
a caller holds. Torch-free.

.venv/bin/python -m pytest tests/models/test_pair.py -q
"""

from __future__ import annotations

import json

import pytest

from distributed_spec.config import ConfigError, ModelConfig, ModelSpec
from distributed_spec.models.pair import ModelFacts, check_declared_pair, check_pair


def test_context_is_the_smallest_known_bound():
    target = ModelFacts("t", 64, max_position_embeddings=512)
    draft = ModelFacts("d", 64, max_position_embeddings=256)
    assert check_pair(target, draft, None) == 256
    assert check_pair(target, None, None) == 512
    assert check_pair(target, draft, 128) == 128
    assert check_pair(ModelFacts("t", 64), None, 100) == 100
    assert check_pair(ModelFacts("t", 64), ModelFacts("d"), None) is None


def test_max_context_len_past_the_models_names_the_key():
    target = ModelFacts("t", 64, max_position_embeddings=512)
    draft = ModelFacts("small-draft", 64, max_position_embeddings=256)
    with pytest.raises(ConfigError, match=r"model\.max_context_len=300 exceeds the 256 positions of 'small-draft'"):
        check_pair(target, draft, 300)
    assert check_pair(target, None, 300) == 300  # no draft loaded: only the target bounds it


def test_vocabularies_are_compared_by_size_then_by_tokens():
    with pytest.raises(ConfigError, match=r"draft 'd' and target 't'.*64 vs 80.*model\.draft\.source"):
        check_pair(ModelFacts("t", 64), ModelFacts("d", 80), None)
    with pytest.raises(ConfigError, match="tokenizer vocabularies differ"):
        check_pair(ModelFacts("t", 2, {"a": 0, "b": 1}), ModelFacts("d", 2, {"a": 1, "b": 0}), None)
    check_pair(ModelFacts("t", 2, {"a": 0, "b": 1}), ModelFacts("d", 2, {"a": 0, "b": 1}), None)
    check_pair(ModelFacts("t", 2, {"a": 0}), ModelFacts("d", 2), None)  # unknown: not compared


def test_declared_context_comes_from_config_json(tmp_path):
    for name, positions in (("t", 512), ("d", 128)):
        (tmp_path / name).mkdir()
        config = {"vocab_size": 64, "max_position_embeddings": positions}
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    model = ModelConfig(
        target=ModelSpec(str(tmp_path / "t"), "dir"), draft=ModelSpec(str(tmp_path / "d"), "dir"), max_context_len=200
    )
    with pytest.raises(ConfigError, match=r"model\.max_context_len=200"):
        check_declared_pair(model)
    assert check_declared_pair(model, with_draft=False) == 200


def test_specs_are_checked_with_their_keys():
    with pytest.raises(ConfigError, match=r"model\.draft\.num_layers >= 1"):
        ModelConfig(draft=ModelSpec(kind="truncated"))
    with pytest.raises(ConfigError, match=r"model\.target\.kind=distilled"):
        ModelConfig(target=ModelSpec(kind="distilled"))
    with pytest.raises(ConfigError, match=r"model\.target\.kind='pickle' is unknown"):
        ModelSpec(kind="pickle").check("model.target", is_draft=False)
