"""The distillation loss terms, over the buckets {each top-k token of p the draft can score} + {the rest}.

Plain torch functions of the draft's logits over its output set and the target's stored top-k;
n = predicted positions, K = the draft's output set, k = stored top-k of p.
"""

from __future__ import annotations

import torch


def target_buckets(sub_ids: torch.Tensor, top_probs: torch.Tensor, rest: torch.Tensor, num_sub: int):
    """p over the buckets {each top-k token the draft can score} + {all other tokens}.

    sub_ids [n, k] top-k tokens of p as sub-vocabulary indices (num_sub where outside it); top_probs [n, k];
    rest [n] p mass outside the top-k. Returns p_top [n, k] (0 where not scorable) and p_other [n].
    """
    p_top = torch.where(sub_ids < num_sub, top_probs, 0.0)
    return p_top, (rest + (top_probs - p_top).sum(-1)).clamp(min=0.0)  # rounding: never below 0


def bucket_kl_loss(sub_logits: torch.Tensor, sub_ids: torch.Tensor, top_probs: torch.Tensor,
                   rest: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward KL(p || q) over buckets {each top-k token the draft can score} + {all other tokens}.

    sub_logits [n, K] draft logits over the sub-vocabulary; sub_ids [n, k] top-k tokens of p as
    sub-vocabulary indices (K where outside it); top_probs [n, k]; rest [n] p mass outside the top-k.
    Coarse-graining only merges tokens, so this KL is a lower bound of the full one and equals it
    when the top-k hold all of p's mass. Returns (mean cross-entropy: the loss, mean KL: to report).
    """
    log_q = torch.log_softmax(sub_logits.float(), dim=-1)
    log_q = torch.cat([log_q, log_q.new_full((log_q.shape[0], 1), float("-inf"))], dim=-1)  # [n, K+1]
    p_top, p_other = target_buckets(sub_ids, top_probs, rest, sub_logits.shape[-1])
    log_q_top = log_q.gather(-1, sub_ids).clamp(min=-100.0)
    log_q_other = torch.logsumexp(log_q.scatter(-1, sub_ids, float("-inf")), dim=-1).clamp(min=-100.0)
    cross_entropy = -(p_top * log_q_top).sum(-1) - p_other * log_q_other
    entropy = -(torch.xlogy(p_top, p_top)).sum(-1) - torch.xlogy(p_other, p_other)
    return cross_entropy.mean(), (cross_entropy - entropy).mean().detach()


def bucket_acceptance(sub_logits: torch.Tensor, sub_ids: torch.Tensor, top_probs: torch.Tensor,
                      rest: torch.Tensor) -> torch.Tensor:
    """sum_b min(p_b, q_b) over the buckets of bucket_kl_loss: the acceptance, differentiable in sub_logits.

    Same shapes as bucket_kl_loss; returns [n]. Merging tokens can only raise sum min(p, q), so this is an
    upper bound of the full acceptance that equals it when the top-k hold all of p's mass; 1 - it is the
    total variation that speculative sampling pays for (docs/design.md section 2), the loss of --tv-weight.
    """
    q = torch.softmax(sub_logits.float(), dim=-1)
    q = torch.cat([q, q.new_zeros(q.shape[0], 1)], dim=-1)  # [n, K+1]: index K (not scorable) has q = 0
    p_top, p_other = target_buckets(sub_ids, top_probs, rest, sub_logits.shape[-1])
    q_top = q.gather(-1, sub_ids)
    q_other = (1.0 - q_top.sum(-1)).clamp(min=0.0)
    return torch.minimum(p_top, q_top).sum(-1) + torch.minimum(p_other, q_other)


def distill_loss(sub_logits: torch.Tensor, sub_ids: torch.Tensor, top_probs: torch.Tensor, rest: torch.Tensor,
                 tv_weight: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(1 - tv_weight) x the bucket cross-entropy + tv_weight x the bucket total variation (1 - acceptance).

    Same shapes as bucket_kl_loss. Returns (the loss, mean KL, mean acceptance), the last two detached
    for reporting. The cross-entropy differs from the KL by p's entropy, a constant of the data.
    """
    cross_entropy, kl = bucket_kl_loss(sub_logits, sub_ids, top_probs, rest)
    acceptance = bucket_acceptance(sub_logits, sub_ids, top_probs, rest).mean()
    loss = (1.0 - tv_weight) * cross_entropy + tv_weight * (1.0 - acceptance)
    return loss, kl, acceptance.detach()
