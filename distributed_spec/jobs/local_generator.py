"""`parallel.runtime=local`: the single-process engine behind the job's Generator interface.

Loads the pair with distributed_spec.models.load_pair (which checks it: vocabulary, context) on
`parallel.device`, and decodes with distributed_spec.engine.SpeculativeEngine.
"""

from __future__ import annotations

import logging

import torch

from distributed_spec.config import ConfigError, JobConfig
from distributed_spec.engine import SpeculativeEngine
from distributed_spec.jobs.scheduler_generator import SchedulerGenerator
from distributed_spec.models import load_model, load_pair
from distributed_spec.models.cpu_linear import pack_cpu_linears
from distributed_spec.models.tokenizers import eos_ids

logger = logging.getLogger(__name__)


class LocalGenerator(SchedulerGenerator):
    """The pair and the engine in this process."""

    def __init__(self, job: JobConfig) -> None:
        device = job.parallel.resolve().device
        if job.parallel.num_threads is not None:
            torch.set_num_threads(job.parallel.num_threads)
        model = job.model
        try:
            if not job.verifier.uses_draft_model:
                # The baseline, or n-gram blocks: the target alone, no draft loaded.
                target, draft = load_model(
                    model.target,
                    device=device,
                    dtype=model.dtype,
                    trust_remote_code=model.trust_remote_code,
                    role="target",
                ), None
            else:
                target, draft = load_pair(model, device)
        except ValueError as err:
            # Vocabulary mismatch, missing files, bad kinds: configuration, not a crash.
            raise ConfigError(f"model: {err}") from err
        if model.cpu_prepack:
            for loaded in (target, draft):
                if loaded is not None:
                    logger.info("model.cpu_prepack: %d linears of %s packed", pack_cpu_linears(loaded.model), loaded.name)
        tokenizer = target.tokenizer
        if model.tokenizer is not None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model.tokenizer, trust_remote_code=model.trust_remote_code)
        if tokenizer is None:
            raise ConfigError(f"model.target {target.name!r} has no tokenizer; set model.tokenizer")
        self.tokenizer = tokenizer
        self.has_draft_model = draft is not None
        self._config = job.engine_config(eos_ids(tokenizer, target.model))
        self.engine = SpeculativeEngine(
            target.model,
            draft.model if draft else None,
            self._config,
            tokenizer,
            max_context_len=model.max_context_len,
        )
        self.backend = self.engine
        # The engine's context is the pair's, capped by model.max_context_len (models.check_pair).
        self.max_context_len = self.engine.max_context or 1 << 30
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
