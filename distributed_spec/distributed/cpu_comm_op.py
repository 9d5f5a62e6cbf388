"""Building DeepSpeed's CPU shared-memory all-reduce without hanging on a stale lock.

On the CPU, `deepspeed.init_distributed` JIT-compiles its shared-memory all-reduce (a torch C++
extension, once per machine, a minute or more on 2 cores) and torch guards that build with a plain
lock file. A shard killed mid-build (a load timeout, Ctrl-C on the first run) leaves the file
behind, and every later build on the machine waits on it forever. So each shard builds the op
first under an flock, which the kernel drops when its holder dies: whoever holds it knows that no
other shard is building, so a torch lock file still there is stale and safe to remove.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

SHM_OP_NAME = "deepspeed_shm_comm"  # deepspeed.ops.op_builder.cpu.comm.ShareMemCommBuilder.NAME


def extensions_root() -> Path:
    """Where torch builds JIT extensions: $TORCH_EXTENSIONS_DIR or torch's default root."""
    from torch.utils.cpp_extension import get_default_build_root  # noqa: PLC0415

    return Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())


def build_under_flock(root: Path, name: str, build: Callable[[], object]) -> object:
    """Run `build` holding an flock on root/<name>.flock, first removing torch's lock files of
    extension `name` (root/<torch-flavour>/<name>/lock) that no live builder can own."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{name}.flock", "w") as flock:
        fcntl.flock(flock, fcntl.LOCK_EX)  # blocks while another shard builds; released on its death
        try:
            for stale in root.glob(f"*/{name}/lock"):
                logger.warning("removing %s, left by a build that was killed", stale)
                stale.unlink(missing_ok=True)
            return build()
        finally:
            fcntl.flock(flock, fcntl.LOCK_UN)


def build_shm_op() -> None:
    """DeepSpeed's own `build_shm_op` (builds or loads the cached op; a no-op where DeepSpeed finds it
    incompatible) under the flock. Call after `set_distributed_env` (DS_ACCELERATOR=cpu)."""
    from deepspeed.comm.torch import build_shm_op as deepspeed_build_shm_op  # noqa: PLC0415

    build_under_flock(extensions_root(), SHM_OP_NAME, deepspeed_build_shm_op)
