"""Typed configuration of the generation job: one dataclass per Hydra group in conf/.

Each group folder in conf/ (model, parallel, verifier, sampling, data, tracking) is mirrored by a
dataclass here, so a YAML key is a field you can find. `JobConfig.from_dictconfig(cfg)` merges the
composed Hydra config onto these schemas (unknown keys and wrong types fail there) and builds the
dataclasses, whose `__post_init__` checks values. Every error is a `ConfigError` whose message names
the key to change; they fire before any model is loaded (the loader checks the loaded
vocabularies once more).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

# "autoregressive" runs the same job with the target alone (no draft loaded): the baseline.
VERIFIER_METHODS = ("block", "token", "greedy", "autoregressive")
GAMMA_SCHEDULES = ("constant", "adaptive", "goodput")
# What proposes the blocks (mirrors distributed_spec.engine.proposers.PROPOSERS; a test checks).
PROPOSERS = ("model", "ngram", "model+ngram")
# Methods with a multi-path rule, allowed with verifier.num_paths > 1.
MULTIPATH_METHODS = ("block", "greedy")
RUNTIMES = ("local", "ray")
DEVICES = ("auto", "cpu", "cuda")
BACKENDS = ("auto", "gloo", "nccl")
# parallel.verify: where the target shard group verifies (mirrors distributed_spec.distributed.config.
# VERIFY_MODES; a test checks). `gather`: full logits on every rank, rank 0 verifies; `vocab_parallel`:
# each rank scores and verifies its vocabulary slice (docs/design.md section 4).
VERIFY_MODES = ("gather", "vocab_parallel")
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


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the key to change."""


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
class ParallelConfig:
    """Where and how the models run (conf/parallel/*.yaml)."""

    # `local`: the single-process engine; `ray`: Ray actors with a tensor-parallel target.
    runtime: str = "local"
    # Tensor-parallel ranks of the target model (runtime=ray only; local runs one process).
    tp_size: int = 1
    # `auto` picks cuda when a GPU is visible (runtime=ray: when the Ray cluster has GPUs), else cpu.
    device: str = "auto"
    # Collective backend of the target's process group; `auto`: nccl on cuda, gloo on cpu.
    backend: str = "auto"
    # Ray cluster address (`auto` joins a running cluster); null starts Ray in-process.
    ray_address: str | None = None
    # CPU threads per process for torch; null leaves torch's default.
    num_threads: int | None = None
    # runtime=ray: independent replicas of the whole runtime (shard group + draft), each taking
    # records from one work queue (jobs/replicas.py); `auto`: as many as the cluster's resources hold.
    # Each replica's threads: num_cpus_per_shard / num_cpus_draft (rounded, at least 1).
    num_replicas: Any = 1
    # The keys below are read by parallel.runtime=ray only; their meaning and checks live in
    # distributed_spec.distributed.config.RayRuntimeConfig, which they mirror one to one.
    # Draft device: `auto` (the shards' device) or `cpu`.
    draft_device: str = "auto"
    # Logical CPUs reserved per target-shard bundle and for the draft.
    num_cpus_per_shard: float = 1.0
    num_cpus_draft: float = 1.0
    # GPUs of the draft on cuda: below 1 it shares shard 0's GPU (tp_size GPUs in all); 1 or more: its own.
    num_gpus_draft: float = 0.1
    # Ray placement strategy tried first (STRICT_PACK falls back to PACK), and its timeout.
    placement_strategy: str = "STRICT_PACK"
    placement_timeout_s: float = 30.0
    # Precision and top-k sparsity (0 = dense) of the draft probabilities sent to the target shards.
    wire_dtype: str = "auto"
    wire_top_k: int = 0
    # Draft the next block while the shards verify the current one.
    overlap: bool = False
    # How the shard group verifies: `gather` (full logits per rank, rank 0 verifies) or
    # `vocab_parallel` (each rank its vocabulary slice of the LM head and of q; parallel=ray only).
    verify: str = "gather"
    # Seconds a load may take, seconds one iteration may take, and rebuilds of a dead shard group.
    load_timeout_s: float = 600.0
    step_timeout_s: float = 60.0
    max_restarts: int = 3
    # Print where the actors would go and exit, loading nothing (`python -m distributed_spec.plan` always
    # does), for the live cluster or plan_num_nodes nodes of plan_gpus_per_node GPUs / plan_cpus_per_node CPUs.
    plan_only: bool = False
    plan_num_nodes: int = 1
    plan_gpus_per_node: int | None = None
    plan_cpus_per_node: float | None = None

    def __post_init__(self) -> None:
        _require(
            self.runtime in RUNTIMES,
            f"parallel.runtime={self.runtime!r} is unknown; choose one of {RUNTIMES}",
        )
        _require(self.tp_size >= 1, f"parallel.tp_size must be >= 1, got {self.tp_size}")
        _require(
            self.device in DEVICES, f"parallel.device={self.device!r} is unknown; choose one of {DEVICES}"
        )
        _require(
            self.backend in BACKENDS,
            f"parallel.backend={self.backend!r} is unknown; choose one of {BACKENDS}",
        )
        _require(
            not (self.runtime == "local" and self.tp_size > 1),
            f"parallel.runtime=local runs one process, so parallel.tp_size={self.tp_size} is impossible; "
            "set parallel.runtime=ray (or parallel.tp_size=1)",
        )
        _require(
            not (self.backend == "nccl" and self.device == "cpu"),
            "parallel.backend=nccl needs parallel.device=cuda; use parallel.backend=gloo on the CPU",
        )
        _require(
            self.num_threads is None or self.num_threads >= 1,
            f"parallel.num_threads must be >= 1 or null, got {self.num_threads}",
        )
        _require(
            self.num_replicas == "auto" or (type(self.num_replicas) is int and self.num_replicas >= 1),
            f"parallel.num_replicas must be an integer >= 1 or auto, got {self.num_replicas!r}",
        )
        _require(
            self.verify in VERIFY_MODES,
            f"parallel.verify={self.verify!r} is unknown; choose one of {VERIFY_MODES}",
        )
        _require(
            self.runtime == "ray" or self.verify == "gather",
            f"parallel.verify={self.verify} shards the vocabulary over target processes, and "
            "parallel.runtime=local runs one; set parallel=ray (or parallel.verify=gather)",
        )
        _require(
            self.runtime == "ray" or self.num_replicas == 1,
            f"parallel.num_replicas={self.num_replicas} needs parallel=ray (replicas are Ray actors)",
        )
        if self.runtime == "ray":
            # Checked here with `auto` read as the backend implies; the job resolves it on the machine.
            implied_device = "cuda" if self.backend == "nccl" else "cpu"
            self.ray_runtime_config(device=self.device if self.device != "auto" else implied_device)

    def ray_runtime_config(self, device: str | None = None) -> Any:
        """The distributed runtime's config built from these keys (its checks run here too)."""
        try:
            from distributed_spec.distributed.config import RayRuntimeConfig
        except ImportError:
            # The distributed runtime is not installed in this tree; generate.py reports it.
            return None
        device = device or self.resolved_device()
        backend = self.backend if self.backend != "auto" or device == "auto" else ("nccl" if device == "cuda" else "gloo")
        values = {f.name: getattr(self, f.name) for f in fields(RayRuntimeConfig) if hasattr(self, f.name)}
        values.update(device=device, backend=backend)
        try:
            return RayRuntimeConfig(**values)
        except ValueError as err:
            raise ConfigError(str(err)) from err

    def resolved_device(self) -> str:
        """`cpu` or `cuda`: `auto` resolved against the local machine, or the Ray cluster it joins."""
        if self.device != "auto":
            return self.device
        if self.runtime == "ray" and self.ray_address is not None:
            from distributed_spec.distributed.placement import cluster_device

            return cluster_device(self.ray_address)
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def resolved_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        return "nccl" if self.resolved_device() == "cuda" else "gloo"


@dataclass
class VerifierConfig:
    """The verification rule and the draft block length (conf/verifier/*.yaml)."""

    # `block` (Sun et al. 2024), `token` (Leviathan et al. 2023), `greedy` (prefix match), or
    # `autoregressive` (the target alone, no draft: the baseline).
    method: str = "block"
    # Draft block length g: tokens proposed per target call (the starting g when adaptive).
    gamma: int = 4
    # `goodput`: each step the g in {0, ..., max_gamma} with the most expected tokens per second on
    # this device (measured online; 0 = no draft). `constant`: g = gamma. `adaptive`: per row, g grows
    # by 2 after a fully kept block and shrinks by 1 otherwise, within [1, max_gamma]. All exact.
    gamma_schedule: str = "goodput"
    # The largest g of the `goodput` and `adaptive` schedules.
    max_gamma: int = 4
    # A row's block ends after the first draft token whose draft probability is below this
    # (Hugging Face's assistant_confidence_threshold; exact for every method); 0 disables it.
    draft_confidence_threshold: float = 0.0
    # What proposes the blocks: `model` (the draft model), `ngram` (prompt lookup: what followed the
    # row's last n tokens earlier in its own prompt and output; no draft model is loaded; a row
    # without a match verifies no draft), `model+ngram` (n-gram where it matches, the model elsewhere).
    proposer: str = "model"
    # The n-gram proposer matches the last n tokens, n from ngram_max down to ngram_min.
    ngram_min: int = 1
    ngram_max: int = 3
    # K draft paths per row and step, scored in one target forward; one path's prefix is kept
    # (docs/design.md section 7). 1: block verification as before. K > 1: method block or greedy.
    num_paths: int = 1

    def __post_init__(self) -> None:
        _require(
            self.method in VERIFIER_METHODS,
            f"verifier.method={self.method!r} is unknown; choose one of {VERIFIER_METHODS} "
            "(e.g. verifier=block)",
        )
        _require(self.gamma >= 1, f"verifier.gamma must be >= 1, got {self.gamma}")
        _require(
            self.gamma_schedule in GAMMA_SCHEDULES,
            f"verifier.gamma_schedule={self.gamma_schedule!r} is unknown; choose one of {GAMMA_SCHEDULES}",
        )
        _require(
            self.gamma_schedule != "adaptive" or self.max_gamma >= self.gamma,
            f"verifier.max_gamma ({self.max_gamma}) must be >= verifier.gamma ({self.gamma}) "
            "with verifier.gamma_schedule=adaptive",
        )
        _require(
            0.0 <= self.draft_confidence_threshold < 1.0,
            f"verifier.draft_confidence_threshold must be in [0, 1) (0 disables it), got {self.draft_confidence_threshold}",
        )
        _require(
            self.proposer in PROPOSERS,
            f"verifier.proposer={self.proposer!r} is unknown; choose one of {PROPOSERS}",
        )
        _require(
            self.proposer == "model" or self.method != "autoregressive",
            f"verifier.proposer={self.proposer} proposes blocks, but verifier.method=autoregressive verifies "
            "none; set verifier.proposer=model or pick a verifier (e.g. verifier=block)",
        )
        _require(
            1 <= self.ngram_min <= self.ngram_max,
            f"verifier.ngram_min and verifier.ngram_max need 1 <= ngram_min <= ngram_max, "
            f"got {self.ngram_min} and {self.ngram_max}",
        )
        _require(self.num_paths >= 1, f"verifier.num_paths must be >= 1, got {self.num_paths}")
        _require(
            self.num_paths == 1 or self.method in MULTIPATH_METHODS,
            f"verifier.num_paths={self.num_paths} needs a draft model and verifier.method in "
            f"{MULTIPATH_METHODS} (e.g. verifier=block), got verifier.method={self.method!r}",
        )
        _require(
            self.num_paths == 1 or self.draft_confidence_threshold == 0,
            "verifier.num_paths > 1 needs verifier.draft_confidence_threshold=0 "
            "(every path of a row verifies the same number of drafts)",
        )
        _require(
            self.num_paths == 1 or self.proposer == "model",
            f"verifier.num_paths > 1 draws its paths from the draft model: set verifier.proposer=model "
            f"(got {self.proposer!r}) or verifier.num_paths=1",
        )

    @property
    def uses_draft_model(self) -> bool:
        """Whether the job loads a draft model (not for the autoregressive baseline, nor for n-grams)."""
        return self.method != "autoregressive" and self.proposer != "ngram"


@dataclass
class SchedulingConfig:
    """How the engine's scheduler batches rows (conf/engine/*.yaml); data.batch_size rows at once."""

    # true: a finished row's place goes to the next record at the next step (continuous batching);
    # false: static batches (the next batch starts when the last row of the current one has ended).
    continuous_batching: bool = True
    # Prompt tokens a row feeds the target per step at most: a long prompt goes in by chunks beside
    # the other rows' blocks instead of stalling them; null: whole prompts.
    prefill_chunk_tokens: int | None = 256

    def __post_init__(self) -> None:
        _require(
            self.prefill_chunk_tokens is None or self.prefill_chunk_tokens >= 1,
            f"engine.prefill_chunk_tokens must be >= 1 or null, got {self.prefill_chunk_tokens}",
        )


@dataclass
class SamplingConfig:
    """How tokens are drawn (conf/sampling/*.yaml); applied to draft and target alike."""

    # Softmax temperature; 0 is greedy.
    temperature: float = 0.7
    # Keep the k most likely tokens; 0 disables.
    top_k: int = 0
    # Nucleus mass; 1.0 disables.
    top_p: float = 1.0
    # Tokens to generate per record at most.
    max_new_tokens: int = 128
    # Seed of the job's random numbers (draft sampling and verification uniforms).
    seed: int = 0
    # Strings that end a completion; the completion is cut before the first one.
    stop: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        _require(self.temperature >= 0.0, f"sampling.temperature must be >= 0, got {self.temperature}")
        _require(self.top_k >= 0, f"sampling.top_k must be >= 0 (0 disables), got {self.top_k}")
        _require(0.0 < self.top_p <= 1.0, f"sampling.top_p must be in (0, 1], got {self.top_p}")
        _require(self.max_new_tokens >= 1, f"sampling.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        _require(all(self.stop), "sampling.stop must not contain empty strings")


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

    def to_dict(self) -> dict[str, Any]:
        return OmegaConf.to_container(OmegaConf.structured(self), resolve=True)  # type: ignore[return-value]


def _omegaconf_message(err: OmegaConfBaseException) -> str:
    # OmegaConf wraps __post_init__ errors; surface ours unchanged.
    cause = err.__cause__ or err.__context__
    if isinstance(cause, ConfigError):
        return str(cause)
    key = getattr(err, "full_key", None)
    first_line = str(err).splitlines()[0] if str(err) else type(err).__name__
    return f"{key}: {first_line}" if key else first_line


def check_devices(parallel: ParallelConfig) -> None:
    """Fail early when the machine cannot host `parallel.tp_size` ranks (before any model loads).

    parallel.runtime=ray is checked against the Ray cluster's resources when the runtime launches
    (distributed.placement.check_fits), never against the driver's devices: the driver of a job
    submitted to a cluster may well have no GPU.
    """
    if parallel.runtime == "ray":
        return
    device = parallel.resolved_device()
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
