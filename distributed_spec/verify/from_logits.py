"""Verification from target logits: the fused Triton kernel where it serves the device (CUDA),
else the torch rules on `logits_to_probs(target_logits)`. Both give the same tau for the same
uniforms (tests/verify/test_triton_block.py).

    from distributed_spec.verify import verify_logits
"""

from __future__ import annotations

import torch

from distributed_spec.verify.rules import VerifyOutput, VerifyUniforms, verify
from distributed_spec.verify.sampling import SamplingParams, logits_to_probs


def verify_logits(
    method: str,
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    num_draft_tokens: torch.Tensor | None,
    uniforms: VerifyUniforms | None,
    params: SamplingParams,
) -> VerifyOutput:
    """Warp the target logits as the draft's were warped, then verify.

    Args:
        draft_ids: X [B, g] long; draft_probs: q [B, g, V] (warped with `params`)
        target_logits: [B, g+1, V] unwarped, any float dtype
        num_draft_tokens: n [B] long or None (g on every row); uniforms: eta [B, g], u [B]
    """
    if method != "greedy" and target_logits.device.type == "cuda":
        # Imported here: Triton is needed (and importable) only where a GPU runs the kernel.
        from distributed_spec.verify.triton_block import fused_available, verify_fused

        if fused_available(target_logits.device):
            return verify_fused(method, target_logits, draft_ids, draft_probs, num_draft_tokens, uniforms, params)
    target_probs = logits_to_probs(target_logits, params)
    return verify(method, draft_ids, draft_probs, target_probs, num_draft_tokens, uniforms)
