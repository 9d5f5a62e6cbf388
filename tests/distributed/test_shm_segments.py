"""Stale DeepSpeed /dev/shm segments are told from live ones by /proc (no Ray, no DeepSpeed)."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import time

from distributed_spec.distributed.shm_segments import (
    SEGMENT_PREFIX,
    group_segments,
    remove_segments,
    stale_segments,
)


def _segment(shm_dir, port: int, rank: int, uid: int | None = None):
    path = shm_dir / f"{SEGMENT_PREFIX}_{os.getuid() if uid is None else uid}_127.0.0.1_{port}_{rank}"
    path.write_bytes(b"\0" * 4096)
    return path


def test_only_segments_no_process_holds_are_stale(tmp_path):
    opened = _segment(tmp_path, 1234, 0)  # a rank's own segment: its descriptor stays open
    mapped = _segment(tmp_path, 1234, 1)  # a peer's segment: mapped, descriptor closed
    in_child = _segment(tmp_path, 2345, 0)  # held by another live process
    dead = _segment(tmp_path, 5678, 0)  # its group was killed
    other_user = _segment(tmp_path, 5678, 1, uid=os.getuid() + 1)
    child = subprocess.Popen(
        [sys.executable, "-c", f"f = open({str(in_child)!r}, 'rb'); print('ready', flush=True); input()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    with open(opened, "r+b") as descriptor, open(mapped, "r+b") as file:
        mapping = mmap.mmap(file.fileno(), 0)
        file.close()
        try:
            assert child.stdout.readline().strip() == "ready"
            assert stale_segments(tmp_path) == [dead]
            assert group_segments("127.0.0.1", 1234, tmp_path) == [opened, mapped]
            assert remove_segments(stale_segments(tmp_path)) == 1
            assert not dead.exists() and opened.exists() and mapped.exists() and other_user.exists()
            assert descriptor.readable()
        finally:
            child.stdin.close()
            child.wait(timeout=30)
            mapping.close()
    # Their holders are gone: every segment of this user is stale, another user's is never touched.
    deadline = time.monotonic() + 10
    while len(stale_segments(tmp_path)) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert stale_segments(tmp_path) == [opened, mapped, in_child]
    assert remove_segments([opened, opened]) == 1
    assert other_user.exists()
