"""The per-iteration steps of speculative decoding, as plain functions over ModelRunners.

    from distributed_spec.engine.steps import propose, score, commit_target, commit_draft

The single-process loop (speculative.py) calls them in this order; the Ray coordinator replays the
same order with the draft runner in one actor and the target runner in each shard actor.

Invariant between iterations, per row: both caches hold exactly the kept tokens except the last one,
`last_ids` (Y); the draft additionally lacks X_g when all g drafts were accepted (it never fed X_g),
so its pending input is `draft_input_ids` [B, 2] = [X_g or padding, Y] with `draft_input_mask`.

One iteration (g draft tokens, n[b] <= g of them verified in row b):
1. propose: the draft feeds its pending input, then samples X_1..X_g one at a time from its warped
   probabilities q (feeding X_1..X_{g-1}); its cache gains the pending slots (kept) + g-1 slots.
   With a confidence stop, g here is the longest row's block (draft_length.py); shorter rows
   verify only their own n[b] drafts.
2. score: the target feeds [Y, X_1..X_g] in ONE forward: p_1..p_{g+1}; its cache gains g+1 slots.
3. verify (distributed_spec.verify): tau[b] accepted drafts and the next token Y'[b].
4. commit: the target keeps 1 + tau of its g+1 new slots; the draft keeps min(tau, g-1) of its
   g-1 speculative slots; the next draft input is [X_g if tau == g, Y'].
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from distributed_spec.engine.draft_length import draft_confidence
from distributed_spec.engine.runner import ModelRunner
from distributed_spec.verify import Sampling, logits_to_probs, sample_from_probs


def propose(
    draft: ModelRunner,
    draft_input_ids: torch.Tensor,
    draft_input_mask: torch.Tensor,
    g: int,
    params: Sampling,
    draft_uniforms: torch.Tensor,
    to_sampled: Callable[[torch.Tensor], torch.Tensor] | None = None,
    confidence_threshold: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The draft proposes up to g tokens autoregressively.

    Args:
        draft_input_ids: [B, k] pending tokens (already kept), last column = Y.
        draft_input_mask: [B, k] 1 for real tokens (left padding).
        params: the warp of every row, or each row's own (RowSampling).
        draft_uniforms: [B, g] float64 in [0, 1), one per sampled draft token.
        to_sampled: maps each step's q_i [B, V] to the distribution actually sampled and verified
            (e.g. q rounded to the precision it is sent in, so verification stays exact); identity
            when None.
        confidence_threshold: a row's block ends after the first X_i with draft_confidence < this;
            drafting stops once every row's block has ended (0 disables: always g tokens).
    Returns:
        draft_ids [B, g'] long, draft_probs [B, g', V] float32 (q_i, warped, after to_sampled), with
        g' <= g the longest block; num_drafted [B] long, each row's block length (<= g').
    """
    logits = draft.forward_tokens(draft_input_ids, draft_input_mask, num_logits=1)[:, -1]  # [B, V]
    return draft_from_logits(draft, logits, g, params, draft_uniforms, to_sampled, confidence_threshold)


def draft_from_logits(
    draft: ModelRunner,
    logits: torch.Tensor,
    g: int,
    params: Sampling,
    draft_uniforms: torch.Tensor,
    to_sampled: Callable[[torch.Tensor], torch.Tensor] | None = None,
    confidence_threshold: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """propose after its first forward: sample X_1 from `logits` [B, V] (the draft's logits after
    its pending input), then X_2..X_g feeding X_1..X_{g-1}. Same arguments and returns as propose."""
    num_drafted = torch.full((logits.shape[0],), g, dtype=torch.long, device=logits.device)  # [B]
    drafting = torch.ones_like(num_drafted, dtype=torch.bool)  # [B]
    draft_ids, draft_probs = [], []
    for i in range(g):
        probs = logits_to_probs(logits, params)  # [B, V]
        if to_sampled is not None:
            probs = to_sampled(probs)
        token_ids = sample_from_probs(probs, draft_uniforms[:, i].to(probs.device))  # [B]
        draft_ids.append(token_ids)
        draft_probs.append(probs)
        if confidence_threshold > 0 and i < g - 1:
            ends = drafting & (draft_confidence(logits, probs, token_ids, params) < confidence_threshold)
            num_drafted = torch.where(ends, i + 1, num_drafted)
            drafting &= ~ends
            # Host sync: no further draft forward once every row's block has ended.
            if not bool(drafting.any()):
                break
        if i < g - 1:
            logits = draft.forward_tokens(token_ids[:, None])[:, 0]
    return torch.stack(draft_ids, dim=1), torch.stack(draft_probs, dim=1), num_drafted


def score(
    target: ModelRunner,
    last_ids: torch.Tensor,
    draft_ids: torch.Tensor,
    decoding: torch.Tensor | None = None,
    max_staged: int | None = None,
) -> torch.Tensor:
    """The target scores the g+1 positions of the block in one forward pass (after each row's next
    staged prompt chunk, if any).

    Args:
        last_ids: [B] Y, the last kept token of each row (not yet in the target's cache).
        draft_ids: [B, g] (g may be 0: plain autoregressive decoding).
        decoding: [B] bool, rows whose block is fed (others feed their prompt chunk only); None: all.
        max_staged: staged prompt tokens fed per row at most (None: all).
    Returns:
        target_logits: [B, g+1, V] (unwarped; `verify_logits` warps them, or a fused kernel does).
    """
    input_ids = torch.cat([last_ids[:, None], draft_ids], dim=1)  # [B, g+1]
    input_mask = None if decoding is None else decoding[:, None].expand_as(input_ids).long()
    return target.forward_tokens(input_ids, input_mask, max_staged=max_staged)


def commit_target(
    target: ModelRunner, accepted_counts: torch.Tensor, g: int, decoding: torch.Tensor | None = None
) -> None:
    """Roll the target's cache back to the kept prefix: keep Y and the tau accepted drafts.

    Args:
        accepted_counts: [B] long tau in [0, g].
        decoding: [B] bool; rows not decoding keep none of the g+1 slots; None: all decode.
    """
    num_kept = accepted_counts + 1
    if decoding is not None:
        num_kept = torch.where(decoding, num_kept, 0)
    target.rollback(num_kept, g + 1)


def commit_draft(
    draft: ModelRunner,
    draft_ids: torch.Tensor,
    accepted_counts: torch.Tensor,
    next_tokens: torch.Tensor,
    decoding: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Roll the draft's cache back to the kept prefix and build its next pending input.

    Args:
        draft_ids: [B, g]; accepted_counts: [B] tau; next_tokens: [B] Y' (for a row not decoding:
            its unchanged Y); decoding: [B] bool, rows not decoding keep none of the draft's slots;
            None: all decode.
    Returns:
        draft_input_ids [B, 2] = [X_g, Y'], draft_input_mask [B, 2] = [tau == g, 1].
    """
    g = draft_ids.shape[1]
    num_kept = accepted_counts.clamp(max=g - 1)
    kept_last = accepted_counts == g
    if decoding is not None:
        num_kept = torch.where(decoding, num_kept, 0)
        kept_last = kept_last & decoding
    draft.rollback(num_kept, g - 1)
    draft_input_ids = torch.stack([draft_ids[:, -1], next_tokens], dim=1)
    draft_input_mask = torch.stack([kept_last.long(), torch.ones_like(next_tokens)], dim=1)
    return draft_input_ids, draft_input_mask


def sample_autoregressive(target_logits: torch.Tensor, u: torch.Tensor, params: Sampling) -> torch.Tensor:
    """The baseline's verify step: sample Y from p_1, the warped target distribution.

    Args:
        target_logits: [B, 1, V]; u: [B] float64 uniforms; params: one setting or each row's own.
    Returns:
        next_tokens [B] long.
    """
    target_probs = logits_to_probs(target_logits[:, 0], params)  # [B, V]
    return sample_from_probs(target_probs, u.to(target_probs.device))
