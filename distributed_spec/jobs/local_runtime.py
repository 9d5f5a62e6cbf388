"""`parallel.runtime=local`: the single-process engine behind the job's Generator interface.

Loads the pair with distributed_spec.models.load_pair (which checks the shared vocabulary) on
`parallel.device`, and decodes with distributed_spec.engine.SpeculativeEngine.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from distributed_spec.config import ConfigError, JobConfig, ModelConfig, ModelSourceConfig
from distributed_spec.engine import EngineConfig, RunStats, SpeculativeEngine
from distributed_spec.engine.scheduler import Scheduler
from distributed_spec.engine.speculative import make_request, to_result
from distributed_spec.jobs.runtime import GenerationItem
from distributed_spec.models import ModelSpec, load_model, load_pair
from distributed_spec.verify import SamplingParams

logger = logging.getLogger(__name__)


def model_spec(model: ModelConfig, source: ModelSourceConfig, device: str) -> ModelSpec:
    return ModelSpec(
        source=source.source,
        kind=source.kind,
        dtype=model.dtype,
        device=device,
        num_layers=source.num_layers,
        trust_remote_code=model.trust_remote_code,
        revision=source.revision,
    )


def engine_config(job: JobConfig, eos_token_ids: tuple[int, ...]) -> EngineConfig:
    sampling = job.sampling
    return EngineConfig(
        method=job.verifier.method,
        gamma=job.verifier.gamma,
        gamma_schedule=job.verifier.gamma_schedule,
        max_gamma=job.verifier.max_gamma,
        draft_confidence_threshold=job.verifier.draft_confidence_threshold,
        proposer=job.verifier.proposer,
        ngram_min=job.verifier.ngram_min,
        ngram_max=job.verifier.ngram_max,
        sampling=SamplingParams(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p),
        max_new_tokens=sampling.max_new_tokens,
        max_batch_size=job.data.batch_size,
        continuous_batching=job.engine.continuous_batching,
        prefill_chunk_tokens=job.engine.prefill_chunk_tokens,
        seed=sampling.seed,
        eos_token_ids=eos_token_ids,
        stop_strings=tuple(sampling.stop),
    )


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


class SchedulerGenerator:
    """The job's Generator over anything that runs the engine's scheduler (`self.backend`: the
    SpeculativeEngine here, the RayCoordinator in ray_runtime.py) with `self._config`."""

    backend: Any
    _config: EngineConfig
    max_context_len: int
    # Whether a draft model was loaded (not for the baseline, nor for proposer=ngram).
    has_draft_model: bool
    _scheduler: Scheduler | None = None

    @property
    def stats(self) -> RunStats:
        return self._scheduler.stats if self._scheduler is not None else RunStats()

    def reconfigure(self, job: JobConfig) -> None:
        """Decode later streams with job's verifier, engine and sampling settings (same loaded models;
        sweeps and benchmarks use it). The method must need no draft that was not loaded."""
        if job.verifier.uses_draft_model and not self.has_draft_model:
            raise ConfigError(
                f"verifier.method={job.verifier.method} with verifier.proposer={job.verifier.proposer} needs "
                "the draft model, which this generator did not load"
            )
        self._config = engine_config(job, self._config.eos_token_ids)
        self.backend.config = self._config

    def stream(self, items: Iterable[GenerationItem]) -> Iterator[tuple[Any, Any]]:
        self._scheduler = self.backend.scheduler()
        vocab_size = self.backend.vocab_size
        requests = (request_for_item(item, self._config, vocab_size, self.max_context_len) for item in items)
        for request in self._scheduler.run(requests):
            yield request.key, to_result(request)


class LocalGenerator(SchedulerGenerator):
    """The pair and the engine in this process."""

    def __init__(self, job: JobConfig) -> None:
        device = job.parallel.resolved_device()
        if job.parallel.num_threads is not None:
            torch.set_num_threads(job.parallel.num_threads)
        target_spec = model_spec(job.model, job.model.target, device)
        draft_spec = model_spec(job.model, job.model.draft, device)
        try:
            if not job.verifier.uses_draft_model:
                # The baseline, or n-gram blocks: the target alone, no draft loaded.
                target, draft = load_model(target_spec), None
            else:
                target, draft = load_pair(target_spec, draft_spec)
        except ValueError as err:
            # Vocabulary mismatch, missing files, bad kinds: configuration, not a crash.
            raise ConfigError(f"model: {err}") from err
        tokenizer = target.tokenizer
        if job.model.tokenizer is not None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(
                job.model.tokenizer, trust_remote_code=job.model.trust_remote_code
            )
        if tokenizer is None:
            raise ConfigError(f"model.target {target.name!r} has no tokenizer; set model.tokenizer")
        self.tokenizer = tokenizer
        self.has_draft_model = draft is not None
        self._config = engine_config(job, eos_ids(tokenizer, target.model))
        self.engine = SpeculativeEngine(target.model, draft.model if draft else None, self._config, tokenizer)
        self.backend = self.engine
        contexts = [context for context in (job.model.max_context_len, self.engine.max_context) if context]
        self.max_context_len = min(contexts) if contexts else 1 << 30
        logger.info(
            "loaded target %s and draft %s on %s (context %d, eos ids %s)",
            target.name,
            draft.name if draft else "none",
            device,
            self.max_context_len,
            self._config.eos_token_ids,
        )

    def close(self) -> None:
        self.engine = self.backend = None


def request_for_item(item: GenerationItem, config: EngineConfig, vocab_size: int, max_context: int):
    """The engine request of a job item: seeded from (sampling.seed, record id) unless the item has its
    own seed, capped by the context (model.max_context_len included), with the item's own sampling
    settings over the job's."""
    own = item.sampling
    overrides = {
        name: value for name, value in (("temperature", own.temperature), ("top_p", own.top_p)) if value is not None
    }
    return make_request(
        item.prompt_ids,
        config,
        vocab_size,
        max_context,
        key=item.handle,
        seed_key=item.seed_key,
        max_new_tokens=item.max_new_tokens,
        sampling=dataclasses.replace(config.sampling, **overrides) if overrides else None,
        seed=own.seed,
        stop_strings=own.stop,
    )
