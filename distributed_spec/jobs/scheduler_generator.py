"""The job's Generator over the engine's scheduler: what the local and the Ray generators share.

`SchedulerGenerator.stream` turns job items into engine requests (each seeded from (sampling.seed,
record id), with the record's own sampling settings) and runs them through the scheduler of its
backend: the SpeculativeEngine (jobs/local_generator.py) or the RayCoordinator (jobs/ray_generator.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

from distributed_spec.config import ConfigError, JobConfig
from distributed_spec.engine import EngineConfig, RunStats
from distributed_spec.engine.scheduler import Scheduler
from distributed_spec.engine.speculative import make_request, to_result
from distributed_spec.jobs.generator import GenerationItem


class SchedulerGenerator:
    """The job's Generator over anything that runs the engine's scheduler (`self.backend`: the
    SpeculativeEngine here, the RayCoordinator in ray_generator.py) with `self._config`."""

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
        self._config = job.engine_config(self._config.eos_token_ids)
        self.backend.config = self._config

    def stream(self, items: Iterable[GenerationItem]) -> Iterator[tuple[Any, Any]]:
        self._scheduler = self.backend.scheduler()
        vocab_size = self.backend.vocab_size
        requests = (request_for_item(item, self._config, vocab_size, self.max_context_len) for item in items)
        for request in self._scheduler.run(requests):
            yield request.key, to_result(request)


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
        sampling=dataclasses.replace(config.sampling.params, **overrides) if overrides else None,
        seed=own.seed,
        stop_strings=own.stop,
    )
