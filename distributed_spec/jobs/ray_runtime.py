"""`parallel.runtime=ray`: the Ray coordinator (distributed_spec/distributed/) behind the job's Generator.

The target is sharded over `parallel.tp_size` actors and the draft runs in its own actor; each actor
builds its model from a picklable factory. The job process loads only the tokenizer. Ray starts
in-process when `parallel.ray_address` is null, or joins the cluster it names (`auto` in a Ray job).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from distributed_spec.config import ConfigError, JobConfig, ModelConfig
from distributed_spec.distributed import RayCoordinator
from distributed_spec.distributed.factories import SpecFactory
from distributed_spec.jobs.local_runtime import engine_config, eos_ids, model_spec
from distributed_spec.jobs.runtime import BatchOutput
from distributed_spec.models import ModelSpec

logger = logging.getLogger(__name__)

# Counters of distributed.coordinator.RuntimeTimings that the job tracks (draft/target/verify time
# are in RunStats already).
RUNTIME_COUNTERS = (
    "transfer_s",
    "coordinator_s",
    "draft_overlapped_s",
    "num_wire_bytes",
    "num_overlap_hits",
    "num_restarts",
)


def load_tokenizer(model: ModelConfig, target_spec: ModelSpec):
    """The pair's tokenizer without loading weights: model.tokenizer, else the target's."""
    from transformers import AutoTokenizer

    from distributed_spec.models.fetch import smollm2_gguf_path

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


class RayGenerator:
    """A RayCoordinator started once for the whole job (each batch reuses its actors)."""

    def __init__(self, job: JobConfig) -> None:
        runtime = job.parallel.ray_runtime_config()
        target_spec = model_spec(job.model, job.model.target, runtime.device)
        draft_spec = model_spec(job.model, job.model.draft, runtime.device)
        self.tokenizer = load_tokenizer(job.model, target_spec)
        self._config = engine_config(job, eos_ids(self.tokenizer, None))
        self.coordinator = RayCoordinator(
            SpecFactory(target_spec),
            SpecFactory(draft_spec, target_spec=target_spec),
            self._config,
            runtime,
            tokenizer=self.tokenizer,
        )
        try:
            self.coordinator.start()
        except ValueError as err:
            self.coordinator.close()
            raise ConfigError(f"parallel/model: {err}") from err
        contexts = [
            context for context in (job.model.max_context_len, self.coordinator.actors.max_context) if context
        ]
        self.max_context_len = min(contexts) if contexts else 1 << 30
        logger.info(
            "ray runtime up: target %s over %d shard(s) on %s, draft %s",
            target_spec.source,
            runtime.tp_size,
            runtime.device,
            draft_spec.source,
        )

    def generate(self, prompt_ids: list[list[int]], seed: int) -> BatchOutput:
        self.coordinator.config = dataclasses.replace(self._config, seed=seed)
        results, stats = self.coordinator.generate_with_stats(prompt_ids)
        # The coordinator resets its timings per call: these are this batch's.
        timings = self.coordinator.timings
        extra = {name: float(getattr(timings, name)) for name in RUNTIME_COUNTERS}
        return BatchOutput(results=results, stats=stats, extra=extra)

    def close(self) -> None:
        self.coordinator.close()
