"""Trackers: where the job's config, metrics, sample completions and summary go.

`build_tracker(tracking, run_dir, config, tags)` returns one object with the same four verbs whatever
is configured, so the job loop has no `if wandb` branches:

- `tracking.mode=offline` (default): W&B writes the run under `<run_dir>/wandb/` with no account and
  no network; `wandb sync <that folder>` uploads it later.
- `tracking.mode=online`: W&B uploads as it goes (needs `wandb login` or WANDB_API_KEY).
- `tracking.mode=disabled`: no W&B at all.
The console tracker (log lines every `tracking.log_every` batches) is always there.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from distributed_spec.config import TrackingConfig

logger = logging.getLogger(__name__)

SAMPLE_COLUMNS = ("id", "prompt", "completion", "finish_reason", "num_new_tokens", "block_efficiency")


class Tracker:
    """The no-op tracker; subclasses override what they record."""

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Metrics over time (step: engine batches done in this run)."""

    def log_samples(self, rows: list[tuple[Any, ...]]) -> None:
        """Sample completions, one tuple per row in SAMPLE_COLUMNS order."""

    def summary(self, metrics: dict[str, Any]) -> None:
        """Final values of the run."""

    def finish(self, exit_code: int = 0) -> None:
        """Flush and close; safe to call twice. exit_code != 0 marks the run as failed."""


class ConsoleTracker(Tracker):
    """Debug log lines through the job's logger (the progress bar and the summary table show the values)."""

    def log(self, metrics: dict[str, Any], step: int) -> None:
        logger.debug(
            "step %d: %d records, %.1f tokens/s, block efficiency %.3f",
            step,
            metrics["records"],
            metrics["tokens_per_s"],
            metrics["block_efficiency"],
        )

    def summary(self, metrics: dict[str, Any]) -> None:
        logger.debug("summary: %s", {key: metrics[key] for key in sorted(metrics)})


class WandbTracker(Tracker):
    """A W&B run, online or offline, holding the resolved config, metrics, samples and summary."""

    def __init__(
        self, tracking: TrackingConfig, run_dir: Path, config: dict[str, Any], tags: list[str]
    ) -> None:
        import wandb

        wandb_dir = run_dir / "wandb"
        wandb_dir.mkdir(parents=True, exist_ok=True)
        # WANDB_DIR too: wandb's own helpers (artifacts, staging) follow it rather than `dir=`; set per
        # run because a Hydra multirun runs its jobs one after another in this process.
        os.environ["WANDB_DIR"] = str(run_dir)
        self._wandb = wandb
        self._run = wandb.init(
            mode=tracking.mode,
            project=tracking.project,
            entity=tracking.entity,
            name=tracking.name,
            tags=sorted(set(tracking.tags) | set(tags)),
            config=config,
            dir=str(run_dir),
            job_type="generate",
            # console="off": W&B does not capture stdout/stderr (the progress bar stays readable).
            settings=wandb.Settings(console="off", silent=True),
        )

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self._run.log(metrics, step=step)

    def log_samples(self, rows: list[tuple[Any, ...]]) -> None:
        table = self._wandb.Table(columns=list(SAMPLE_COLUMNS), data=[list(row) for row in rows])
        self._run.log({"samples": table})

    def summary(self, metrics: dict[str, Any]) -> None:
        for key, value in metrics.items():
            self._run.summary[key] = value

    def finish(self, exit_code: int = 0) -> None:
        if self._run is not None:
            self._run.finish(exit_code=exit_code)
            self._run = None


class MultiTracker(Tracker):
    """Fans every call out to several trackers."""

    def __init__(self, trackers: list[Tracker]) -> None:
        self.trackers = trackers

    def log(self, metrics: dict[str, Any], step: int) -> None:
        for tracker in self.trackers:
            tracker.log(metrics, step)

    def log_samples(self, rows: list[tuple[Any, ...]]) -> None:
        for tracker in self.trackers:
            tracker.log_samples(rows)

    def summary(self, metrics: dict[str, Any]) -> None:
        for tracker in self.trackers:
            tracker.summary(metrics)

    def finish(self, exit_code: int = 0) -> None:
        for tracker in self.trackers:
            tracker.finish(exit_code)


def build_tracker(
    tracking: TrackingConfig, run_dir: Path, config: dict[str, Any], tags: list[str]
) -> Tracker:
    """The console tracker, plus W&B unless tracking.mode=disabled."""
    trackers: list[Tracker] = [ConsoleTracker()]
    if tracking.mode != "disabled":
        trackers.append(WandbTracker(tracking, run_dir, config, tags))
    return MultiTracker(trackers)
