"""A Llama decoder's forward in plain torch functions, over a `transformers` LlamaModel's own weights.

    from distributed_spec.models.lean_llama import decoder_forward, supports_lean_forward
    hidden = decoder_forward(model.model, input_ids, attention_mask, position_ids, cache)   # [B, n, hidden]

Why: around the distilled draft's ~15 small matmuls per token (2 layers, hidden 576),
`LlamaModel.forward` builds its mask and dispatches through ~70 modules with kernel-hub and
deprecation wrappers. Skipping that saves 0.3-0.7 ms of a 2.4-10 ms draft forward on 2 CPU cores
(`python -m scripts.bench_draft_forward`; the matmuls are the rest), and every drafted token pays
it on top of the target's forward (docs/design.md section 3, "The draft's forward").

Same results as `LlamaModel.forward` with an explicit 2D slot mask, position ids and a KV cache (the
way engine/runner.py calls it), up to float summation order: RMSNorm in float32 cast back, RoPE
cos/sin in the model's dtype, SDPA with a boolean mask. Only what the draft needs is supported
(`supports_lean_forward`); anything else goes through `transformers`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import Cache


def supports_lean_forward(config) -> bool:
    """Whether decoder_forward computes this config's model: SiLU MLP, no biases, default RoPE, full
    attention in every layer."""
    rope = getattr(config, "rope_parameters", None) or {}
    return (
        getattr(config, "hidden_act", None) == "silu"
        and not getattr(config, "attention_bias", False)
        and not getattr(config, "mlp_bias", False)
        and rope.get("rope_type", "default") == "default"
        and getattr(config, "sliding_window", None) is None
        and getattr(config, "model_type", None) == "llama"
    )


def rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """hidden [..., H] -> [..., H]: normalised in float32, scaled by weight [H] in hidden's dtype."""
    variance = hidden.float().pow(2).mean(-1, keepdim=True)
    return weight * (hidden.float() * torch.rsqrt(variance + eps)).to(hidden.dtype)


def rotary_cos_sin(position_ids: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """position_ids [B, n] -> (cos, sin) [B, 1, n, D] in dtype (D = 2 x inv_freq's length)."""
    freqs = position_ids[..., None].float() * inv_freq.float()
    angles = torch.cat((freqs, freqs), dim=-1)[:, None]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """states [B, heads, n, D] rotated by the position's angle (halves rotated, as Llama's RoPE)."""
    first, second = states.chunk(2, dim=-1)
    return states * cos + torch.cat((-second, first), dim=-1) * sin


def slot_attention_mask(slot_mask: torch.Tensor, num_new: int) -> torch.Tensor:
    """slot_mask [B, S] (1: the slot holds a kept token; the last num_new slots are this forward's)
    -> [B, 1, num_new, S] bool: query i sees slot j iff j is kept and not after it (causal order over
    slots). A query always sees its own slot, so a padding query (its slot masked) attends to itself
    rather than to nothing: SDPA's softmax over an all-masked row is NaN, and NaN keys and values in a
    masked slot still poison every later query (0 x NaN)."""
    num_slots = slot_mask.shape[1]
    query_slots = torch.arange(num_slots - num_new, num_slots, device=slot_mask.device)
    key_slots = torch.arange(num_slots, device=slot_mask.device)
    causal = key_slots[None, :] <= query_slots[:, None]
    own = key_slots[None, :] == query_slots[:, None]
    return ((slot_mask.bool()[:, None, None, :] & causal) | own)


@torch.no_grad()
def decoder_forward(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    cache: Cache,
) -> torch.Tensor:
    """One forward of a LlamaModel (`model`, e.g. LlamaForCausalLM.model) appending n slots to `cache`.

    Args:
        input_ids: [B, n] long.
        attention_mask: [B, S] slot mask of the whole cache after this forward (S = cached + n).
        position_ids: [B, n] long.
        cache: the KV cache ([B, kv_heads, S - n, D] per layer before the call), updated in place.
    Returns:
        [B, n, hidden]: the final norm's output (the LM head's input).
    """
    config = model.config
    batch_size, num_new = input_ids.shape
    num_heads, num_kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    eps = config.rms_norm_eps
    hidden = F.embedding(input_ids, model.embed_tokens.weight)
    cos, sin = rotary_cos_sin(position_ids, model.rotary_emb.inv_freq, hidden.dtype)
    mask = slot_attention_mask(attention_mask, num_new)
    for layer_idx, layer in enumerate(model.layers[: config.num_hidden_layers]):
        # The projections' own forward (no module hooks): F.linear for nn.Linear, the packed product
        # for models/cpu_linear.py's PackedLinear (bias-free here: supports_lean_forward).
        attention, mlp = layer.self_attn, layer.mlp
        normed = rms_norm(hidden, layer.input_layernorm.weight, eps)
        query = attention.q_proj.forward(normed).view(batch_size, num_new, num_heads, head_dim).transpose(1, 2)
        key = attention.k_proj.forward(normed).view(batch_size, num_new, num_kv_heads, head_dim).transpose(1, 2)
        value = attention.v_proj.forward(normed).view(batch_size, num_new, num_kv_heads, head_dim).transpose(1, 2)
        query, key = apply_rotary(query, cos, sin), apply_rotary(key, cos, sin)
        key, value = cache.update(key, value, layer_idx)
        attended = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, scale=attention.scaling, enable_gqa=num_kv_heads != num_heads
        )
        attended = attended.transpose(1, 2).reshape(batch_size, num_new, num_heads * head_dim)
        hidden = hidden + attention.o_proj.forward(attended)
        normed = rms_norm(hidden, layer.post_attention_layernorm.weight, eps)
        gated = F.silu(mlp.gate_proj.forward(normed)) * mlp.up_proj.forward(normed)
        hidden = hidden + mlp.down_proj.forward(gated)
    return rms_norm(hidden, model.norm.weight, eps)
