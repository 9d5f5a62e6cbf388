"""How many tokens the draft proposes per step: the schedules' rules and the confidence stop.

    from distributed_spec.engine.draft_length import draft_confidence, next_draft_length

Three schedules (EngineConfig.draft_len_schedule) set g before a block is drafted (the scheduler,
scheduler.py, applies them; every row's g is clipped so it never verifies past its token budget):
- "constant": every row drafts g = verifier.num_draft_tokens tokens per step.
- "adaptive": each row keeps its own g, starting at verifier.num_draft_tokens; after a step it grows by 2
  when the row kept its whole block and shrinks by 1 otherwise, within [1, max_draft_len] (Hugging
  Face's "heuristic" assistant schedule). A step drafts the longest row's g; each row verifies its
  own g only, so its tokens do not depend on the rows that share its batch.
- "goodput": each step, the g in {0, ..., max_draft_len} with the most expected tokens per second
  (goodput.py); 0 is a plain decoding step without the draft.

Within a block, a confidence stop (EngineConfig.draft_confidence_threshold > 0, as in Hugging Face's
assistant_confidence_threshold) ends a row's block after the first draft token X_i whose probability
under the draft, q_i(X_i), is below the threshold.

All of it stays exact for every verifier: a row's block length is a function of verified history (and
of timings, for "goodput") and of its own drafted prefix X_1..X_i, never of the target's verdict on
this block or of the verifier's uniforms. tests/verify/test_oracle.py checks block and token
verification with such lengths and stops against the exact enumeration.
"""

from __future__ import annotations

import torch

from distributed_spec.verify import RowSampling, Sampling


def next_draft_length(g: int, num_accepted: int, num_drafted: int, max_draft_len: int) -> int:
    """A row's g for its next iteration under the "adaptive" schedule.

    Args:
        g: the row's g for the iteration just verified.
        num_accepted: draft tokens it kept (tau); num_drafted: draft tokens it verified (more than
            g when a longer row set the step's length, fewer when its token budget clipped it).
        max_draft_len: the largest g allowed.
    """
    if num_accepted >= min(g, num_drafted):
        return min(g + 2, max_draft_len)
    return max(g - 1, 1)


def draft_confidence(
    logits: torch.Tensor, probs: torch.Tensor, token_ids: torch.Tensor, params: Sampling
) -> torch.Tensor:
    """The draft's probability of the token it just drafted: what the confidence stop compares.

    Args:
        logits: [B, V] the draft's raw logits at this position; probs: [B, V] its warped q_i;
        token_ids: [B] the drafted X_i; params: one setting, or each row's own.
    Returns:
        [B] float32: q_i(X_i); at temperature 0, where q_i is one-hot, the softmax of the raw logits.
    """
    token_ids = token_ids[:, None].to(probs.device)
    warped = probs.gather(-1, token_ids)[:, 0]
    greedy = params.greedy_rows() if isinstance(params, RowSampling) else [params.is_greedy] * len(token_ids)
    if not any(greedy):
        return warped
    raw = logits.float().softmax(dim=-1).gather(-1, token_ids.to(logits.device))[:, 0].to(warped.device)
    return torch.where(torch.tensor(greedy, device=warped.device), raw, warped)
