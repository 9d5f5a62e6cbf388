"""Running metrics of a generation job, defined once (DESIGN.md section 4).

- block efficiency: tokens produced per target call, counting the correction/bonus token, in [1, g+1].
- mean accepted length: accepted draft tokens per target call.
- acceptance per position i: fraction of iterations that verified draft position i and kept it.
- tokens/s: generated tokens over the wall-clock time of this run (model loading excluded).
The engine counts (engine.config.RunStats); this module sums its batches and adds the job's own
counts (records, errors, wall-clock).
"""

from __future__ import annotations

import time
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
    # Engine counters summed over this run's batches.
    engine: RunStats = field(default_factory=_empty_run_stats)
    # Runtime-specific counters (jobs.runtime.BatchOutput.extra), summed.
    runtime: dict[str, float] = field(default_factory=dict)
    start_time: float = field(default_factory=time.perf_counter)

    def add_batch(
        self, stats: RunStats, num_records: int, num_prompt_tokens: int, extra: dict[str, float] | None = None
    ) -> None:
        self.engine = self.engine.merge(stats)
        self.num_records += num_records
        self.num_prompt_tokens += num_prompt_tokens
        for name, value in (extra or {}).items():
            self.runtime[name] = self.runtime.get(name, 0.0) + value

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
        for position, acceptance in enumerate(self.engine.acceptance_per_position, start=1):
            metrics[f"acceptance/pos_{position}"] = acceptance
        for name, value in self.runtime.items():
            metrics[f"runtime/{name}"] = value
        return metrics
