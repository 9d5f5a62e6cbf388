"""How many tokens the draft proposes per iteration: the step's block length g and each row's share.

    from distributed_spec.engine.draft_length import adapt_draft_lengths, draft_confidence, plan_step

Two schedules (EngineConfig.gamma_schedule) set g before a block is drafted:
- "constant": every row drafts g = EngineConfig.gamma tokens per iteration.
- "adaptive": each row keeps its own g, starting at EngineConfig.gamma; after an iteration it grows
  by 2 when the row kept its whole block (its first g drafts) and shrinks by 1 otherwise, within
  [1, max_gamma]. This is the rule of Hugging Face's "heuristic" assistant schedule. A batched step drafts the longest
  row's g for every row: the target scores all of it in the same forward pass anyway, and a longer
  block never lowers a row's expected number of tokens.

Within a block, a confidence stop (EngineConfig.draft_confidence_threshold > 0, as in Hugging Face's
assistant_confidence_threshold) ends a row's block after the first draft token X_i whose probability
under the draft, q_i(X_i), is below the threshold.

All of it stays exact for every verifier: a row's block length is a function of verified history and
of its own drafted prefix X_1..X_i, never of the target's verdict on this block or of the verifier's
uniforms. tests/verify/test_oracle.py checks block and token verification with prefix-dependent
stops against the exact enumeration.
"""

from __future__ import annotations

import torch

from distributed_spec.verify import SamplingParams

GAMMA_SCHEDULES = ("constant", "adaptive")


def next_draft_length(gamma: int, num_accepted: int, num_drafted: int, max_gamma: int) -> int:
    """A row's g for its next iteration under the "adaptive" schedule.

    Args:
        gamma: the row's g for the iteration just verified.
        num_accepted: draft tokens it kept (tau); num_drafted: draft tokens it verified (more than
            gamma when a longer row set the step's length, fewer when its token budget clipped it).
        max_gamma: the largest g allowed.
    """
    if num_accepted >= min(gamma, num_drafted):
        return min(gamma + 2, max_gamma)
    return max(gamma - 1, 1)


def adapt_draft_lengths(
    gammas: list[int], rows: list[int], accepted_counts: list[int], num_draft_tokens: list[int], max_gamma: int
) -> None:
    """After an iteration, set each active row's next g in place ("adaptive" schedule).

    Args:
        gammas: g per prompt row of the batch, indexed by `rows`' entries.
        rows: [B] the prompt row of each active row; accepted_counts, num_draft_tokens: [B] its tau
            and the draft tokens it verified.
    """
    for row, num_accepted, num_drafted in zip(rows, accepted_counts, num_draft_tokens):
        gammas[row] = next_draft_length(gammas[row], num_accepted, num_drafted, max_gamma)


def plan_step(row_gammas: list[int], remaining: list[int]) -> tuple[int, list[int]]:
    """The step's block length and each active row's number of draft tokens to verify.

    Args:
        row_gammas: [B] each active row's g (all equal under "constant").
        remaining: [B] tokens each row may still emit (>= 1).
    Returns:
        step_gamma: tokens the draft proposes for every row, >= 1.
        num_draft_tokens: [B] per row min(step_gamma, remaining - 1): a row emits at most n + 1 tokens,
            so it never verifies drafts past its budget.
    """
    step_gamma = max(1, min(max(row_gammas), max(remaining) - 1))
    return step_gamma, [min(step_gamma, budget - 1) for budget in remaining]


def draft_confidence(
    logits: torch.Tensor, probs: torch.Tensor, token_ids: torch.Tensor, params: SamplingParams
) -> torch.Tensor:
    """The draft's probability of the token it just drafted: what the confidence stop compares.

    Args:
        logits: [B, V] the draft's raw logits at this position; probs: [B, V] its warped q_i;
        token_ids: [B] the drafted X_i.
    Returns:
        [B] float32: q_i(X_i); at temperature 0, where q_i is one-hot, the softmax of the raw logits.
    """
    source = logits.float().softmax(dim=-1) if params.is_greedy else probs
    return source.gather(-1, token_ids[:, None].to(source.device))[:, 0]
