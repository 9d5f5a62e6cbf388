"""The generation job's configuration: one dataclass per Hydra group in conf/ (torchtitan's shape).

Each group is the config of the part it sets up, defined beside that part and used by it as is:
`model` -> models/config.py (ModelConfig, the loader's), `parallel` -> distributed/config.py
(ParallelConfig, the runtime's; `resolve()` settles device and backend once), `verifier`, `sampling`
and `engine` -> engine/config.py (VerifierConfig, SamplingConfig, SchedulingConfig: the engine's);
`data` and `tracking` are the job's own, here. `JobConfig.from_dictconfig(cfg)` merges the composed
Hydra config onto these schemas (unknown keys and wrong types fail there) and builds the dataclasses,
whose `__post_init__` checks values. Every error is a `ConfigError` whose message names the key to
change in conf/; they fire before any model is loaded (models/pair.py checks the loaded pair again).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

# Each group's class lives with the part it configures (torch-free modules); imported here for
# JobConfig, so `from distributed_spec.config import ...` finds every one of them.
from distributed_spec.distributed.config import ParallelConfig
from distributed_spec.engine.config import EngineConfig, SamplingConfig, SchedulingConfig, VerifierConfig
from distributed_spec.errors import ConfigError, require
from distributed_spec.models.config import ModelConfig, ModelSpec  # noqa: F401

WANDB_MODES = ("online", "offline", "disabled")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# data.format: the job's own records (JSONL or Parquet), or OpenAI Batch API request files (JSONL).
DATA_FORMATS = ("records", "openai_batch")



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
        require(self.batch_size >= 1, f"data.batch_size must be >= 1, got {self.batch_size}")
        require(self.fsync_every >= 1, f"data.fsync_every must be >= 1, got {self.fsync_every}")
        require(self.limit is None or self.limit >= 0, f"data.limit must be >= 0 or null, got {self.limit}")
        require(self.format in DATA_FORMATS, f"data.format={self.format!r} is unknown; choose one of {DATA_FORMATS}")
        require(
            not (self.format == "openai_batch" and self.input_path.endswith(".parquet")),
            "data.format=openai_batch reads JSONL request files; data.input_path is a .parquet file",
        )

    def check_input_exists(self) -> None:
        require(bool(self.input_path), "data.input_path is required (e.g. data.input_path=prompts.jsonl)")
        path = Path(self.input_path).expanduser()
        require(path.is_file(), f"data.input_path={self.input_path!r} is not a file")


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
        require(
            self.mode in WANDB_MODES, f"tracking.mode={self.mode!r} is unknown; choose one of {WANDB_MODES}"
        )
        require(self.log_every >= 1, f"tracking.log_every must be >= 1, got {self.log_every}")
        require(self.num_samples >= 0, f"tracking.num_samples must be >= 0, got {self.num_samples}")


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
        require(
            self.log_level in LOG_LEVELS,
            f"log_level={self.log_level!r} is unknown; choose one of {LOG_LEVELS}",
        )
        require(
            not (self.verifier.method == "greedy" and self.sampling.temperature > 0),
            "verifier=greedy matches argmax tokens and needs sampling.temperature=0; "
            "set sampling.temperature=0 or use verifier=block",
        )
        self.parallel.require_paths_supported(self.verifier.num_paths)

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

        require(
            torch.cuda.is_available(),
            "parallel.device=cuda but no CUDA device is visible; set parallel.device=cpu",
        )
        if parallel.ray_address is None:
            num_gpus = torch.cuda.device_count()
            require(
                parallel.tp_size <= num_gpus,
                f"parallel.tp_size={parallel.tp_size} is larger than the {num_gpus} GPU(s) visible here; "
                f"lower parallel.tp_size or join a cluster with parallel.ray_address",
            )
    elif parallel.ray_address is None:
        num_cpus = os.cpu_count() or 1
        require(
            parallel.tp_size <= num_cpus,
            f"parallel.tp_size={parallel.tp_size} is larger than the {num_cpus} CPU core(s) here; "
            "lower parallel.tp_size",
        )
