"""Read an offline W&B run back (no account, no network): history rows, summary and config.

    python -m distributed_spec.tracking.wandb_offline runs/.../wandb/offline-run-*/

An offline run keeps everything in its `run-<id>.wandb` file: a LevelDB-style log (a 7-byte file
header, then 32 KiB blocks of chunks, each with a 7-byte header: crc32c, length, chunk type) whose
records are `wandb_internal_pb2.Record` protobufs. This reader follows that layout; it does not check
the CRCs (the run is read back by the process that wrote it, or by a test).
"""

from __future__ import annotations

import json
import struct
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_FILE_HEADER_LEN = 7
_FILE_MAGIC = b":W&B"
_BLOCK_LEN = 32 * 1024
_CHUNK_HEADER_LEN = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


@dataclass
class OfflineRun:
    """What an offline run logged."""

    run_id: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    # One dict per `log()` call, keyed by metric name (`_step` included).
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    tags: list[str] = field(default_factory=list)
    # The run's exit record was read: the file is complete (wandb-core may still be writing it for a
    # moment after `run.finish()` returns).
    complete: bool = False
    # From the exit record: 0 for a run that finished, non-zero for one that failed.
    exit_code: int | None = None


def _records(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    if data[:4] != _FILE_MAGIC:
        raise ValueError(f"{path} is not a W&B run file (header {data[:4]!r})")
    offset = _FILE_HEADER_LEN
    pending = b""
    while offset + _CHUNK_HEADER_LEN <= len(data):
        left_in_block = _BLOCK_LEN - offset % _BLOCK_LEN
        if left_in_block < _CHUNK_HEADER_LEN:
            offset += left_in_block
            continue
        _crc, length, chunk_type = struct.unpack_from("<IHB", data, offset)
        start = offset + _CHUNK_HEADER_LEN
        chunk = data[start : start + length]
        offset = start + length
        if chunk_type == _FULL:
            yield chunk
        elif chunk_type == _FIRST:
            pending = chunk
        elif chunk_type == _MIDDLE:
            pending += chunk
        elif chunk_type == _LAST:
            yield pending + chunk
            pending = b""
        else:
            # Zero padding at the end of a file that was not closed cleanly.
            return


def _items_to_dict(items: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key = "/".join(item.nested_key) if item.nested_key else item.key
        out[key] = json.loads(item.value_json)
    return out


def read_offline_run(run_dir: str | Path) -> OfflineRun:
    """Parse `run_dir/run-*.wandb` (run_dir: a `wandb/offline-run-*` folder)."""
    from wandb.proto import wandb_internal_pb2

    run_dir = Path(run_dir)
    files = sorted(run_dir.glob("run-*.wandb"))
    if not files:
        raise FileNotFoundError(f"no run-*.wandb file in {run_dir}")
    run = OfflineRun()
    for raw in _records(files[0]):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.run_id = record.run.run_id
            run.tags = list(record.run.tags)
            run.config.update(_items_to_dict(record.run.config.update))
        elif kind == "config":
            run.config.update(_items_to_dict(record.config.update))
        elif kind == "history":
            run.history.append(_items_to_dict(record.history.item))
        elif kind == "summary":
            run.summary.update(_items_to_dict(record.summary.update))
            for item in record.summary.remove:
                run.summary.pop(item.key, None)
        elif kind == "exit":
            run.complete = True
            run.exit_code = record.exit.exit_code
    return run


def wait_for_offline_run(run_dir: str | Path, timeout_s: float = 30.0) -> OfflineRun:
    """`read_offline_run` once the run's file is complete (its exit record written)."""
    deadline = time.monotonic() + timeout_s
    while True:
        run = read_offline_run(run_dir)
        if run.complete or time.monotonic() > deadline:
            return run
        time.sleep(0.2)


def find_offline_runs(root: str | Path) -> list[Path]:
    """Offline run folders under `root` (e.g. an output directory), oldest first."""
    return sorted(Path(root).glob("**/wandb/offline-run-*"))


if __name__ == "__main__":
    parsed = read_offline_run(sys.argv[1])
    print(
        json.dumps({"run_id": parsed.run_id, "summary": parsed.summary, "num_history": len(parsed.history)})
    )
