"""Model loading: targets and drafts from a hub id, a safetensors directory, a GGUF file or the embedded SmolLM2.

    from distributed_spec.models import ModelConfig, ModelSpec, load_pair
    model = ModelConfig(target=ModelSpec("smollm2"), draft=ModelSpec(kind="truncated", num_layers=4))
    target, draft = load_pair(model, device="cpu")
    target.model, target.tokenizer, target.name       # LoadedModel fields

API:
- ModelSpec(source="smollm2" | hub id | directory | path.gguf | distilled checkpoint dir,
  kind="auto" | "smollm2" | "hub" | "dir" | "gguf" | "truncated" | "distilled", num_layers=None,
  revision=None): one model source (the Hydra keys model.target.*, model.draft.*); models/config.py.
- ModelConfig(name, target, draft, tokenizer, dtype="auto", max_context_len=None, trust_remote_code=False):
  the pair (the Hydra group `model`), checked on construction (ConfigError naming the key).
- load_model(spec, *, device="cpu", dtype="auto", trust_remote_code=False, target=None, role="model")
  -> LoadedModel(model, tokenizer, name, spec).  dtype "auto": float32 on CPU, bfloat16 on CUDA.
- load_pair(model: ModelConfig, device="cpu") -> (target, draft): loads both, then check_pair.
- check_pair(target: ModelFacts, draft: ModelFacts | None, max_context_len) -> context length:
  the one check of a pair (shared vocabulary, context); models/pair.py.
- torch_dtype(dtype, device) -> torch.dtype; truncated_draft(target_model, num_layers) -> the
  target's first layers as a draft (shared weights).
- Draft kind "distilled" calls distributed_spec.models.distilled.load_distilled_draft(source, target_model).
- fetch.smollm2_gguf_path() -> Path of SmolLM2-135M-Instruct.Q4_1.gguf (fetched once when missing).
- tiny.tiny_llama(vocab_size, num_layers, hidden, seed, max_position_embeddings, logit_scale, dtype),
  tiny.perturbed_copy(model, noise, seed), tiny.tiny_tokenizer(vocab_size): small random models for tests.

The loader's names are imported on first use: models/config.py and models/pair.py are torch-free and
distributed_spec.config imports them before the CLI has loaded torch.
"""

from __future__ import annotations

from distributed_spec.lazy_exports import lazy_exports
from distributed_spec.models.config import DERIVED_KINDS, MODEL_KINDS, ModelConfig, ModelSpec
from distributed_spec.models.pair import ModelFacts, check_pair

_LOADING = ("LoadedModel", "load_model", "load_pair", "torch_dtype", "truncated_draft")

__all__ = [
    "DERIVED_KINDS",
    "MODEL_KINDS",
    "LoadedModel",
    "ModelConfig",
    "ModelFacts",
    "ModelSpec",
    "check_pair",
    "load_model",
    "load_pair",
    "torch_dtype",
    "truncated_draft",
]


__getattr__ = lazy_exports(__name__, {"loading": _LOADING})
