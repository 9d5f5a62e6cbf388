"""Model loading: targets and drafts from a hub id, a safetensors directory, a GGUF file or the embedded SmolLM2.

    from distributed_spec.models import ModelSpec, load_pair
    target, draft = load_pair(ModelSpec("smollm2"), ModelSpec(kind="truncated", num_layers=4))
    target.model, target.tokenizer, target.name       # LoadedModel fields

API:
- ModelSpec(source="smollm2" | hub id | directory | path.gguf | distilled checkpoint dir,
  kind="auto" | "smollm2" | "hub" | "dir" | "gguf" | "truncated" | "distilled",
  dtype="auto" | "float32" | "bfloat16" | "float16" | "float64", device="cpu", num_layers=None,
  trust_remote_code=False, revision=None).  dtype "auto": float32 on CPU, bfloat16 on CUDA.
- load_model(spec, target=None, role="model") -> LoadedModel(model, tokenizer, name, spec)
- load_pair(target_spec, draft_spec) -> (target, draft): loads both, then check_shared_vocabulary.
- check_shared_vocabulary(target, draft): ValueError naming both models when vocabularies differ.
- truncated_draft(target_model, num_layers) -> the target's first layers as a draft (shared weights).
- Draft kind "distilled" calls distributed_spec.models.distilled.load_distilled_draft(source, target_model)
  (imported lazily; that module is provided by the distillation work).
- fetch.smollm2_gguf_path() -> Path of SmolLM2-135M-Instruct.Q4_1.gguf (fetched once when missing).
- tiny.tiny_llama(vocab_size, num_layers, hidden, seed, max_position_embeddings, logit_scale, dtype),
  tiny.perturbed_copy(model, noise, seed), tiny.tiny_tokenizer(vocab_size): small random models for tests.
"""

from distributed_spec.models.loading import (
    MODEL_KINDS,
    LoadedModel,
    ModelSpec,
    check_shared_vocabulary,
    load_model,
    load_pair,
    truncated_draft,
)

__all__ = [
    "MODEL_KINDS",
    "LoadedModel",
    "ModelSpec",
    "check_shared_vocabulary",
    "load_model",
    "load_pair",
    "truncated_draft",
]
