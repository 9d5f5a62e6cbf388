"""DeepSpeed's CPU all-reduce segments in /dev/shm: a group's own, and those nobody holds any more.

DeepSpeed's shared-memory all-reduce (deepspeed/ops/csrc/cpu/comm/shm.cpp, `shm_initialize`) makes
one POSIX shared-memory segment per rank, named

    /dev/shm/deepspeed_allreduce_buffer_{uid}_{MASTER_ADDR}_{MASTER_PORT}_{rank}     (~69 MB each)

and never unlinks it. `teardown` removes its group's segments; a job killed with SIGKILL leaves
them behind, so `launch` removes stale ones on every shard node first. The names carry no pid, so
"stale" is decided from /proc: a live rank keeps its own segment's descriptor open and every peer's
segment mapped for its whole life, so a segment that no process has open or mapped belongs to
nobody. Only this user's segments are considered (the uid is in the name).
"""

from __future__ import annotations

import os
from pathlib import Path

SHM_DIR = Path("/dev/shm")
SEGMENT_PREFIX = "deepspeed_allreduce_buffer"  # SHM_BUFFER_NAME in shm.cpp


def group_segments(master_addr: str, master_port: int, shm_dir: Path = SHM_DIR) -> list[Path]:
    """The segments of the group that met at master_addr:master_port (every rank's)."""
    return sorted(shm_dir.glob(f"{SEGMENT_PREFIX}_{os.getuid()}_{master_addr}_{master_port}_*"))


def _held_paths(proc_dir: Path) -> set[str]:
    """Every path some process (that this user can inspect) has open or mapped."""
    held: set[str] = set()
    for process in proc_dir.iterdir():
        if not process.name.isdigit():
            continue
        try:
            for fd in (process / "fd").iterdir():
                try:
                    held.add(os.readlink(fd))
                except OSError:
                    continue  # closed meanwhile
            with open(process / "maps", encoding="utf-8", errors="replace") as maps:
                for line in maps:
                    fields = line.split(maxsplit=5)
                    if len(fields) == 6:
                        held.add(fields[5].strip().removesuffix(" (deleted)"))
        except OSError:
            continue  # the process exited, or belongs to someone else
    return held


def stale_segments(shm_dir: Path = SHM_DIR, proc_dir: Path = Path("/proc")) -> list[Path]:
    """This user's segments that no process has open or mapped (left by killed groups)."""
    candidates = sorted(shm_dir.glob(f"{SEGMENT_PREFIX}_{os.getuid()}_*"))
    if not candidates:
        return []
    held = _held_paths(proc_dir)
    # /proc shows /dev/shm paths; a test's shm_dir is matched by its own resolved path.
    return [path for path in candidates if str(path.resolve()) not in held and str(path) not in held]


def remove_segments(paths: list[Path]) -> int:
    """Unlink `paths` (a mapping that still exists keeps its memory until it goes); returns how many."""
    removed = 0
    for path in paths:
        try:
            path.unlink()
            removed += 1
        except FileNotFoundError:
            pass
    return removed
