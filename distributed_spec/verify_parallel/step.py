"""One decoding step's verification on a vocabulary shard: `engine.executor.verify_step`, sharded.

Adds to `verify_vocab_parallel` what a step of the runtime needs: each row's own sampling settings
(rows sharing settings are verified together: `verify_by_row_groups`, as `verify_logits` does) and steps without
drafts (Y ~ p_1: token verification of an empty block samples exactly that). Every rank calls the
same collectives in the same order, because the grouping depends only on the settings, which are
the same on every rank.
"""

from __future__ import annotations

import torch

from distributed_spec.verify.from_logits import verify_by_row_groups
from distributed_spec.verify.rules import VerifyOutput, VerifyUniforms
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

    def verify_group(draft_ids, draft_probs, target_logits, num_draft_tokens, uniforms, params) -> VerifyOutput:
        return verify_vocab_parallel(
            method, target_logits, draft_ids, draft_probs, num_draft_tokens, uniforms, params, shard
        )

    output = verify_by_row_groups(
        sampling, verify_group, draft_ids, draft_probs, target_logits, num_draft_tokens.to(device), uniforms
    )
    return output.accepted_counts, output.next_tokens
