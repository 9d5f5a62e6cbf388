"""The one check of a target/draft pair: a shared vocabulary, and the context length they can hold.

    context = check_pair(target_facts, draft_facts, model.max_context_len)

Speculative decoding compares the two models' probabilities token by token (docs/design.md
section 1), so draft and target must agree on every token id and on the logits' width. Each place
that learns something about the models checks what it knows with this function: config.json files
before loading (`check_declared_pair`), the loaded models and tokenizers (models.loading.load_pair),
the engine's runners (engine/speculative.py) and the Ray actors' load reports (distributed/group.py).
Torch-free: a `ModelFacts` is built from whatever the caller holds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distributed_spec.errors import ConfigError
from distributed_spec.models.config import ModelConfig, ModelSpec


@dataclass(frozen=True)
class ModelFacts:
    """What is known of one model at some point; None: not known there."""

    # How the messages name the model (its source, or the loaded model's name).
    name: str
    # Width of the logits (config.vocab_size); a sub-vocabulary draft head still has the full width.
    vocab_size: int | None = None
    # The tokenizer's token -> id map, when a tokenizer is at hand (and not the other model's own).
    vocabulary: Mapping[str, int] | None = None
    max_position_embeddings: int | None = None

    @classmethod
    def of_model(cls, model: Any, name: str | None = None, tokenizer: Any = None) -> ModelFacts:
        """The facts of a built model (anything with a Hugging Face `config`) and its tokenizer."""
        config = getattr(model, "config", None)
        vocab_size = getattr(config, "vocab_size", None)
        return cls(
            name=name or getattr(model, "name_or_path", "") or type(model).__name__,
            vocab_size=int(vocab_size) if vocab_size is not None else None,
            vocabulary=tokenizer.get_vocab() if tokenizer is not None else None,
            max_position_embeddings=getattr(config, "max_position_embeddings", None),
        )


def check_pair(target: ModelFacts, draft: ModelFacts | None, max_context_len: int | None) -> int | None:
    """Raise ConfigError unless draft (None: no draft) and target share a vocabulary, or when
    model.max_context_len exceeds what the models hold; return the pair's context length (None when
    nothing bounds it)."""
    if draft is not None:
        problem = _vocabulary_problem(target, draft)
        if problem is not None:
            raise ConfigError(
                f"draft {draft.name!r} and target {target.name!r} do not share a vocabulary: {problem}. "
                "Speculative decoding compares their probabilities token by token: set model.draft.source "
                "to a draft trained with the tokenizer of model.target.source"
            )
    models = [facts for facts in (target, draft) if facts is not None and facts.max_position_embeddings]
    model_context = min((facts.max_position_embeddings for facts in models), default=None)
    if max_context_len is None or model_context is None:
        return max_context_len if model_context is None else model_context
    if max_context_len > model_context:
        holder = min(models, key=lambda facts: facts.max_position_embeddings)
        raise ConfigError(
            f"model.max_context_len={max_context_len} exceeds the {model_context} positions of {holder.name!r} "
            "(max_position_embeddings): lower model.max_context_len or set it to null"
        )
    return max_context_len


def _vocabulary_problem(target: ModelFacts, draft: ModelFacts) -> str | None:
    if target.vocab_size is not None and draft.vocab_size is not None and target.vocab_size != draft.vocab_size:
        return (
            f"model.draft.source has vocabulary size {draft.vocab_size} but target {target.name!r} has "
            f"{target.vocab_size} ({target.vocab_size} vs {draft.vocab_size} logits)"
        )
    if target.vocabulary is not None and draft.vocabulary is not None and target.vocabulary != draft.vocabulary:
        differing = sorted(set(target.vocabulary.items()) ^ set(draft.vocabulary.items()))[:3]
        return (
            f"tokenizer vocabularies differ ({len(target.vocabulary)} vs {len(draft.vocabulary)} tokens; "
            f"e.g. {differing})"
        )
    return None


def declared_facts(spec: ModelSpec) -> ModelFacts | None:
    """The facts a model's config.json declares when it is on disk (a directory or the hub cache),
    read without loading anything; None for GGUF files and drafts derived from the target."""
    kind = spec.resolved_kind
    if kind not in ("dir", "hub"):
        return None
    path = Path(spec.source).expanduser()
    config_path: Path | str | None = path / "config.json" if path.is_dir() else None
    if config_path is None and kind == "hub":
        from huggingface_hub import try_to_load_from_cache  # noqa: PLC0415 - only for hub sources

        config_path = try_to_load_from_cache(spec.source, "config.json", revision=spec.revision)
    if not isinstance(config_path, (str, Path)) or not Path(config_path).is_file():
        return None
    config = json.loads(Path(config_path).read_text(encoding="utf-8"))
    # Multimodal configs keep the language model's keys under text_config.
    text = config.get("text_config", {})
    vocab_size = config.get("vocab_size", text.get("vocab_size"))
    positions = config.get("max_position_embeddings", text.get("max_position_embeddings"))
    return ModelFacts(
        name=spec.source,
        vocab_size=int(vocab_size) if vocab_size is not None else None,
        max_position_embeddings=int(positions) if positions is not None else None,
    )


def check_declared_pair(model: ModelConfig, with_draft: bool = True) -> int | None:
    """check_pair over the config.json files, before any weight loads (the loader checks the loaded
    models again); the context length they declare, None when no file is at hand."""
    target = declared_facts(model.target)
    if target is None:
        return None
    draft = declared_facts(model.draft) if with_draft else None
    return check_pair(target, draft, model.max_context_len)
