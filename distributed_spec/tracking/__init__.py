"""Metrics, trackers (W&B online/offline/disabled, console), progress and the summary table.

Loggers of the job come from `rank_zero_logger(__name__)`, quiet on every rank but 0.
"""

from __future__ import annotations

import logging
import os


class RankZeroFilter(logging.Filter):
    """Passes records only in the process of rank 0 (RANK unset counts as 0: a single process)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return os.environ.get("RANK", "0") == "0"


def rank_zero_logger(name: str) -> logging.Logger:
    """`logging.getLogger(name)` that stays quiet on every rank but 0 (use with lazy % formatting)."""
    logger = logging.getLogger(name)
    if not any(isinstance(existing, RankZeroFilter) for existing in logger.filters):
        logger.addFilter(RankZeroFilter())
    return logger
