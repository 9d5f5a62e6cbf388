"""Block and token verification over vocabulary-sharded target logits, without gathering them.

Same terms and same result as distributed_spec.verify (rules.py): every rank passes its slice of the
target logits and of the draft probabilities, the same draft ids and the same uniforms, and gets the
same VerifyOutput as the unsharded reference would give for the same uniforms (tau identical up to
float rounding of the statistics, Y identical away from a CDF boundary). Per call, three small
collectives, O(B g) numbers each:
  1. all-gather: per position, this shard's max and sum of exp(logit - max) of the warped logits (the
     softmax statistics, merged as in online softmax); the warped logit and q of each draft token it
     owns (-inf and 0 elsewhere); its draft mass (NaN check).  ->  p_i(X_i), q_i(X_i), r_i everywhere.
  2. all-gather: this shard's residual masses sum_x max(r_t p_t - q_t, 0) (t = 0..g-1, r_0 = 1) and
     target masses sum_x p_t (t = 0..g).  ->  Z_i (summed in rank order, so identical on every rank),
     h_i, tau, and the mass of every shard under the distribution of Y.
  3. all-reduce MAX: Y, sampled by the one shard that u * total falls in (inverse CDF inside it).
Top-k adds one all-gather of each shard's k largest logits; top-p needs a sort over V and falls back
to `verify_gathered` (gather the logits, then the reference).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from distributed_spec.verify.rules import (
    _CHUNK_ELEMENTS,
    VERIFY_METHODS,
    VerifyOutput,
    VerifyUniforms,
    _accepted_mask,
    _prefix_length,
    block_acceptance_probs,
    block_accepted_counts,
    verify,
)
from distributed_spec.verify.sampling import SamplingParams, logits_to_probs
from distributed_spec.verify_parallel.shards import VocabShard, gather_vocab


def verify_gathered(
    method: str,
    target_logits: torch.Tensor,
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    num_draft_tokens: torch.Tensor | None,
    uniforms: VerifyUniforms | None,
    params: SamplingParams,
    shard: VocabShard,
    draft_probs_sharded: bool = True,
) -> VerifyOutput:
    """Gather-then-verify: all-gather the logits (and the draft probabilities when sharded), then the
    reference on every rank. The baseline of the benchmark, and the top-p fallback.

    Args:
        target_logits: [B, g+1, V/tp] this rank's slice.
        draft_probs: [B, g, V/tp] this rank's slice, or [B, g, V] when draft_probs_sharded is False.
        Others as `verify_vocab_parallel`.
    """
    full_logits = gather_vocab(target_logits, shard)  # [B, g+1, V]
    if draft_probs is not None and draft_probs_sharded:
        draft_probs = gather_vocab(draft_probs, shard)  # [B, g, V]
    target_probs = full_logits if method == "greedy" else logits_to_probs(full_logits, params)
    return verify(method, draft_ids, draft_probs, target_probs, num_draft_tokens, uniforms)


def verify_vocab_parallel(
    method: str,
    target_logits: torch.Tensor,
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    num_draft_tokens: torch.Tensor | None,
    uniforms: VerifyUniforms | None,
    params: SamplingParams,
    shard: VocabShard,
) -> VerifyOutput:
    """Verification on this rank's vocabulary slice; every rank of the group must call it.

    Args:
        method: "block", "token" or "greedy" (verifier.method).
        target_logits: [B, g+1, V/tp] raw logits of ids [shard.vocab_start, shard.vocab_end).
        draft_ids: X [B, g] long, global ids (the same on every rank).
        draft_probs: q [B, g, V/tp] the draft probabilities of this rank's ids only.
        num_draft_tokens: n [B] long in [0, g], or None for n = g.
        uniforms: eta [B, g], u [B] float64, the same on every rank.
        params: the sampling settings both models were warped with.
    Returns:
        VerifyOutput, identical on every rank.
    """
    if method not in VERIFY_METHODS:
        raise ValueError(f"verifier.method must be one of {VERIFY_METHODS}, got {method!r}")
    batch_size, g = draft_ids.shape
    if target_logits.shape != (batch_size, g + 1, shard.num_ids):
        raise ValueError(
            f"target_logits must be this rank's [B, g+1, V/tp] = [{batch_size}, {g + 1}, {shard.num_ids}], "
            f"got {tuple(target_logits.shape)}"
        )
    if num_draft_tokens is None:
        num_draft_tokens = torch.full((batch_size,), g, dtype=torch.long, device=draft_ids.device)
    if method == "greedy" or params.is_greedy:
        return _verify_greedy_sharded(target_logits, draft_ids, num_draft_tokens, shard)
    if draft_probs is None or uniforms is None:
        raise ValueError(f"verifier.method={method!r} needs draft_probs and uniforms")
    if draft_probs.shape != (batch_size, g, shard.num_ids):
        raise ValueError(
            f"draft_probs must be this rank's [B, g, V/tp] = [{batch_size}, {g}, {shard.num_ids}], "
            f"got {tuple(draft_probs.shape)}"
        )
    if params.top_p < 1.0:
        return verify_gathered(
            method, target_logits, draft_ids, draft_probs, num_draft_tokens, uniforms, params, shard
        )

    logits = _warp_sharded(target_logits, params, shard)  # [B, g+1, V/tp] float32, -inf where masked
    owned = (draft_ids >= shard.vocab_start) & (draft_ids < shard.vocab_end)  # [B, g]
    local_ids = (draft_ids - shard.vocab_start).clamp(0, max(shard.num_ids - 1, 0)).unsqueeze(-1)
    has_ids = shard.num_ids > 0

    # 1. Local softmax statistics (max m_k and sum of exp(logit - m_k)), the on-path logit and q (where
    # this shard owns the draft token), the draft mass: one all-gather, combined alike on every rank.
    local_max = logits.amax(dim=-1) if has_ids else logits.new_full((batch_size, g + 1), float("-inf"))
    safe_max = torch.where(local_max == float("-inf"), 0.0, local_max)  # [B, g+1]
    if has_ids:
        on_path_logits = logits[:, :g].gather(-1, local_ids).squeeze(-1)  # [B, g], before exp_
    exps = logits.sub_(safe_max.unsqueeze(-1)).exp_()  # [B, g+1, V/tp]: exp(logit - m_k), in place
    stats = torch.zeros(batch_size, 5 * g + 2, dtype=torch.float32, device=logits.device)
    stats[:, : g + 1] = local_max
    stats[:, g + 1 : 2 * g + 2] = exps.sum(dim=-1)
    stats[:, 2 * g + 2 : 3 * g + 2] = float("-inf")
    if has_ids:
        stats[:, 2 * g + 2 : 3 * g + 2] = torch.where(owned, on_path_logits, float("-inf"))
        draft_on_path = draft_probs.gather(-1, local_ids).squeeze(-1).float()
        stats[:, 3 * g + 2 : 4 * g + 2] = torch.where(owned, draft_on_path, 0.0)
        stats[:, 4 * g + 2 :] = draft_probs.sum(dim=-1, dtype=torch.float32)
    gathered = shard.all_gather(stats)  # [tp, B, 5g+2]
    shard_max, shard_sums = gathered[:, :, : g + 1], gathered[:, :, g + 1 : 2 * g + 2]
    row_max = shard_max.amax(dim=0)  # [B, g+1]
    row_max = torch.where(row_max == float("-inf"), 0.0, row_max)
    rescale = torch.exp(shard_max - row_max)  # [tp, B, g+1]; 0 for an all -inf shard, NaN stays NaN
    totals = (shard_sums * rescale).sum(dim=0)  # [B, g+1]: the softmax denominators
    _raise_if_not_finite(totals, gathered[:, :, 4 * g + 2 :].sum(dim=0), num_draft_tokens)
    on_path_logits = gathered[:, :, 2 * g + 2 : 3 * g + 2].amax(dim=0)  # [B, g]
    target_on_path = (torch.exp(on_path_logits - row_max[:, :g]) / totals[:, :g]).double()
    draft_on_path = gathered[:, :, 3 * g + 2 : 4 * g + 2].sum(dim=0).double()  # [B, g]
    # p on this shard = exps * target_scales: exp(m_k - M) / total.
    target_scales = rescale[shard.rank] / totals  # [B, g+1]

    # 2. This shard's residual and target masses, gathered from every shard. p is never
    # materialised: its scale goes into the residual, max(r_t target_scale_t exps - q, 0).
    if method == "block" and g > 0:
        r = block_acceptance_probs(target_on_path, draft_on_path)  # [B, g]
        scales = torch.cat([r.new_ones(batch_size, 1), r[:, :-1]], dim=1)  # r_0..r_{g-1}
    else:
        r = None
        scales = torch.ones(batch_size, g, dtype=torch.float64, device=logits.device)
    residual_scales = (scales * target_scales[:, :g].double()).float()  # [B, g]
    masses = torch.empty(batch_size, 2 * g + 1, dtype=torch.float64, device=logits.device)
    masses[:, :g] = _residual_masses(exps[:, :g], draft_probs, residual_scales)
    masses[:, g:] = shard_sums[shard.rank].double() * target_scales.double()
    shard_masses = shard.all_gather(masses)  # [tp, B, 2g+1]
    residual_masses = shard_masses[:, :, :g].sum(dim=0)  # [B, g]: Z_0..Z_{g-1}

    if method == "block":
        accepted_counts = block_accepted_counts(r, residual_masses[:, 1:], num_draft_tokens, uniforms.eta)
    else:
        passes = uniforms.eta * draft_on_path < target_on_path  # eta < p/q without dividing
        passes &= torch.arange(g, device=passes.device).unsqueeze(0) < num_draft_tokens.unsqueeze(1)
        accepted_counts = _prefix_length(passes)

    # 3. Y: the shard that u * total falls in samples inside its slice; the others give -1.
    next_tokens = _sample_sharded(
        exps,
        target_scales,
        draft_probs,
        residual_scales,
        shard_masses,
        accepted_counts,
        num_draft_tokens,
        uniforms.u,
        shard,
    )
    return VerifyOutput(accepted_counts, next_tokens, _accepted_mask(accepted_counts, g))


def _warp_sharded(target_logits: torch.Tensor, params: SamplingParams, shard: VocabShard) -> torch.Tensor:
    """Temperature and a global top-k on a shard, as logits_to_probs warps the full logits.

    Returns [B, g+1, V/tp] float32 (a new tensor), -inf where top-k removed an id.
    """
    logits = target_logits.float() / params.temperature
    if 0 < params.top_k < shard.vocab_size:
        local_k = min(params.top_k, logits.shape[-1])
        local_top = logits.topk(local_k, dim=-1).values if local_k > 0 else logits[..., :0]
        if local_k < params.top_k:  # a short shard pads with -inf so every rank gathers one shape
            local_top = torch.nn.functional.pad(local_top, (0, params.top_k - local_k), value=float("-inf"))
        candidates = shard.all_gather(local_top)  # [tp, B, g+1, k]
        kth_largest = candidates.movedim(0, -2).flatten(-2).topk(params.top_k, dim=-1).values[..., -1:]
        logits.masked_fill_(logits < kth_largest, float("-inf"))
    return logits


def _residual_masses(exps: torch.Tensor, draft_probs: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """sum_x max(scale * exps - q, 0) over this shard, in chunks of V that keep temporaries in cache.

    Args:
        exps: [B, k, V/tp] float32; draft_probs: [B, k, V/tp]; scales: [B, k] float32.
    Returns:
        [B, k] float64.
    """
    batch_size, num_positions, num_ids = exps.shape
    masses = torch.zeros(batch_size, num_positions, dtype=torch.float64, device=exps.device)
    chunk = max(1024, _CHUNK_ELEMENTS // max(1, batch_size * num_positions))
    for start in range(0, num_ids, chunk):
        residual = exps[..., start : start + chunk] * scales.unsqueeze(-1)
        residual.sub_(draft_probs[..., start : start + chunk]).clamp_(min=0.0)
        masses += residual.sum(dim=-1, dtype=torch.float64)
    return masses


def _sample_sharded(
    exps: torch.Tensor,
    target_scales: torch.Tensor,
    draft_probs: torch.Tensor,
    residual_scales: torch.Tensor,
    shard_masses: torch.Tensor,
    accepted_counts: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    u: torch.Tensor,
    shard: VocabShard,
) -> torch.Tensor:
    """Inverse-CDF sampling of Y over the shards: the global CDF, walked shard by shard.

    Args:
        exps: exp(logit - local max) [B, g+1, V/tp] of this shard; target_scales: p / exps [B, g+1].
        draft_probs: q [B, g, V/tp] of this shard; residual_scales: r_t p / exps [B, g] float32.
        shard_masses: [tp, B, 2g+1] float64: residual masses (g), then target masses (g+1).
        accepted_counts: tau [B]; num_draft_tokens: n [B]; u: [B].
    Returns:
        next_tokens [B] long, identical on every rank.
    """
    batch_size, g = accepted_counts.shape[0], draft_probs.shape[1]
    rows = torch.arange(batch_size, device=exps.device)
    tau_residual = accepted_counts.clamp(max=max(g - 1, 0))
    if g > 0:
        residual_per_shard = shard_masses[:, rows, tau_residual]  # [tp, B]
    else:
        residual_per_shard = shard_masses.new_zeros(shard.world_size, batch_size)
    target_per_shard = shard_masses[:, rows, g + accepted_counts]  # [tp, B]
    use_target = (accepted_counts >= num_draft_tokens) | ~(residual_per_shard.sum(dim=0) > 0)  # [B]
    per_shard = torch.where(use_target.unsqueeze(0), target_per_shard, residual_per_shard)
    cumulative = per_shard.cumsum(dim=0)
    total = cumulative[-1]
    threshold = torch.minimum(u.double() * total, torch.nextafter(total, torch.zeros_like(total)))
    below = cumulative <= threshold.unsqueeze(0)
    chosen = below.sum(dim=0).clamp(max=shard.world_size - 1)  # [B]
    before = torch.where(below, cumulative, 0.0).amax(dim=0)

    next_tokens = torch.full((batch_size,), -1, dtype=torch.long, device=exps.device)
    if shard.num_ids > 0:
        row_exps = exps[rows, accepted_counts]  # [B, V/tp]
        weights = row_exps * target_scales[rows, accepted_counts].unsqueeze(1)  # p
        if g > 0:
            residual = row_exps * residual_scales[rows, tau_residual].unsqueeze(1)
            residual.sub_(draft_probs[rows, tau_residual]).clamp_(min=0.0)
            weights = torch.where(use_target.unsqueeze(1), weights, residual)
        cdf = before.unsqueeze(1) + weights.double().cumsum(dim=-1)
        local = torch.searchsorted(cdf, threshold.unsqueeze(1), right=True).squeeze(1)
        # Rounding between the gathered mass and this cumsum can put the threshold past the end:
        # take the last id of positive weight.
        ids = torch.arange(weights.shape[1], device=weights.device)
        last_positive = torch.where(weights > 0, ids, -1).amax(dim=1).clamp(min=0)
        local = torch.where(local >= weights.shape[1], last_positive, local)
        next_tokens = torch.where(chosen == shard.rank, local + shard.vocab_start, next_tokens)
    return shard.all_reduce(next_tokens, dist.ReduceOp.MAX)


def _verify_greedy_sharded(
    target_logits: torch.Tensor, draft_ids: torch.Tensor, num_draft_tokens: torch.Tensor, shard: VocabShard
) -> VerifyOutput:
    """Greedy rule over shards: the global argmax (lowest id among ties, as torch.argmax) per position."""
    batch_size, g = draft_ids.shape
    logits = target_logits.float()
    if shard.num_ids > 0:
        local_max, local_argmax = logits.max(dim=-1)
    else:
        local_max = logits.new_full((batch_size, g + 1), float("-inf"))
        local_argmax = torch.zeros(batch_size, g + 1, dtype=torch.long, device=logits.device)
    global_max = shard.all_reduce(local_max.clone(), dist.ReduceOp.MAX)
    candidates = torch.where(local_max == global_max, local_argmax + shard.vocab_start, shard.vocab_size)
    target_argmax = shard.all_reduce(candidates, dist.ReduceOp.MIN)  # [B, g+1]
    positions = torch.arange(g, device=draft_ids.device)
    passes = (draft_ids == target_argmax[:, :g]) & (
        positions.unsqueeze(0) < num_draft_tokens.unsqueeze(1)
    )
    accepted_counts = _prefix_length(passes)
    next_tokens = target_argmax.gather(1, accepted_counts.unsqueeze(1)).squeeze(1)
    return VerifyOutput(accepted_counts, next_tokens, _accepted_mask(accepted_counts, g))


def _raise_if_not_finite(
    totals: torch.Tensor, draft_sums: torch.Tensor, num_draft_tokens: torch.Tensor
) -> None:
    """totals [B, g+1] softmax sums, draft_sums [B, g]: from gathered values, so every rank agrees."""
    positions = torch.arange(totals.shape[1], device=totals.device)
    used = positions.unsqueeze(0) <= num_draft_tokens.unsqueeze(1)
    ok = totals.isfinite().all() & draft_sums.isfinite().all() & ((totals > 0) | ~used).all()
    # Host sync: every rank raises together (same reduced values) instead of sampling from NaN.
    if not bool(ok):
        raise ValueError(
            "target_logits or draft_probs hold NaN or inf; check the model logits and sampling settings"
        )
