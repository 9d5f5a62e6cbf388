"""Verification from target logits: the fused Triton kernel where it serves the device (CUDA),
else the torch rules on `logits_to_probs(target_logits)`. Both give the same tau for the same
uniforms (tests/verify/test_triton_block.py).

With per-row settings (`RowSampling`), each group of rows sharing settings is verified on its own
(every rule is row by row): greedy rows get the greedy rule (or, on the torch path, the block and
token rules on one-hot p and q, which is the same prefix match), sampled rows their own warp.

    from distributed_spec.verify import verify_logits
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from distributed_spec.verify.rules import VerifyOutput, VerifyUniforms, verify
from distributed_spec.verify.sampling import RowSampling, Sampling, logits_to_probs


def verify_logits(
    method: str,
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    num_draft_tokens: torch.Tensor | None,
    uniforms: VerifyUniforms | None,
    params: Sampling,
) -> VerifyOutput:
    """Warp the target logits as the draft's were warped, then verify.

    Args:
        draft_ids: X [B, g] long; draft_probs: q [B, g, V] (warped with `params`)
        target_logits: [B, g+1, V] unwarped, any float dtype
        num_draft_tokens: n [B] long or None (g on every row); uniforms: eta [B, g], u [B]
        params: one setting for all rows, or each row's own (RowSampling of B rows)
    """
    if isinstance(params, RowSampling):
        return verify_by_row_groups(
            params,
            functools.partial(verify_logits, method),
            draft_ids,
            draft_probs,
            target_logits,
            num_draft_tokens,
            uniforms,
        )
    if method != "greedy" and target_logits.device.type == "cuda":
        # Imported here: Triton is needed (and importable) only where a GPU runs the kernel.
        from distributed_spec.verify.triton_block import fused_available, verify_fused

        if fused_available(target_logits.device):
            return verify_fused(method, target_logits, draft_ids, draft_probs, num_draft_tokens, uniforms, params)
    target_probs = logits_to_probs(target_logits, params)
    return verify(method, draft_ids, draft_probs, target_probs, num_draft_tokens, uniforms)


def verify_by_row_groups(
    sampling: RowSampling,
    verify_group: Callable[..., VerifyOutput],
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    num_draft_tokens: torch.Tensor | None,
    uniforms: VerifyUniforms | None,
) -> VerifyOutput:
    """verify_group(draft_ids, draft_probs, target_logits, num_draft_tokens, uniforms, params) on each
    group of rows sharing settings (all rows in one call, uncopied, when they share one), results
    gathered back into row order. Groups come in order of first appearance, so every rank of a
    shard group calls a collective verifier in the same order. Shapes as `verify_logits` ([B, ...]
    leading; target_logits and draft_probs may hold a vocabulary slice)."""
    shared = sampling.shared()
    if shared is not None:
        return verify_group(draft_ids, draft_probs, target_logits, num_draft_tokens, uniforms, shared)
    batch_size, g = draft_ids.shape
    device = target_logits.device
    accepted_counts = torch.zeros(batch_size, dtype=torch.long, device=device)
    next_tokens = torch.zeros(batch_size, dtype=torch.long, device=device)
    accepted_mask = torch.zeros(batch_size, g, dtype=torch.bool, device=device)
    for params, rows in sampling.groups():
        index = torch.tensor(rows, dtype=torch.long, device=device)
        pick = functools.partial(_select_rows, index=index)
        group_uniforms = None if uniforms is None else VerifyUniforms(eta=pick(uniforms.eta), u=pick(uniforms.u))
        output = verify_group(
            pick(draft_ids),
            pick(draft_probs),
            pick(target_logits),
            pick(num_draft_tokens),
            group_uniforms,
            params,
        )
        accepted_counts[index] = output.accepted_counts.to(device)
        next_tokens[index] = output.next_tokens.to(device)
        accepted_mask[index] = output.accepted_mask.to(device)
    return VerifyOutput(accepted_counts, next_tokens, accepted_mask)


def _select_rows(tensor: torch.Tensor | None, index: torch.Tensor) -> torch.Tensor | None:
    return None if tensor is None else tensor.index_select(0, index.to(tensor.device))
