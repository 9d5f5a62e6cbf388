"""Resident memory of this process (Linux /proc), for per-shard load measurements.

    reset_peak_rss(); before = rss_bytes(); ...load...; growth = peak_rss_bytes() - before

`ru_maxrss` is a high-water mark for the process's whole life (imports included), so a load that
peaks below an earlier spike would look free; writing "5" to /proc/self/clear_refs resets the
high-water mark (VmHWM) to the current resident size. Elsewhere (not Linux) the functions return 0.
"""

from __future__ import annotations

from pathlib import Path

_STATUS = Path("/proc/self/status")


def _status_kb(field: str) -> int:
    if not _STATUS.exists():
        return 0
    for line in _STATUS.read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0


def reset_peak_rss() -> None:
    """Make the high-water mark equal to the current resident size (no-op where unsupported)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def rss_bytes() -> int:
    """Current resident set size."""
    return _status_kb("VmRSS") * 1024


def peak_rss_bytes() -> int:
    """Highest resident set size since the last `reset_peak_rss` (or since the process started)."""
    return _status_kb("VmHWM") * 1024
