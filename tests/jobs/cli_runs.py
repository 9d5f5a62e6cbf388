"""Running the generation CLI in a subprocess on a tiny pair (end-to-end tests of the job)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def cli(args: list[str], **kwargs) -> subprocess.Popen:
    """`python -m distributed_spec.generate *args` in its own session (killpg reaches it alone)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "distributed_spec.generate", *args],
        cwd=kwargs.pop("cwd", REPO),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        **kwargs,
    )


def tiny_args(tiny_pair, input_path, *extra: str) -> list[str]:
    """Overrides that run the job on the tiny pair saved by tests/jobs/fakes.py's save_tiny_pair."""
    target_dir, draft_dir = tiny_pair
    return [
        "model.name=tiny",
        f"model.target.source={target_dir}",
        "model.target.kind=dir",
        f"model.draft.source={draft_dir}",
        "model.draft.kind=dir",
        f"data.input_path={input_path}",
        "parallel.device=cpu",
        "tracking=disabled",
        *extra,
    ]


def write_prompts(path: Path, num_records: int) -> None:
    """`num_records` prompts r000, r001, ... and one malformed line after the sixth."""
    words = ["alpha", "beta", "g", "delta", "echo", "fox", "golf", "hotel"]
    with open(path, "w") as file:
        for index in range(num_records):
            file.write(
                json.dumps({"id": f"r{index:03d}", "prompt": f"{words[index % 8]} {index} says"}) + "\n"
            )
            if index == 5:
                file.write('{"id": "broken", "prompt": \n')


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def sigkill_after_lines(process: subprocess.Popen, path: Path, num_lines: int, timeout_s: float) -> None:
    """SIGKILL the job's whole process group once `path` holds `num_lines` lines."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        if path.exists() and path.read_bytes().count(b"\n") >= num_lines:
            break
        time.sleep(0.02)
    assert process.poll() is None, "the job ended before it could be killed:\n" + process.communicate()[0]
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
