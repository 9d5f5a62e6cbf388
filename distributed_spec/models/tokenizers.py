"""The pair's tokenizer and end-of-sequence ids, read without loading weights where possible.

    from distributed_spec.models.tokenizers import eos_ids, load_generation_config, load_tokenizer
"""

from __future__ import annotations

from pathlib import Path

from distributed_spec.models.config import ModelConfig


def eos_ids(tokenizer, model) -> tuple[int, ...]:
    """End-of-sequence ids from the tokenizer and the model's generation config (it may list several)."""
    ids: set[int] = set()
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    generation_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(generation_eos, int):
        ids.add(generation_eos)
    elif generation_eos:
        ids.update(int(token_id) for token_id in generation_eos)
    return tuple(sorted(ids))


def load_generation_config(model: ModelConfig):
    """The target's generation config (its EOS ids) without loading weights, or None if it has none."""
    from transformers import GenerationConfig

    target_spec = model.target
    if target_spec.resolved_kind not in ("hub", "dir", "auto"):
        return None
    extra = {"revision": target_spec.revision} if target_spec.revision is not None else {}
    try:
        return GenerationConfig.from_pretrained(
            target_spec.source, trust_remote_code=model.trust_remote_code, **extra
        )
    except (OSError, ValueError):
        return None


class GenerationConfigHolder:
    """What eos_ids reads from a model: its generation_config."""

    def __init__(self, generation_config) -> None:
        self.generation_config = generation_config


def load_tokenizer(model: ModelConfig):
    """The pair's tokenizer without loading weights: model.tokenizer, else the target's."""
    from transformers import AutoTokenizer

    from distributed_spec.models.fetch import smollm2_gguf_path

    target_spec = model.target
    extra: dict[str, str] = {}
    if model.tokenizer is not None:
        location = model.tokenizer
    elif target_spec.resolved_kind in ("smollm2", "gguf"):
        gguf_path = (
            smollm2_gguf_path() if target_spec.resolved_kind == "smollm2" else Path(target_spec.source)
        )
        location, extra = str(gguf_path.parent), {"gguf_file": gguf_path.name}
    else:
        location = target_spec.source
        if target_spec.revision is not None:
            extra["revision"] = target_spec.revision
    return AutoTokenizer.from_pretrained(location, trust_remote_code=model.trust_remote_code, **extra)
