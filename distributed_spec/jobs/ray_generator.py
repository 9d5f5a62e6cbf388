"""`parallel.runtime=ray`: the Ray coordinator (distributed_spec/distributed/) behind the job's Generator.

The target is sharded over `parallel.tp_size` actors and the draft runs in its own actor; each actor
builds its model from a picklable factory. The job process loads only the tokenizer. Ray starts
in-process when `parallel.ray_address` is null, or joins the cluster it names (`auto` in a Ray job).
"""

from __future__ import annotations

import logging

from distributed_spec.config import ConfigError, JobConfig
from distributed_spec.distributed import RayCoordinator
from distributed_spec.distributed.factories import SpecFactory
from distributed_spec.distributed.group import LoadTimeoutError
from distributed_spec.jobs.scheduler_generator import SchedulerGenerator
from distributed_spec.models.tokenizers import (
    GenerationConfigHolder,
    eos_ids,
    load_generation_config,
    load_tokenizer,
)

logger = logging.getLogger(__name__)

class RayGenerator(SchedulerGenerator):
    """A RayCoordinator started once for the whole job (each stream reuses its actors)."""

    def __init__(self, job: JobConfig) -> None:
        # Device and backend settled once; a replica's job arrives resolved (jobs/replicas.py).
        runtime = job.parallel.resolve()
        target_factory, draft_factory = SpecFactory.for_pair(job.model, runtime.device)
        self.tokenizer = load_tokenizer(job.model)
        # The same EOS rule as the local runtime: the tokenizer's and the generation config's ids.
        generation_config = GenerationConfigHolder(load_generation_config(job.model))
        self._config = job.engine_config(eos_ids(self.tokenizer, generation_config))
        uses_draft = job.verifier.uses_draft_model
        self.has_draft_model = uses_draft
        self.coordinator = RayCoordinator(
            target_factory,
            draft_factory if uses_draft else None,
            self._config,
            runtime,
            tokenizer=self.tokenizer,
            max_context_len=job.model.max_context_len,
        )
        self.backend = self.coordinator
        try:
            self.coordinator.start()
        except BaseException as err:
            # Nothing owns the coordinator yet (a SIGTERM or Ctrl-C mid-load included): close it here.
            self.coordinator.close()
            if isinstance(err, ValueError):
                raise ConfigError(f"parallel/model: {err}") from err
            if isinstance(err, LoadTimeoutError):
                # One clear line naming the setting, not a traceback.
                raise ConfigError(str(err)) from err
            raise
        # The pair's context, capped by model.max_context_len (checked by the group: models.check_pair).
        self.max_context_len = self.coordinator.actors.max_context or 1 << 30
        logger.info(
            "ray runtime up: target %s over %d shard(s) on %s, draft %s",
            job.model.target.source,
            runtime.tp_size,
            runtime.device,
            job.model.draft.source if uses_draft else "none",
        )

    def close(self) -> None:
        self.coordinator.close()
