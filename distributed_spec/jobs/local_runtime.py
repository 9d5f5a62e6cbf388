"""`parallel.runtime=local`: the single-process engine behind the job's Generator interface.

Loads the pair with distributed_spec.models.load_pair (which checks the shared vocabulary) on
`parallel.device`, and decodes with distributed_spec.engine.SpeculativeEngine.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from distributed_spec.config import ConfigError, JobConfig, ModelConfig, ModelSourceConfig
from distributed_spec.engine import EngineConfig, SpeculativeEngine
from distributed_spec.jobs.runtime import BatchOutput
from distributed_spec.models import ModelSpec, load_pair
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
        sampling=SamplingParams(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p),
        max_new_tokens=sampling.max_new_tokens,
        max_batch_size=job.data.batch_size,
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


class LocalGenerator:
    """The pair and the engine in this process."""

    def __init__(self, job: JobConfig) -> None:
        device = job.parallel.resolved_device()
        if job.parallel.num_threads is not None:
            torch.set_num_threads(job.parallel.num_threads)
        target_spec = model_spec(job.model, job.model.target, device)
        draft_spec = model_spec(job.model, job.model.draft, device)
        try:
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
        self._config = engine_config(job, eos_ids(tokenizer, target.model))
        self.engine = SpeculativeEngine(target.model, draft.model, self._config, tokenizer)
        contexts = [context for context in (job.model.max_context_len, self.engine.max_context) if context]
        self.max_context_len = min(contexts) if contexts else 1 << 30
        logger.info(
            "loaded target %s and draft %s on %s (context %d, eos ids %s)",
            target.name,
            draft.name,
            device,
            self.max_context_len,
            self._config.eos_token_ids,
        )

    def generate(self, prompt_ids: list[list[int]], seed: int) -> BatchOutput:
        self.engine.config = dataclasses.replace(self._config, seed=seed)
        results, stats = self.engine.generate_with_stats(prompt_ids)
        return BatchOutput(results=results, stats=stats)

    def close(self) -> None:
        self.engine = None
