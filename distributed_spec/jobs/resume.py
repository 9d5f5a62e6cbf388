"""Resume: rerunning the same command skips finished work and repairs what a crash left behind.

The outputs are append-only JSONL files written whole line by whole line and fsynced in batches
(io.JsonlAppender). After a crash or SIGKILL a file holds whole lines plus, at worst, one torn last
line (no trailing newline, or not valid JSON). `scan_jsonl` drops that line by truncating the file,
and rewrites the file (atomically) if a middle line is unreadable or a key repeats, so the output
is complete and duplicate-free once the rerun finishes.

`run_meta.json` in the output directory records the settings that decide what a completion is
(model pair, verifier, sampling, input file): resuming into a directory written with other settings
fails with a message naming the keys that differ.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distributed_spec.config import ConfigError

logger = logging.getLogger(__name__)

RUN_META_NAME = "run_meta.json"


@dataclass
class ScanResult:
    """What an existing output file holds once repaired."""

    # Keys (from `key_of`) of the records kept, e.g. id keys of finished completions.
    keys: set[Any] = field(default_factory=set)
    # Records kept (lines in the file after the scan).
    num_records: int = 0
    # A torn last line was cut off.
    num_torn: int = 0
    # Lines removed: unreadable, repeated keys, or lines whose key is None (to be redone).
    num_dropped: int = 0


def scan_jsonl(path: str | Path, key_of: Callable[[dict[str, Any]], Any]) -> ScanResult:
    """Read an output JSONL file, repair it in place, and return the keys it holds.

    A line is kept when it parses as a JSON object and `key_of` gives it a key not seen before;
    `key_of` returns None for a line to drop (so its record is redone).
    """
    path = Path(path)
    result = ScanResult()
    if not path.exists():
        return result
    data = path.read_bytes()
    lines = data.split(b"\n")
    # split() leaves the bytes after the last newline last: empty when the file ends cleanly.
    tail = lines.pop()
    kept: list[bytes] = []
    for raw in lines:
        record = _parse(raw)
        key = key_of(record) if record is not None else None
        if record is None or key is None or key in result.keys:
            result.num_dropped += 1
            continue
        result.keys.add(key)
        kept.append(raw)
    if tail.strip():
        result.num_torn = 1
    result.num_records = len(kept)
    if result.num_dropped:
        _atomic_rewrite(path, b"".join(raw + b"\n" for raw in kept))
    elif result.num_torn or tail:
        with open(path, "r+b") as file:
            file.truncate(len(data) - len(tail))
            file.flush()
            os.fsync(file.fileno())
    if result.num_torn or result.num_dropped:
        logger.warning(
            "repaired %s: cut %d torn line(s), dropped %d unreadable, repeated or to-be-redone line(s)",
            path,
            result.num_torn,
            result.num_dropped,
        )
    return result


def _parse(raw: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) else None


def _atomic_rewrite(path: Path, content: bytes) -> None:
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as file:
        file.write(content)
        file.flush()
        os.fsync(file.fileno())
    os.replace(partial, path)


def reset_outputs(paths: list[Path]) -> None:
    """Start over (data.resume=false): remove earlier outputs."""
    for path in paths:
        path.unlink(missing_ok=True)


def check_run_meta(output_dir: Path, fingerprint: dict[str, Any], resume: bool) -> None:
    """Refuse to resume into outputs made with other settings; then record this run's settings."""
    meta_path = output_dir / RUN_META_NAME
    if resume and meta_path.exists():
        previous = json.loads(meta_path.read_text(encoding="utf-8"))
        changed = sorted(
            key for key in set(previous) | set(fingerprint) if previous.get(key) != fingerprint.get(key)
        )
        if changed:
            details = ", ".join(
                f"{key}: {previous.get(key)!r} -> {fingerprint.get(key)!r}" for key in changed
            )
            raise ConfigError(
                f"{output_dir} holds outputs made with other settings ({details}); "
                "choose another data.output_dir, or set data.resume=false to start over there"
            )
    output_dir.mkdir(parents=True, exist_ok=True)
    _atomic_rewrite(meta_path, (json.dumps(fingerprint, indent=2, sort_keys=True) + "\n").encode("utf-8"))
