"""Distilled draft models: a few Llama decoder layers on top of the target's own embeddings and LM head.

A distilled draft shares the target's tokenizer, token embeddings and LM head (frozen, never stored:
they are taken from the target at load time) and owns only `num_hidden_layers` small decoder layers
and a final norm, trained by `python -m distributed_spec.distill` to match the target's next-token
distribution p with its own q (forward KL).

Sub-vocabulary head: optionally the draft scores only the K tokens the target uses most
(`sub_vocab_ids`, K << V), which cuts the LM-head cost (hidden x V, the biggest matmul of a tiny
draft) by V/K. The draft is still a proper distribution over the full vocabulary: q(x) = 0 outside
the sub-vocabulary (logits -inf there), so verification stays exact and the residual
max(p - q, 0) covers the tokens the draft cannot propose.

Checkpoint folder layout (what `save_distilled_draft` writes and `load_distilled_draft` reads):
    draft_config.json    format tag, the draft's LlamaConfig, the target's vocab/hidden size, K
    model.safetensors    decoder layers + final norm (bf16), `sub_vocab_ids` (int32 [K]) if any;
                         with weight_format "int8", each linear weight [out, in] is int8 with a
                         float32 `<name>_scale` [out, 1] (symmetric, per output row): half the bytes,
                         so twice the layers fit in the same checkpoint size
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import Cache, LlamaConfig, LlamaForCausalLM
from transformers.modeling_outputs import CausalLMOutputWithPast

from distributed_spec.models.lean_llama import decoder_forward, supports_lean_forward

logger = logging.getLogger(__name__)

DISTILLED_SMOLLM2_DRAFT_DIR = Path(__file__).resolve().parents[1] / "assets" / "drafts" / "smollm2-draft"
DRAFT_FORMAT = "distributed_spec.distilled_draft.v1"
CONFIG_NAME = "draft_config.json"
WEIGHTS_NAME = "model.safetensors"
SUB_VOCAB_KEY = "sub_vocab_ids"
SCALE_SUFFIX = "_scale"
WEIGHT_FORMATS = ("bf16", "int8")


class SubVocabLlamaForCausalLM(LlamaForCausalLM):
    """A LlamaForCausalLM whose LM head scores only K of the V tokens; logits are -inf elsewhere.

    `lm_head` is Linear(hidden, K) and `sub_vocab_ids` ([K] long) maps its rows to token ids.
    forward keeps LlamaForCausalLM's interface (attention_mask, position_ids, KV cache, use_cache,
    logits_to_keep) and returns logits [B, T, V], so callers see an ordinary causal LM.
    """

    # Inference steps through models/lean_llama.py (False: transformers' own forward, for comparison).
    lean_forward: bool = True

    def __init__(self, config: LlamaConfig, sub_vocab_ids: torch.Tensor):
        super().__init__(config)
        # The full [V, hidden] head built by the parent is replaced: only K rows are ever used.
        self.lm_head = nn.Linear(config.hidden_size, sub_vocab_ids.numel(), bias=False)
        self.register_buffer("sub_vocab_ids", sub_vocab_ids.long(), persistent=False)
        # Decided once: the config does not change, and its getattrs cost on every draft forward.
        self._lean_config = supports_lean_forward(config)

    def sub_vocab_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """hidden_states [..., hidden] -> logits over the sub-vocabulary [..., K]."""
        return self.lm_head(hidden_states)

    def scatter_to_vocab(self, sub_logits: torch.Tensor) -> torch.Tensor:
        """sub_logits [..., K] -> logits [..., V], -inf outside the sub-vocabulary."""
        logits = sub_logits.new_full((*sub_logits.shape[:-1], self.config.vocab_size), float("-inf"))
        return logits.index_copy_(-1, self.sub_vocab_ids, sub_logits)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        # The KV cache travels in kwargs under whichever name this transformers version uses
        # (`cache` in 5.x, `past_key_values` before); LlamaModel resolves it.
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if self._lean_call(input_ids, attention_mask, position_ids, cache, use_cache, kwargs):
            # The engine's calls (slot mask, positions, cache): plain torch, no module plumbing.
            hidden_states = decoder_forward(self.model, input_ids, attention_mask, position_ids, cache)
            extra = {"cache": cache}
        else:
            outputs = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                inputs_embeds=inputs_embeds,
                use_cache=use_cache,
                **kwargs,
            )
            hidden_states = outputs.last_hidden_state
            extra = {name: value for name, value in outputs.items() if name != "last_hidden_state"}
        if isinstance(logits_to_keep, int):
            hidden_states = hidden_states[:, -logits_to_keep:] if logits_to_keep > 0 else hidden_states
        else:
            hidden_states = hidden_states[:, logits_to_keep]
        # A fresh dense copy: the slice keeps the strides of [B, T, hidden], and on the CPU a bf16
        # linear over such a view takes a batched-matmul path that copies the whole head weight
        # (3.5 ms instead of 0.3 ms per draft step with K = 8192).
        hidden_states = hidden_states.clone(memory_format=torch.contiguous_format)
        logits = self.scatter_to_vocab(self.sub_vocab_logits(hidden_states))
        return CausalLMOutputWithPast(logits=logits, **extra)

    def _lean_call(self, input_ids, attention_mask, position_ids, cache, use_cache, kwargs) -> bool:
        """Whether this call is an inference step that models/lean_llama.py computes: token ids, a 2D
        slot mask, explicit positions and a cache, nothing asked of the modules (attentions, hidden
        states), a config it supports. Training and evaluation without a cache go through transformers."""
        return (
            self.lean_forward
            and not self.training
            and input_ids is not None
            and attention_mask is not None
            and attention_mask.dim() == 2
            and position_ids is not None
            and isinstance(cache, Cache)
            and use_cache is not False
            and not (set(kwargs) - {"cache", "past_key_values"})
            and self._lean_config
        )


def draft_llama_config(target_config, num_hidden_layers: int, intermediate_size: int) -> LlamaConfig:
    """A LlamaConfig for the draft: the target's width, heads, RoPE and vocabulary; fewer, narrower layers."""
    rope = getattr(target_config, "rope_parameters", None)
    extra = (
        {"rope_parameters": dict(rope)} if rope else {"rope_theta": getattr(target_config, "rope_theta", 1e4)}
    )
    return LlamaConfig(
        vocab_size=target_config.vocab_size,
        hidden_size=target_config.hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=target_config.num_attention_heads,
        num_key_value_heads=getattr(target_config, "num_key_value_heads", target_config.num_attention_heads),
        head_dim=getattr(target_config, "head_dim", None),
        hidden_act=getattr(target_config, "hidden_act", "silu"),
        max_position_embeddings=target_config.max_position_embeddings,
        rms_norm_eps=getattr(target_config, "rms_norm_eps", 1e-6),
        bos_token_id=target_config.bos_token_id,
        eos_token_id=target_config.eos_token_id,
        pad_token_id=getattr(target_config, "pad_token_id", None),
        # The draft's head is not tied to its own embedding table: both are the target's tensors.
        tie_word_embeddings=False,
        **extra,
    )


def build_draft(
    target_model: nn.Module, config: LlamaConfig, sub_vocab_ids: torch.Tensor | None = None
) -> LlamaForCausalLM:
    """An untrained draft on `target_model`'s device and dtype, sharing its embeddings and LM head.

    sub_vocab_ids: [K] token ids for a sub-vocabulary head, or None for the full [V] head.
    The shared tensors are frozen; the decoder layers and final norm are the trainable part.
    """
    embed_weight = target_model.get_input_embeddings().weight  # [V, hidden]
    head_weight = target_model.get_output_embeddings().weight  # [V, hidden]
    if sub_vocab_ids is None:
        draft = LlamaForCausalLM(config)
    else:
        draft = SubVocabLlamaForCausalLM(config, sub_vocab_ids.to(head_weight.device))
    draft.to(device=embed_weight.device, dtype=embed_weight.dtype)
    draft.model.embed_tokens.weight = embed_weight
    if sub_vocab_ids is None:
        draft.lm_head.weight = head_weight
    else:
        draft.lm_head.weight = nn.Parameter(head_weight.detach()[draft.sub_vocab_ids].clone())
    draft.model.embed_tokens.weight.requires_grad_(False)
    draft.lm_head.weight.requires_grad_(False)
    return draft


def trainable_state_dict(draft: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    """The draft's own weights (decoder layers, final norm): everything but the target's tensors."""
    return {
        name: tensor
        for name, tensor in draft.state_dict().items()
        if not name.startswith(("model.embed_tokens.", "lm_head.")) and "rotary_emb" not in name
    }


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [out, in] float -> (int8 [out, in], float32 scale [out, 1]); weight ~ q * scale."""
    weight = weight.detach().float()
    scale = weight.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
    return (weight / scale).round().clamp(-127, 127).to(torch.int8), scale


def _stored_tensors(draft: LlamaForCausalLM, weight_format: str) -> dict[str, torch.Tensor]:
    """The draft's own weights as written to model.safetensors (bf16, or int8 + scale for matrices)."""
    tensors = {}
    for name, tensor in trainable_state_dict(draft).items():
        if weight_format == "int8" and tensor.dim() == 2:
            tensors[name], tensors[name + SCALE_SUFFIX] = quantize_int8(tensor)
        else:
            tensors[name] = tensor.detach().to(torch.bfloat16)
    return {name: tensor.contiguous().cpu() for name, tensor in tensors.items()}


def read_draft_weights(checkpoint_dir: str | Path) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """model.safetensors of a draft folder -> (float32 weights by name, int32 sub_vocab_ids or None).

    int8 matrices are dequantized (q * scale); bf16 tensors are widened.
    """
    tensors = load_file(str(Path(checkpoint_dir) / WEIGHTS_NAME))
    sub_vocab_ids = tensors.pop(SUB_VOCAB_KEY, None)
    weights = {}
    for name, tensor in tensors.items():
        if name.endswith(SCALE_SUFFIX):
            continue
        scale = tensors.get(name + SCALE_SUFFIX)
        weights[name] = tensor.float() * scale if scale is not None else tensor.float()
    return weights, sub_vocab_ids


def save_distilled_draft(
    draft: LlamaForCausalLM, out_dir: str | Path, extra_config: dict | None = None, weight_format: str = "bf16"
) -> Path:
    """Write draft_config.json and model.safetensors into out_dir; returns out_dir.

    weight_format: "bf16" (every tensor bf16) or "int8" (linear weights int8 with per-row scales;
    norms bf16).
    """
    if weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"weight_format must be one of {WEIGHT_FORMATS}, got {weight_format!r}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = _stored_tensors(draft, weight_format)
    sub_vocab_ids = getattr(draft, "sub_vocab_ids", None)
    if sub_vocab_ids is not None:
        tensors[SUB_VOCAB_KEY] = sub_vocab_ids.to(torch.int32).cpu()
    save_file(tensors, str(out_dir / WEIGHTS_NAME))
    config = {
        "format": DRAFT_FORMAT,
        "llama_config": draft.config.to_dict(),
        "target_vocab_size": draft.config.vocab_size,
        "target_hidden_size": draft.config.hidden_size,
        "sub_vocab_size": None if sub_vocab_ids is None else int(sub_vocab_ids.numel()),
        "weight_format": weight_format,
        **(extra_config or {}),
    }
    (out_dir / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out_dir


def load_distilled_draft(checkpoint_dir: str | Path, target_model: nn.Module) -> LlamaForCausalLM:
    """Load a distilled draft for `target_model` (same tokenizer), on its device, in eval mode.

    The returned model is a LlamaForCausalLM (or its sub-vocabulary subclass): forward(input_ids,
    attention_mask, position_ids, KV cache, use_cache) -> logits [B, T, V]. Its embeddings and LM
    head are `target_model`'s tensors, and its layers take the target's dtype.
    """
    checkpoint_dir = Path(checkpoint_dir)
    config_path = checkpoint_dir / CONFIG_NAME
    if not config_path.is_file():
        raise FileNotFoundError(
            f"{config_path} is missing: point the draft checkpoint path at a folder made by python -m distributed_spec.distill"
        )
    meta = json.loads(config_path.read_text())
    if meta.get("format") != DRAFT_FORMAT:
        raise ValueError(f"{config_path} has format {meta.get('format')!r}, expected {DRAFT_FORMAT!r}")
    target_config = target_model.config
    if (meta["target_vocab_size"], meta["target_hidden_size"]) != (
        target_config.vocab_size,
        target_config.hidden_size,
    ):
        raise ValueError(
            f"draft {checkpoint_dir} was distilled for a target with vocab {meta['target_vocab_size']} and hidden "
            f"{meta['target_hidden_size']}, but the target has vocab {target_config.vocab_size} and hidden "
            f"{target_config.hidden_size}: choose the draft checkpoint made for this target"
        )
    tensors, sub_vocab_ids = read_draft_weights(checkpoint_dir)
    config = LlamaConfig.from_dict(meta["llama_config"])
    draft = build_draft(target_model, config, sub_vocab_ids)
    own = trainable_state_dict(draft)
    if set(own) != set(tensors):
        raise ValueError(
            f"{checkpoint_dir / WEIGHTS_NAME} holds {sorted(set(tensors) ^ set(own))[:4]}... that do not match "
            "the draft architecture in draft_config.json; re-export the checkpoint with python -m distributed_spec.distill"
        )
    with torch.no_grad():
        for name, tensor in own.items():
            tensor.copy_(tensors[name])
    return draft.eval()
