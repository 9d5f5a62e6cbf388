"""Running metrics of a generation job, defined once (docs/design.md section 2).

- block efficiency: tokens produced per target call, counting the correction/bonus token, in [1, g+1].
- mean accepted length: accepted draft tokens per target call.
- acceptance per position i: fraction of iterations that verified draft position i and kept it.
- tokens/s: generated tokens over the wall-clock time of this run (model loading excluded).
The engine counts (engine.config.RunStats); this module sums its batches and adds the job's own
counts (records, errors, wall-clock).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distributed_spec.engine.config import GenerationResult, RunStats


def _empty_run_stats() -> RunStats:
    # Imported here: the engine pulls in torch and transformers, which start-time checks should not wait for.
    from distributed_spec.engine.config import RunStats

    return RunStats()


def record_stats(result: GenerationResult) -> dict[str, Any]:
    """Per-record stats written next to each completion."""
    stats = result.stats
    return {
        "num_new_tokens": stats.num_tokens,
        "num_target_calls": stats.num_iterations,
        "num_accepted": stats.num_accepted,
        "block_efficiency": stats.block_efficiency,
    }


@dataclass
class RunMetrics:
    """Sums over the records completed in this run (a resumed run counts only its own work)."""

    num_records: int = 0
    num_errors: int = 0
    num_prompt_tokens: int = 0
    # Engine counters of this run's finished streams (a stream: one continuous-batching run of the
    # generator; the job starts another after a failure).
    closed: RunStats = field(default_factory=_empty_run_stats)
    # The counters of the stream going on (the generator's live object), or None.
    live: RunStats | None = None
    start_time: float = field(default_factory=time.perf_counter)
    # Per-replica metrics (`replica/<i>/tokens_per_s`, `replica/<i>/restarts`, ...) of a runtime with
    # replicas (jobs/replicas.py), or None.
    replicas: Callable[[], dict[str, float]] | None = None

    def add_record(self, num_prompt_tokens: int) -> None:
        self.num_records += 1
        self.num_prompt_tokens += num_prompt_tokens

    def close_stream(self, stats: RunStats) -> None:
        """Fold a finished stream's counters in (each stream's once)."""
        if stats is not None and stats is not getattr(self, "_last_closed", None):
            self.closed = self.closed.merge(stats)
            self._last_closed = stats
        self.live = None

    @property
    def engine(self) -> RunStats:
        """Engine counters of the whole run so far."""
        return self.closed if self.live is None else self.closed.merge(self.live)

    @property
    def runtime(self) -> dict[str, float]:
        """Additive counters beyond the engine's own (the Ray runtime's transfer time, wire bytes,
        restarts; the proposers' rows and tokens), summed."""
        return self.engine.extra

    @property
    def wall_time_s(self) -> float:
        return time.perf_counter() - self.start_time

    @property
    def tokens_per_s(self) -> float:
        wall_time_s = self.wall_time_s
        return self.engine.num_tokens / wall_time_s if wall_time_s > 0 else 0.0

    @property
    def block_efficiency(self) -> float:
        return self.engine.block_efficiency

    def snapshot(self) -> dict[str, Any]:
        """Flat scalar metrics for a tracker: one key per draft position for acceptance."""
        metrics: dict[str, Any] = {
            "records": self.num_records,
            "errors": self.num_errors,
            "prompt_tokens": self.num_prompt_tokens,
            "new_tokens": self.engine.num_tokens,
            "target_calls": self.engine.num_target_calls,
            "tokens_per_s": self.tokens_per_s,
            "block_efficiency": self.engine.block_efficiency,
            "mean_accepted_length": self.engine.mean_accepted_length,
            "wall_time_s": self.wall_time_s,
            "time/draft_s": self.engine.draft_s,
            "time/target_s": self.engine.target_s,
            "time/verify_s": self.engine.verify_s,
            "time/other_s": self.engine.other_s,
        }
        engine = self.engine
        for position, acceptance in enumerate(engine.acceptance_per_position, start=1):
            metrics[f"acceptance/pos_{position}"] = acceptance
        # The draft-length schedule's choices: steps per g (g = 0: no draft in that step).
        for g, count in enumerate(engine.num_steps_per_draft_len):
            metrics[f"draft_len/steps_g{g}"] = count
        for name, value in self.runtime.items():
            # Counters that name their own group (proposer/rows_ngram, ...) keep it.
            metrics[name if "/" in name else f"runtime/{name}"] = value
        if self.replicas is not None:
            metrics.update(self.replicas())
        return metrics
