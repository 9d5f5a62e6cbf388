"""Grouped-query attention on the CPU without copying the KV cache per query head.

    from distributed_spec.models.cpu_attention import use_gqa_attention
    use_gqa_attention(model)      # True: the model's attention now calls SDPA with enable_gqa

transformers' "sdpa" attention hands torch's SDPA each key/value head repeated once per query head
of its group (`repeat_kv`: a copy of the layer's whole cache, every layer, every forward) whenever
the forward has a mask and more than one query position; a one-position forward packs the query
heads instead and copies nothing. A verification forward ([B, g + 1] with the slot mask) is such a
forward, the autoregressive step is not, so the copy falls on speculation alone, and grows with
the batch and the context: SmolLM2's forward of 3 tokens per row after 100 took 165 ms with it and
155 ms without at B = 16, 1.06x at B = 4, nothing measurable at B = 1
(`python -m scripts.bench_gqa_attention`, docs/RESULTS.md). torch's SDPA takes grouped
heads itself (`enable_gqa`), and on the CPU its kernel computes each query head against its group's
key/value head exactly as it does against the repeated copy: the outputs are bitwise the same. That
is checked once per model at load on its own head shapes and dtype (`matches_repeated_heads`); a
CPU where it differs keeps transformers' path. CUDA keeps it too: there SDPA with a mask and grouped
heads falls back to its slowest kernel.
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

logger = logging.getLogger(__name__)

# The attention implementation's name in transformers' registries (config._attn_implementation).
GQA_ATTENTION = "sdpa_gqa_cpu"


def gqa_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function interface: query [B, H, n, D], key and value [B, H_kv, S, D],
    attention_mask [B, 1, n, S] (or None) -> (output [B, n, H, D], None).

    SDPA with grouped heads for a masked forward of n > 1 positions on the CPU; every other call
    (one position, no mask, position biases, ...) goes to transformers' own sdpa path unchanged."""
    num_heads, num_kv_heads = query.shape[1], key.shape[1]
    if (
        query.device.type != "cpu"
        or query.shape[2] == 1
        or attention_mask is None
        or num_kv_heads == num_heads
        or num_heads % num_kv_heads
        or set(kwargs) - {"position_ids", "cache_position", "sliding_window", "use_cache"}
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    output = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )
    return output.transpose(1, 2).contiguous(), None


@functools.cache
def matches_repeated_heads(num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> bool:
    """Whether SDPA with grouped heads gives transformers' repeated-heads result bitwise on this CPU,
    for a masked forward of 3 positions over 17 slots in `dtype` (once per shape and dtype in a
    process: the target's and a truncated draft's runners, and every test's, ask the same)."""
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(2, num_heads, 3, head_dim, generator=generator).to(dtype)
    key, value = (torch.randn(2, num_kv_heads, 17, head_dim, generator=generator).to(dtype) for _ in range(2))
    mask = torch.rand(2, 1, 3, 17, generator=generator) > 0.3
    mask[..., -1] = True
    groups = num_heads // num_kv_heads
    repeated = F.scaled_dot_product_attention(query, repeat_kv(key, groups), repeat_kv(value, groups), attn_mask=mask)
    grouped = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True)
    return torch.equal(repeated, grouped)


def use_gqa_attention(model: torch.nn.Module) -> bool:
    """Switch a CPU model on transformers' "sdpa" attention with grouped key/value heads to
    `gqa_attention_forward` (in place); returns whether it did."""
    config = getattr(model, "config", None)
    parameter = next(model.parameters(), None)
    if config is None or parameter is None or parameter.device.type != "cpu":
        return False
    # transformers' own models only: the attention function is theirs, set through their config.
    if getattr(config, "_attn_implementation", None) != "sdpa" or not hasattr(model, "set_attn_implementation"):
        return False
    num_heads = getattr(config, "num_attention_heads", None)
    num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
    if not num_heads or num_kv_heads == num_heads or num_heads % num_kv_heads:
        return False
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    if not matches_repeated_heads(num_heads, num_kv_heads, head_dim, parameter.dtype):
        logger.warning("grouped-query SDPA differs from repeated heads on this CPU: keeping transformers' attention")
        return False
    AttentionInterface.register(GQA_ATTENTION, gqa_attention_forward)
    # The masks are sdpa's: only the attention call differs.
    AttentionMaskInterface.register(GQA_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    model.set_attn_implementation(GQA_ATTENTION)
    return True
