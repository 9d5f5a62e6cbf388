"""What the job needs from a runtime, and how `parallel.runtime` picks one.

The job talks to a `Generator`: a tokenizer, a context length, and `stream(items)`, which decodes a
stream of prompts with continuous batching and yields each as it finishes. `parallel.runtime=local` wraps the single-process engine (distributed_spec/engine/),
`parallel.runtime=ray` the Ray coordinator (distributed_spec/distributed/); both are imported
lazily, so a missing runtime fails with a clear message only when it is asked for.

Terms as in docs/design.md: a target call verifies one draft block of up to g tokens; it keeps an
accepted prefix and emits one correction or bonus token; block efficiency = tokens per target call.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from distributed_spec.config import DERIVED_KINDS, ConfigError, ModelConfig, ModelSourceConfig
from distributed_spec.jobs.io import RecordSampling

if TYPE_CHECKING:
    # Types only: importing the engine pulls in torch and transformers, which configuration
    # errors should not wait for.
    from distributed_spec.engine.config import GenerationResult, RunStats


@dataclass
class GenerationItem:
    """One prompt for `Generator.stream`."""

    # The caller's object (e.g. the pending record), handed back with its result.
    handle: Any
    # [num_prompt_tokens]
    prompt_ids: list[int]
    # Seeds the item's own random stream together with sampling.seed (the record id): a record's
    # completion does not depend on its batch, its runtime or a resume.
    seed_key: str
    # Tokens to generate at most; None: sampling.max_new_tokens.
    max_new_tokens: int | None = None
    # The item's own temperature, top-p, seed (replacing the seed from seed_key) and stop strings;
    # unset fields: the job's.
    sampling: RecordSampling = RecordSampling()


class Generator(Protocol):
    """A loaded target/draft pair that completes a stream of tokenised prompts."""

    # Hugging Face tokenizer of the pair (encode, decode, apply_chat_template, eos_token_id).
    tokenizer: Any
    # Longest sequence (prompt + completion) the pair can hold; longer prompts are per-record errors.
    max_context_len: int
    # Counters of the current (or last) stream: target calls, acceptance per position, g per step,
    # draft/target/verify time, runtime counters in `extra`.
    stats: RunStats

    def stream(self, items: Iterable[GenerationItem]) -> Iterator[tuple[Any, GenerationResult]]:
        """Decode every item (up to data.batch_size at once); yield (handle, result) as each finishes."""
        ...

    def close(self) -> None: ...


def _declared_vocab_size(source: ModelSourceConfig) -> int | None:
    """vocab_size from a model's config.json when it is on disk (a directory or the hub cache), else None."""
    if source.kind in DERIVED_KINDS or source.kind in ("smollm2", "gguf") or source.source.endswith(".gguf"):
        return None
    path = Path(source.source).expanduser()
    config_path: Path | str | None = path / "config.json" if path.is_dir() else None
    if config_path is None and source.kind in ("auto", "hub"):
        from huggingface_hub import try_to_load_from_cache

        config_path = try_to_load_from_cache(source.source, "config.json", revision=source.revision)
    if not isinstance(config_path, (str, Path)) or not Path(config_path).is_file():
        return None
    config = json.loads(Path(config_path).read_text(encoding="utf-8"))
    vocab_size = config.get("vocab_size", config.get("text_config", {}).get("vocab_size"))
    return int(vocab_size) if vocab_size is not None else None


def check_vocab_sizes(model: ModelConfig) -> None:
    """Refuse a pair whose config files declare different vocabularies, before loading weights.

    The loader checks the loaded tokenizers and LM heads again; this catches what it can early.
    """
    target_size = _declared_vocab_size(model.target)
    draft_size = _declared_vocab_size(model.draft)
    if target_size is not None and draft_size is not None and target_size != draft_size:
        raise ConfigError(
            f"model.draft.source={model.draft.source!r} has a vocabulary of {draft_size} tokens but "
            f"model.target.source={model.target.source!r} has {target_size}: pick a draft that shares "
            "the target's tokenizer"
        )
