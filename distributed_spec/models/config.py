"""The model pair's configuration: the Hydra group `model` (conf/model/*.yaml) and the loader's input.

    ModelConfig(target=ModelSpec("smollm2"), draft=ModelSpec(kind="truncated", num_layers=4))

One class per model source (`ModelSpec`: model.target.*, model.draft.*) and one for the pair
(`ModelConfig`: model.*). Torch-free: the CLI validates these before torch is imported. What the
runtime decides (the device) is not here; models.loading takes it as an argument, beside the
pair-level model.dtype and model.trust_remote_code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from distributed_spec.errors import require

# How a model source is read.
MODEL_KINDS = ("auto", "smollm2", "hub", "dir", "gguf", "truncated", "distilled")
# Kinds derived from the loaded target: valid for the draft only.
DERIVED_KINDS = ("truncated", "distilled")
DTYPES = ("auto", "float32", "bfloat16", "float16")
# A Hugging Face hub id: `org/name`, letters, digits and `-_.` only.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


@dataclass
class ModelSpec:
    """Where one model of the pair comes from (model.target.*, model.draft.*).

    Checked by the pair (`ModelConfig`), which knows the keys; built alone (tests, scripts) it is
    checked by the loader as it reads the source.
    """

    # "smollm2" (the embedded default), a hub id (org/name), a local safetensors directory, a .gguf
    # file, or for kind=distilled the distilled checkpoint directory; ignored by kind=truncated.
    source: str = "smollm2"
    # How to read `source`: auto (inferred), smollm2, hub, dir, gguf; drafts also truncated, distilled.
    kind: str = "auto"
    # kind=truncated: the target's first `num_layers` decoder layers form the draft.
    num_layers: int | None = None
    # Hub revision (branch, tag or commit); null: the default branch.
    revision: str | None = None

    @property
    def resolved_kind(self) -> str:
        """`kind`, with auto inferred from the source: smollm2, gguf, dir or hub."""
        if self.kind != "auto":
            return self.kind
        if self.source == "smollm2":
            return "smollm2"
        if self.source.endswith(".gguf"):
            return "gguf"
        if Path(self.source).is_dir():
            return "dir"
        return "hub"

    @property
    def is_derived(self) -> bool:
        """Whether the model is built from the loaded target (a draft kind)."""
        return self.kind in DERIVED_KINDS

    def check(self, key: str, is_draft: bool) -> None:
        """Raise ConfigError naming `key`.* (e.g. model.draft) when this source cannot be read."""
        require(self.kind in MODEL_KINDS, f"{key}.kind={self.kind!r} is unknown; choose one of {MODEL_KINDS}")
        if self.is_derived:
            require(is_draft, f"{key}.kind={self.kind} derives a draft from the target; the target cannot use it")
        if self.kind == "truncated":
            require(
                self.num_layers is not None and self.num_layers >= 1,
                f"{key}.kind=truncated needs {key}.num_layers >= 1, got {self.num_layers}",
            )
            return
        path = Path(self.source).expanduser()
        if self.kind in ("dir", "distilled"):
            require(path.is_dir(), f"{key}.source={self.source!r} is not a directory ({key}.kind={self.kind})")
        elif self.kind == "gguf" or (self.kind == "auto" and self.source.endswith(".gguf")):
            require(path.is_file(), f"{key}.source={self.source!r} is not a .gguf file")
        elif self.kind == "auto":
            require(
                self.source == "smollm2" or path.is_dir() or _HUB_ID.match(self.source) is not None,
                f"{key}.source={self.source!r} is unknown: use smollm2, a hub id like org/name, "
                "a local model directory or a .gguf file",
            )
        elif self.kind == "hub":
            require(_HUB_ID.match(self.source) is not None, f"{key}.source={self.source!r} is not a hub id (org/name)")


@dataclass
class ModelConfig:
    """The target/draft pair (conf/model/*.yaml); loaded by distributed_spec.models.load_pair."""

    # Short name of the pair; used in output directory names and W&B tags.
    name: str = "smollm2"
    # Target model M_b.
    target: ModelSpec = field(default_factory=ModelSpec)
    # Draft model M_s; must share the target's vocabulary. (conf/model/smollm2.yaml uses the bundled
    # distilled draft; this fallback needs no file beyond the target.)
    draft: ModelSpec = field(default_factory=lambda: ModelSpec(source="smollm2", kind="truncated", num_layers=4))
    # Tokenizer (hub id or directory) to use instead of the target's; null: the target's.
    tokenizer: str | None = None
    # Weights dtype of both models: auto (float32 on CPU, bfloat16 on CUDA), float32, bfloat16, float16.
    dtype: str = "auto"
    # Context length in tokens; null: the models' max_position_embeddings (it may not exceed them).
    max_context_len: int | None = None
    # Run modelling code shipped with hub repositories (trusted repositories only).
    trust_remote_code: bool = False
    # bfloat16 on the CPU: pack each linear's weight once for oneDNN instead of on every call
    # (models/cpu_linear.py; same tokens bitwise, faster, the linears' memory doubled). Not on CUDA,
    # float32, or AutoTP-sharded layers (tp_size > 1), where it leaves the model as it is.
    cpu_prepack: bool = False

    def __post_init__(self) -> None:
        require(bool(self.name), "model.name must not be empty")
        self.target.check("model.target", is_draft=False)
        self.draft.check("model.draft", is_draft=True)
        require(self.dtype in DTYPES, f"model.dtype={self.dtype!r} is unknown; choose one of {DTYPES}")
        require(
            self.max_context_len is None or self.max_context_len > 1,
            f"model.max_context_len must be > 1 or null, got {self.max_context_len}",
        )
