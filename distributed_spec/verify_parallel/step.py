"""One decoding step's verification on a vocabulary shard: `engine.executor.verify_step`, sharded.

Adds to `verify_vocab_parallel` what a step of the runtime needs: each row's own sampling settings
(rows sharing settings are verified together, as `verify_logits` groups them) and steps without
drafts (Y ~ p_1: token verification of an empty block samples exactly that). Every rank calls the
same collectives in the same order, because the grouping depends only on the settings, which are
the same on every rank.
"""

from __future__ import annotations

import torch

from distributed_spec.verify.rules import VerifyUniforms
from distributed_spec.verify.sampling import RowSampling
from distributed_spec.verify_parallel.shards import VocabShard
from distributed_spec.verify_parallel.vocab_parallel import verify_vocab_parallel


def verify_step_vocab_parallel(
    method: str,
    sampling: RowSampling,
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    eta: torch.Tensor,
    u: torch.Tensor,
    shard: VocabShard,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify one step's blocks on this rank's vocabulary slice; the result is identical on every rank.

    Args:
        method: verifier.method ("block", "token", "greedy"; "autoregressive" steps draft nothing).
        sampling: each row's settings (B rows).
        draft_ids: X [B, g] long, global ids; draft_probs: q [B, g, V/tp] this rank's slice (None
            when g = 0 or the verifier reads no q).
        target_logits: [B, g+1, V/tp] raw logits of this rank's ids.
        num_draft_tokens: [B] long; eta: [B, >= g] float64; u: [B] float64.
    Returns:
        accepted_counts [B] long, next_tokens [B] long.
    """
    device = target_logits.device
    batch_size, g = draft_ids.shape
    if g == 0:
        # No draft: token verification of an empty block samples Y from p_1 with u, as the
        # reference's sample_autoregressive does (same inverse CDF).
        method = "token" if method != "greedy" else method
        draft_probs = target_logits.new_zeros(batch_size, 0, shard.num_ids, dtype=torch.float32)
    uniforms = VerifyUniforms(eta=eta[:, :g].to(device), u=u.to(device))
    num_draft_tokens = num_draft_tokens.to(device)
    accepted_counts = torch.zeros(batch_size, dtype=torch.long, device=device)
    next_tokens = torch.zeros(batch_size, dtype=torch.long, device=device)
    for params, rows in _row_groups(sampling):
        index = None if rows is None else torch.tensor(rows, dtype=torch.long, device=device)
        pick = _rows_picker(index)
        output = verify_vocab_parallel(
            method,
            pick(target_logits),
            pick(draft_ids),
            pick(draft_probs),
            pick(num_draft_tokens),
            VerifyUniforms(eta=pick(uniforms.eta), u=pick(uniforms.u)),
            params,
            shard,
        )
        if index is None:
            return output.accepted_counts, output.next_tokens
        accepted_counts[index] = output.accepted_counts
        next_tokens[index] = output.next_tokens
    return accepted_counts, next_tokens


def _row_groups(sampling: RowSampling) -> list:
    """[(settings, rows)], rows None when every row shares the settings (no copies then)."""
    shared = sampling.shared()
    if shared is not None:
        return [(shared, None)]
    return sampling.groups()


def _rows_picker(index: torch.Tensor | None):
    def pick(tensor: torch.Tensor | None) -> torch.Tensor | None:
        if tensor is None or index is None:
            return tensor
        return tensor.index_select(0, index)

    return pick
