"""Live progress bar (tqdm, on stderr) and the end-of-run summary table (rich)."""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm

from distributed_spec.tracking.metrics import RunMetrics


class Progress:
    """Records done, tokens/s and running block efficiency; disabled -> does nothing."""

    def __init__(self, total: int | None, initial: int, enabled: bool) -> None:
        self._bar = tqdm(
            total=total,
            initial=initial,
            unit="rec",
            desc="generate",
            disable=not enabled,
            file=sys.stderr,
            dynamic_ncols=True,
            # In a log file (Slurm, Ray job logs) every refresh is a line: refresh rarely there.
            mininterval=0.5 if sys.stderr.isatty() else 30.0,
        )

    def update(self, num_records: int, metrics: RunMetrics) -> None:
        self._bar.update(num_records)
        postfix = {
            "tok_s": f"{metrics.tokens_per_s:.1f}",
            "block_eff": f"{metrics.block_efficiency:.2f}",
            "errors": metrics.num_errors,
        }
        if metrics.replicas is not None:
            # One bar for the whole job; the replicas live and their restarts so far.
            replicas = metrics.replicas()
            postfix["replicas"] = int(replicas.get("replicas/live", 0))
            postfix["restarts"] = int(sum(v for k, v in replicas.items() if k.endswith("/restarts")))
        self._bar.set_postfix(**postfix, refresh=False)

    def close(self) -> None:
        self._bar.close()


def summary_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, value) rows of the summary table, in display order."""
    rows = [
        ("records completed (this run)", f"{summary['records']}"),
        ("records in output (all runs)", f"{summary['records_total']}"),
        ("records skipped (resumed)", f"{summary['records_skipped']}"),
        ("errors (this run / all runs)", f"{summary['errors']} / {summary['errors_total']}"),
        ("new tokens", f"{summary['new_tokens']}"),
        ("wall-clock", f"{summary['wall_time_s']:.2f} s"),
        ("tokens/s", f"{summary['tokens_per_s']:.2f}"),
        ("target calls", f"{summary['target_calls']}"),
        ("block efficiency", f"{summary['block_efficiency']:.3f}"),
        ("mean accepted length", f"{summary['mean_accepted_length']:.3f}"),
        ("time draft / target / verify", _time_split(summary)),
        ("acceptance per position", " ".join(f"{value:.2f}" for value in summary["acceptance_per_position"])),
    ]
    return rows


def _time_split(summary: dict[str, Any]) -> str:
    parts = (summary["time/draft_s"], summary["time/target_s"], summary["time/verify_s"])
    return " / ".join(f"{value:.2f} s" for value in parts)


def print_summary(summary: dict[str, Any], title: str) -> None:
    """The summary table on stderr (stdout stays free for the caller)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    for name, value in summary_rows(summary):
        table.add_row(name, value)
    Console(stderr=True).print(table)
