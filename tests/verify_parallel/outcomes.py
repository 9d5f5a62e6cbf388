"""Comparing a verifier's outcomes with the torch reference's for identical uniforms.

Shared by the Triton kernel tests (tests/verify/test_triton_block.py) and the vocabulary-parallel
tests: tau must be identical; Y identical except where u * total lies within BOUNDARY_TOLERANCE of
a CDF boundary (float rounding of the two implementations may pick either neighbour there), and
always of positive probability.
"""

from __future__ import annotations

import torch

from distributed_spec.verify import VerifyOutput
from distributed_spec.verify.rules import _on_path, block_acceptance_probs

# Relative distance of u * total to a CDF boundary below which either neighbouring token is right.
BOUNDARY_TOLERANCE = 1e-6


def sampling_weights(method, target_probs, draft_ids, draft_probs, num_draft_tokens, accepted_counts):
    """The reference's unnormalised distribution of Y given tau, per row -> [B, V] float64.

    target_probs [B, g+1, V], draft_ids [B, g], draft_probs [B, g, V], n [B], tau [B].
    """
    batch_size, g = draft_ids.shape
    rows = torch.arange(batch_size)
    p = target_probs[rows, accepted_counts].double()
    if g == 0:
        return p
    scales = torch.ones(batch_size, dtype=torch.float64)
    if method == "block":
        r = block_acceptance_probs(_on_path(target_probs, draft_ids), _on_path(draft_probs, draft_ids))
        scales = torch.cat([torch.ones(batch_size, 1, dtype=torch.float64), r], dim=1)[rows, accepted_counts]
    q = draft_probs[rows, accepted_counts.clamp(max=g - 1)].double()
    residual = (p * scales.unsqueeze(1) - q).clamp(min=0.0)
    use_target = (accepted_counts >= num_draft_tokens) | ~(residual.sum(1) > 0)
    return torch.where(use_target.unsqueeze(1), p, residual)


def assert_same_outcomes(
    method: str,
    output: VerifyOutput,
    reference: VerifyOutput,
    target_probs: torch.Tensor,
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    u: torch.Tensor,
    max_boundary_fraction: float = 0.1,
) -> int:
    """Asserts as the module docstring says; returns the number of rows whose Y was compared."""
    # Host syncs: the comparison runs on the CPU.
    accepted_counts, next_tokens, accepted_mask = (
        t.cpu() for t in (output.accepted_counts, output.next_tokens, output.accepted_mask)
    )
    assert torch.equal(accepted_counts, reference.accepted_counts), (
        accepted_counts,
        reference.accepted_counts,
    )
    assert torch.equal(accepted_mask, reference.accepted_mask)
    weights = sampling_weights(
        method, target_probs, draft_ids, draft_probs, num_draft_tokens, accepted_counts
    )
    rows = torch.arange(len(weights))
    assert bool((weights[rows, next_tokens] > 0).all()), "a token of zero probability"
    cdf = weights.cumsum(1)
    threshold = u.double() * cdf[:, -1]
    near_boundary = ((cdf - threshold.unsqueeze(1)).abs() <= BOUNDARY_TOLERANCE * cdf[:, -1:]).any(1)
    same = next_tokens == reference.next_tokens
    assert bool((same | near_boundary).all()), (next_tokens, reference.next_tokens)
    assert int(near_boundary.sum()) <= max(1, int(max_boundary_fraction * len(rows)))
    return int((~near_boundary).sum())
