"""What the job needs from a runtime, and how `parallel.runtime` picks one.

The job talks to a `Generator`: a tokenizer, a context length, and `stream(items)`, which decodes a
stream of prompts with continuous batching and yields each as it finishes. `parallel.runtime=local` wraps the single-process engine (distributed_spec/engine/),
`parallel.runtime=ray` the Ray coordinator (distributed_spec/distributed/); both are imported
lazily, so a missing runtime fails with a clear message only when it is asked for.

Terms as in docs/design.md: a target call verifies one draft block of up to g tokens; it keeps an
accepted prefix and emits one correction or bonus token; block efficiency = tokens per target call.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

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
