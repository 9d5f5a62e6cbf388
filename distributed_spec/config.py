"""Typed configuration of the generation job: one dataclass per Hydra group in conf/.

Each group folder in conf/ (model, parallel, verifier, sampling, data, tracking) is mirrored by a
dataclass here, so a YAML key is a field you can find. `JobConfig.from_dictconfig(cfg)` merges the
composed Hydra config onto these schemas (unknown keys and wrong types fail there) and builds the
dataclasses, whose `__post_init__` checks values. Every error is a `ConfigError` whose message names
the key to change; they fire before any model is loaded (the loader checks the loaded
vocabularies once more). ParallelConfig (conf/parallel/) is defined in distributed/config.py.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

# parallel.* is defined with the runtime it configures (torch-free, docs/distributed.md); imported here
# for JobConfig.parallel, so `from distributed_spec.config import ParallelConfig` keeps working.
from distributed_spec.distributed.config import ParallelConfig
from distributed_spec.engine.config import EngineConfig, SamplingConfig, SchedulingConfig, VerifierConfig
from distributed_spec.errors import ConfigError

DTYPES = ("auto", "float32", "bfloat16", "float16")
WANDB_MODES = ("online", "offline", "disabled")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# data.format: the job's own records (JSONL or Parquet), or OpenAI Batch API request files (JSONL).
DATA_FORMATS = ("records", "openai_batch")
# How a model source is read (mirrors distributed_spec.models.loading.MODEL_KINDS; a test checks).
MODEL_KINDS = ("auto", "smollm2", "hub", "dir", "gguf", "truncated", "distilled")
# Kinds derived from the loaded target: valid for the draft only.
DERIVED_KINDS = ("truncated", "distilled")
# A Hugging Face hub id: `org/name`, letters, digits and `-_.` only.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@dataclass
class ModelSourceConfig:
    """Where one model of the pair comes from (model.target.*, model.draft.*)."""

    # "smollm2" (the embedded default), a hub id (org/name), a local safetensors directory, a .gguf
    # file, or for kind=distilled the distilled checkpoint directory; ignored by kind=truncated.
    source: str = "smollm2"
    # How to read `source`: auto (inferred), smollm2, hub, dir, gguf; drafts also truncated, distilled.
    kind: str = "auto"
    # kind=truncated: the target's first `num_layers` decoder layers form the draft.
    num_layers: int | None = None
    # Hub revision (branch, tag or commit); null: the default branch.
    revision: str | None = None

    def check(self, key: str, is_draft: bool) -> None:
        _require(
            self.kind in MODEL_KINDS, f"{key}.kind={self.kind!r} is unknown; choose one of {MODEL_KINDS}"
        )
        if self.kind in DERIVED_KINDS:
            _require(
                is_draft, f"{key}.kind={self.kind} derives a draft from the target; the target cannot use it"
            )
        if self.kind == "truncated":
            _require(
                self.num_layers is not None and self.num_layers >= 1,
                f"{key}.kind=truncated needs {key}.num_layers >= 1, got {self.num_layers}",
            )
            return
        path = Path(self.source).expanduser()
        if self.kind in ("dir", "distilled"):
            _require(
                path.is_dir(), f"{key}.source={self.source!r} is not a directory ({key}.kind={self.kind})"
            )
        elif self.kind == "gguf" or (self.kind == "auto" and self.source.endswith(".gguf")):
            _require(path.is_file(), f"{key}.source={self.source!r} is not a .gguf file")
        elif self.kind == "auto":
            _require(
                self.source == "smollm2" or path.is_dir() or _HUB_ID.match(self.source) is not None,
                f"{key}.source={self.source!r} is unknown: use smollm2, a hub id like org/name, "
                "a local model directory or a .gguf file",
            )
        elif self.kind == "hub":
            _require(
                _HUB_ID.match(self.source) is not None,
                f"{key}.source={self.source!r} is not a hub id (org/name)",
            )


@dataclass
class ModelConfig:
    """The target/draft pair (conf/model/*.yaml); loaded by distributed_spec.models.load_pair."""

    # Short name of the pair; used in output directory names and W&B tags.
    name: str = "smollm2"
    # Target model M_b.
    target: ModelSourceConfig = field(default_factory=ModelSourceConfig)
    # Draft model M_s; must share the target's vocabulary. (conf/model/smollm2.yaml uses the bundled
    # distilled draft; this fallback needs no file beyond the target.)
    draft: ModelSourceConfig = field(
        default_factory=lambda: ModelSourceConfig(source="smollm2", kind="truncated", num_layers=4)
    )
    # Tokenizer (hub id or directory) to use instead of the target's; null: the target's.
    tokenizer: str | None = None
    # Weights dtype of both models: auto (float32 on CPU, bfloat16 on CUDA), float32, bfloat16, float16.
    dtype: str = "auto"
    # Context length in tokens; null: the models' max_position_embeddings.
    max_context_len: int | None = None
    # Run modelling code shipped with hub repositories (trusted repositories only).
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        _require(bool(self.name), "model.name must not be empty")
        self.target.check("model.target", is_draft=False)
        self.draft.check("model.draft", is_draft=True)
        _require(self.dtype in DTYPES, f"model.dtype={self.dtype!r} is unknown; choose one of {DTYPES}")
        _require(
            self.max_context_len is None or self.max_context_len > 1,
            f"model.max_context_len must be > 1 or null, got {self.max_context_len}",
        )


@dataclass
class DataConfig:
    """Input records, output files and batching (conf/data/*.yaml)."""

    # JSONL (or .parquet) file of records with an id and a `prompt` or chat `messages`.
    input_path: str = ""
    # `records`: the job's own records (above); `openai_batch`: an OpenAI Batch API input file (JSONL),
    # answered in the Batch API's output format (jobs/openai_batch.py).
    format: str = "records"
    # Directory of completions.jsonl, errors.jsonl and summary.json; null: the Hydra run directory.
    output_dir: str | None = None
    # Rows decoded at once (the engine's batch; continuous batching keeps it full).
    batch_size: int = 4
    # fsync the output files after this many records (and at the end).
    fsync_every: int = 16
    # Process at most this many input records; null: all.
    limit: int | None = None
    # Apply the tokenizer's chat template to plain `prompt` records too (chat `messages` always get it).
    chat_template_for_prompts: bool = False
    # Rerun-safe: skip ids already in the output. false starts over and truncates the outputs.
    resume: bool = True
    # Field names in the input records.
    id_field: str = "id"
    prompt_field: str = "prompt"
    messages_field: str = "messages"

    def __post_init__(self) -> None:
        _require(self.batch_size >= 1, f"data.batch_size must be >= 1, got {self.batch_size}")
        _require(self.fsync_every >= 1, f"data.fsync_every must be >= 1, got {self.fsync_every}")
        _require(self.limit is None or self.limit >= 0, f"data.limit must be >= 0 or null, got {self.limit}")
        _require(self.format in DATA_FORMATS, f"data.format={self.format!r} is unknown; choose one of {DATA_FORMATS}")
        _require(
            not (self.format == "openai_batch" and self.input_path.endswith(".parquet")),
            "data.format=openai_batch reads JSONL request files; data.input_path is a .parquet file",
        )

    def check_input_exists(self) -> None:
        _require(bool(self.input_path), "data.input_path is required (e.g. data.input_path=prompts.jsonl)")
        path = Path(self.input_path).expanduser()
        _require(path.is_file(), f"data.input_path={self.input_path!r} is not a file")


@dataclass
class TrackingConfig:
    """Experiment tracking (conf/tracking/*.yaml): W&B plus the console."""

    # `offline` writes the run under the output directory (no account needed); `online` uploads.
    mode: str = "offline"
    # W&B project and entity (entity null: the account's default).
    project: str = "distributed_spec"
    entity: str | None = None
    # W&B run name; null lets W&B pick one.
    name: str | None = None
    # Tags added to the W&B run, besides the model name, verifier and runtime.
    tags: list[str] = field(default_factory=list)
    # Log metrics every log_every x data.batch_size completed records.
    log_every: int = 1
    # Sample completions kept for the W&B table.
    num_samples: int = 16
    # Show a progress bar on stderr.
    progress: bool = True

    def __post_init__(self) -> None:
        _require(
            self.mode in WANDB_MODES, f"tracking.mode={self.mode!r} is unknown; choose one of {WANDB_MODES}"
        )
        _require(self.log_every >= 1, f"tracking.log_every must be >= 1, got {self.log_every}")
        _require(self.num_samples >= 0, f"tracking.num_samples must be >= 0, got {self.num_samples}")


@dataclass
class JobConfig:
    """The whole generation job (conf/generate.yaml)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    engine: SchedulingConfig = field(default_factory=SchedulingConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    # Log level of the job's loggers.
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        _require(
            self.log_level in LOG_LEVELS,
            f"log_level={self.log_level!r} is unknown; choose one of {LOG_LEVELS}",
        )
        _require(
            not (self.verifier.method == "greedy" and self.sampling.temperature > 0),
            "verifier=greedy matches argmax tokens and needs sampling.temperature=0; "
            "set sampling.temperature=0 or use verifier=block",
        )
        _require(
            self.verifier.num_paths == 1 or self.parallel.runtime == "local",
            f"verifier.num_paths={self.verifier.num_paths} runs in parallel.runtime=local only for now; "
            "set verifier.num_paths=1 or parallel=local",
        )

    @classmethod
    def from_dictconfig(cls, cfg: DictConfig | dict[str, Any]) -> JobConfig:
        """Validate a composed Hydra config against the schemas; raises ConfigError."""
        try:
            merged = OmegaConf.merge(OmegaConf.structured(cls), cfg)
            job = OmegaConf.to_object(merged)
        except ConfigError:
            raise
        except OmegaConfBaseException as err:
            raise ConfigError(_omegaconf_message(err)) from err
        assert isinstance(job, cls)
        return job

    def engine_config(self, eos_token_ids: tuple[int, ...] = ()) -> EngineConfig:
        """The engine's config: this job's verifier, sampling and engine groups as they are."""
        return EngineConfig(self.verifier, self.sampling, self.engine, self.data.batch_size, eos_token_ids)

    def to_dict(self) -> dict[str, Any]:
        return OmegaConf.to_container(OmegaConf.structured(self), resolve=True)  # type: ignore[return-value]


# Keys renamed when the draft length got one vocabulary (engine/config.py): old name -> new name.
_RENAMED_KEYS = {
    "verifier.gamma": "verifier.num_draft_tokens",
    "verifier.gamma_schedule": "verifier.draft_len_schedule",
    "verifier.max_gamma": "verifier.max_draft_len",
}


def _omegaconf_message(err: OmegaConfBaseException) -> str:
    # OmegaConf wraps __post_init__ errors; surface ours unchanged.
    cause = err.__cause__ or err.__context__
    if isinstance(cause, ConfigError):
        return str(cause)
    key = getattr(err, "full_key", None)
    first_line = str(err).splitlines()[0] if str(err) else type(err).__name__
    if key in _RENAMED_KEYS:
        return f"{key} is now {_RENAMED_KEYS[key]}: set {_RENAMED_KEYS[key]} instead"
    return f"{key}: {first_line}" if key else first_line


def check_devices(parallel: ParallelConfig) -> None:
    """Fail early when the machine cannot host `parallel.tp_size` ranks (before any model loads).

    parallel.runtime=ray is checked against the Ray cluster's resources when the runtime launches
    (distributed.placement.check_fits), never against the driver's devices: the driver of a job
    submitted to a cluster may well have no GPU.
    """
    if parallel.runtime == "ray":
        return
    # The same resolve() as the job's generator (a local `auto` looks at this machine only).
    device = parallel.resolve().device
    if device == "cuda":
        import torch

        _require(
            torch.cuda.is_available(),
            "parallel.device=cuda but no CUDA device is visible; set parallel.device=cpu",
        )
        if parallel.ray_address is None:
            num_gpus = torch.cuda.device_count()
            _require(
                parallel.tp_size <= num_gpus,
                f"parallel.tp_size={parallel.tp_size} is larger than the {num_gpus} GPU(s) visible here; "
                f"lower parallel.tp_size or join a cluster with parallel.ray_address",
            )
    elif parallel.ray_address is None:
        num_cpus = os.cpu_count() or 1
        _require(
            parallel.tp_size <= num_cpus,
            f"parallel.tp_size={parallel.tp_size} is larger than the {num_cpus} CPU core(s) here; "
            "lower parallel.tp_size",
        )
