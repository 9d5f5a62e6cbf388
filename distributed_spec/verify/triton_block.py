"""Fused block and token verification straight from target logits (Triton), beside the torch reference.

Same terms and same result as rules.py (draft, target, accepted, correction, bonus; p = warped target
probabilities, q = draft probabilities): given the same uniforms, `verify_fused` returns the same
tau, and the same correction or bonus token up to float rounding at a CDF boundary, as
`verify(method, draft_ids, draft_probs, logits_to_probs(target_logits, params), ...)`.

Three launches, two passes over the vocabulary V (split into NB blocks of BLOCK_V ids):
  1. `_softmax_block_stats_kernel`, grid (B*(g+1), NB): per block, the max and the sum of exp of the
     warped target logits (temperature and a top-k threshold applied in the kernel).
  2. `_residual_block_masses_kernel`, grid (B*g, NB): reduces the block statistics to the softmax
     max m and sum s, recomputes r_t along the row's draft (one load per draft token), and writes
     the residual mass of each vocabulary block, W[b, t, blk] = sum_x max(r_t p_t(x) - q_t(x), 0)
     (0-based t; r_0 = 1). Z_i = sum_blk W[b, i, blk]. Token verification only needs t = tau.
  3. `_choose_and_sample_kernel`, grid (B,): h_i, tau from eta (largest i with eta_i < h_i; or the
     leading run of eta_i q < p for token verification), then inverse-CDF sampling with u: the
     vocabulary block by cumulative block mass, then the id inside that one block (a re-read of
     BLOCK_V ids). The bonus (tau = n) and the zero-residual fallback use p's block masses, which
     the step-1 statistics already hold.

Warping: temperature and top-k run in the kernels (the k-th largest logit per position comes from
torch.topk, the kernel masks logits below it); top-p falls back to the torch warp before the kernel
(the kernel then gets log(probs) at temperature 1). Temperature 0 and method "greedy" run the torch
greedy rule on the logits (argmax only; one pass already).

Dispatch: `fused_available(device)` is True on CUDA with Triton importable; elsewhere use the torch
path (`logits_to_probs` + `verify`). On the CPU the kernels run only under TRITON_INTERPRET=1 (tests).
"""

from __future__ import annotations

import torch

from distributed_spec.verify.rules import (
    VERIFY_METHODS,
    VerifyOutput,
    VerifyUniforms,
    _accepted_mask,
    _check_inputs,
    verify_greedy,
)
from distributed_spec.verify.sampling import SamplingParams, logits_to_probs

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch path needs no Triton; fused_available() says False
    triton = None

# Vocabulary ids per program on a GPU: NB = ceil(128256 / 4096) = 32 blocks per position.
DEFAULT_BLOCK_V = 4096
_METHOD_IDS = {"block": 0, "token": 1}


def fused_available(device: torch.device | str) -> bool:
    """Whether `verify_fused` should serve tensors on `device` (CUDA with Triton importable)."""
    return triton is not None and torch.device(device).type == "cuda"


def _topk_thresholds(target_logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """[B, g+1, V] -> the k-th largest logit per position [B, g+1] float32 (-inf when top-k is off).

    The kernel keeps logits >= the threshold, as logits_to_probs keeps logits not below its k-th
    largest (ties kept). Raw logits are compared: dividing by a temperature > 0 keeps their order.
    """
    vocab_size = target_logits.shape[-1]
    if 0 < top_k < vocab_size:
        return torch.topk(target_logits, top_k, dim=-1).values[..., -1].float().contiguous()
    return target_logits.new_full(target_logits.shape[:-1], float("-inf"), dtype=torch.float32)


def verify_fused(
    method: str,
    target_logits: torch.Tensor,
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    num_draft_tokens: torch.Tensor | None,
    uniforms: VerifyUniforms | None,
    params: SamplingParams,
    block_size: int = DEFAULT_BLOCK_V,
    check_inputs: bool = True,
) -> VerifyOutput:
    """Block or token verification from target logits in three Triton launches.

    Args:
        method: "block", "token" or "greedy" (verifier.method).
        target_logits: [B, g+1, V] any float dtype (raw, before warping).
        draft_ids: X [B, g] long.
        draft_probs: q [B, g, V] float32/bf16/fp16 (already warped by the draft).
        num_draft_tokens: n [B] long in [0, g], or None for n = g on every row.
        uniforms: eta [B, g] float64, u [B] float64.
        params: the sampling settings both models were warped with.
        block_size: vocabulary ids per program (a power of two).
        check_inputs: validate as the reference does; costs host syncs (off on a hot path that
            already validated its inputs).
    Returns:
        VerifyOutput(accepted_counts [B], next_tokens [B], accepted_mask [B, g]).
    """
    if method not in VERIFY_METHODS:
        raise ValueError(f"verifier.method must be one of {VERIFY_METHODS}, got {method!r}")
    batch_size, g = draft_ids.shape
    if num_draft_tokens is None:
        num_draft_tokens = torch.full((batch_size,), g, dtype=torch.long, device=draft_ids.device)
    if method == "greedy" or params.is_greedy:
        return verify_greedy(draft_ids, None, target_logits, num_draft_tokens)
    if draft_probs is None or uniforms is None:
        raise ValueError(f"verifier.method={method!r} needs draft_probs and uniforms")
    if triton is None:
        raise RuntimeError("verify_fused needs triton (pip install 'triton>=3.0'); use the torch verifier")
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two >= 16, got {block_size}")
    if check_inputs:
        _check_inputs(draft_ids, draft_probs, target_logits, num_draft_tokens)
    temperature = params.temperature
    if params.top_p < 1.0:
        # Top-p needs a sort over V: warp in torch, and let the kernel renormalise log(probs).
        target_logits = logits_to_probs(target_logits, params).log()
        temperature, thresholds = 1.0, _topk_thresholds(target_logits, 0)
    else:
        thresholds = _topk_thresholds(target_logits, params.top_k)

    device = target_logits.device
    vocab_size = target_logits.shape[-1]
    num_blocks = triton.cdiv(vocab_size, block_size)
    target_logits = target_logits.contiguous()
    draft_probs = draft_probs.contiguous()
    draft_ids = draft_ids.contiguous()
    num_draft_tokens = num_draft_tokens.to(torch.long).contiguous()
    eta = uniforms.eta.to(device=device, dtype=torch.float64).contiguous()
    u = uniforms.u.to(device=device, dtype=torch.float64).contiguous()
    if g == 0:
        # Valid pointers for the kernels' (fully masked) draft loads.
        draft_ids = torch.zeros(batch_size, 1, dtype=torch.long, device=device)
        draft_probs = torch.zeros(batch_size, 1, vocab_size, dtype=torch.float32, device=device)
        eta = torch.zeros(batch_size, 1, dtype=torch.float64, device=device)

    # [B, g+1, NB]: per-block max and sum of exp(logit/T - block max) of the warped target.
    block_max = torch.empty(batch_size, g + 1, num_blocks, dtype=torch.float32, device=device)
    block_sum = torch.empty_like(block_max)
    # [B, max(g, 1), NB]: residual mass of each vocabulary block, per candidate tau.
    residual_masses = torch.zeros(batch_size, max(g, 1), num_blocks, dtype=torch.float32, device=device)
    accepted_counts = torch.empty(batch_size, dtype=torch.long, device=device)
    next_tokens = torch.empty(batch_size, dtype=torch.long, device=device)
    nb_pad = triton.next_power_of_2(num_blocks)
    common = dict(
        V=vocab_size,
        NB=num_blocks,
        GAMMA=g,
        BLOCK_V=block_size,
        NB_PAD=nb_pad,
        METHOD=_METHOD_IDS[method],
    )

    _softmax_block_stats_kernel[(batch_size * (g + 1), num_blocks)](
        target_logits,
        thresholds,
        num_draft_tokens,
        block_max,
        block_sum,
        temperature,
        V=vocab_size,
        NB=num_blocks,
        GAMMA=g,
        BLOCK_V=block_size,
    )
    if g > 0:
        _residual_block_masses_kernel[(batch_size * g, num_blocks)](
            target_logits,
            thresholds,
            draft_ids,
            draft_probs,
            num_draft_tokens,
            eta,
            block_max,
            block_sum,
            residual_masses,
            temperature,
            **common,
        )
    if check_inputs:
        _raise_if_not_finite(block_sum, residual_masses, num_draft_tokens)
    _choose_and_sample_kernel[(batch_size,)](
        target_logits,
        thresholds,
        draft_ids,
        draft_probs,
        num_draft_tokens,
        eta,
        u,
        block_max,
        block_sum,
        residual_masses,
        accepted_counts,
        next_tokens,
        temperature,
        **common,
    )
    return VerifyOutput(
        accepted_counts, next_tokens, _accepted_mask(accepted_counts, draft_ids.shape[1])[:, :g]
    )


def _raise_if_not_finite(
    block_sum: torch.Tensor, residual_masses: torch.Tensor, num_draft_tokens: torch.Tensor
) -> None:
    """block_sum [B, g+1, NB], residual_masses [B, g, NB], num_draft_tokens [B]."""
    positions = torch.arange(block_sum.shape[1], device=block_sum.device)
    used = positions.unsqueeze(0) <= num_draft_tokens.unsqueeze(1)  # [B, g+1]
    has_mass = block_sum.amax(dim=-1) > 0
    ok = block_sum.isfinite().all() & residual_masses.isfinite().all() & (has_mass | ~used).all()
    # Host sync: a NaN, inf or all -inf row must raise instead of producing a silent bad token.
    if not bool(ok):
        raise ValueError(
            "target_logits or draft_probs hold NaN or inf; check the model logits and sampling settings"
        )


# ----------------------------------------------------------------------------------------------
# Triton kernels (defined only when Triton imports).
# ----------------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _warped_logits(logits_ptr, offs, mask, threshold, temperature):
        """Warped logits x/T where kept, -inf elsewhere; NaN passes through so checks can see it."""
        x = tl.load(logits_ptr + offs, mask=mask, other=float("-inf")).to(tl.float32)
        return tl.where(mask & ~(x < threshold), x / temperature, float("-inf"))

    @triton.jit
    def _position_stats(block_max_ptr, block_sum_ptr, base, NB: tl.constexpr, NB_PAD: tl.constexpr):
        """Softmax max m and sum s of one (row, position) from its NB block statistics."""
        offs = tl.arange(0, NB_PAD)
        mask = offs < NB
        bmax = tl.load(block_max_ptr + base + offs, mask=mask, other=float("-inf"))
        bsum = tl.load(block_sum_ptr + base + offs, mask=mask, other=0.0)
        m = tl.max(bmax, axis=0)
        m = tl.where(m == float("-inf"), 0.0, m)
        s = tl.sum(tl.where(bsum > 0, bsum * tl.exp(bmax - m), 0.0), axis=0)
        return m, s

    @triton.jit
    def _on_path_probs(
        logits_ptr,
        thresholds_ptr,
        draft_ids_ptr,
        draft_probs_ptr,
        block_max_ptr,
        block_sum_ptr,
        row,
        k,
        temperature,
        V: tl.constexpr,
        NB: tl.constexpr,
        GAMMA: tl.constexpr,
        NB_PAD: tl.constexpr,
    ):
        """p_k(X_k), q_k(X_k) of draft position k (0-based) of a row, as float64."""
        # Clamped: padding positions (k >= n) may hold any id, and their result is never used.
        x_id = tl.minimum(tl.maximum(tl.load(draft_ids_ptr + row * GAMMA + k), 0), V - 1)
        m, s = _position_stats(block_max_ptr, block_sum_ptr, (row * (GAMMA + 1) + k) * NB, NB, NB_PAD)
        threshold = tl.load(thresholds_ptr + row * (GAMMA + 1) + k)
        logit = tl.load(logits_ptr + (row * (GAMMA + 1) + k) * V + x_id).to(tl.float32)
        p = tl.where(logit < threshold, 0.0, tl.exp(logit / temperature - m) / s)
        q = tl.load(draft_probs_ptr + (row * GAMMA + k) * V + x_id).to(tl.float32)
        return p.to(tl.float64), q.to(tl.float64)

    @triton.jit
    def _next_acceptance(r, p, q):
        """r_k = min(1, r_{k-1} p / q) (float64): p = 0 rejects; q = 0 < p gives 1 unless r = 0."""
        ratio_r = tl.minimum(r * p / tl.where(q > 0, q, 1.0), 1.0)
        return tl.where(p > 0, tl.where(q > 0, ratio_r, tl.where(r > 0, 1.0, 0.0)), 0.0)

    @triton.jit
    def _token_tau(
        logits_ptr,
        thresholds_ptr,
        draft_ids_ptr,
        draft_probs_ptr,
        eta_ptr,
        block_max_ptr,
        block_sum_ptr,
        row,
        n,
        temperature,
        V: tl.constexpr,
        NB: tl.constexpr,
        GAMMA: tl.constexpr,
        NB_PAD: tl.constexpr,
    ):
        """Token verification's tau: the leading run of eta_k q_k(X_k) < p_k(X_k) among k < n."""
        tau = tl.full((), 0, tl.int32)
        alive = n > 0
        for k in range(GAMMA):
            p, q = _on_path_probs(
                logits_ptr,
                thresholds_ptr,
                draft_ids_ptr,
                draft_probs_ptr,
                block_max_ptr,
                block_sum_ptr,
                row,
                k,
                temperature,
                V,
                NB,
                GAMMA,
                NB_PAD,
            )
            eta = tl.load(eta_ptr + row * GAMMA + k)
            alive = alive & (k < n) & (eta * q < p)
            tau += alive.to(tl.int32)
        return tau

    @triton.jit
    def _softmax_block_stats_kernel(
        logits_ptr,  # [B, g+1, V]
        thresholds_ptr,  # [B, g+1] float32
        num_draft_tokens_ptr,  # [B]
        block_max_ptr,  # [B, g+1, NB] float32 (out)
        block_sum_ptr,  # [B, g+1, NB] float32 (out)
        temperature,
        V: tl.constexpr,
        NB: tl.constexpr,
        GAMMA: tl.constexpr,
        BLOCK_V: tl.constexpr,
    ):
        # int64: row * (g+1) * V passes 2^31 at B ~ 1900 rows of V = 128256.
        row_pos = tl.program_id(0).to(tl.int64)  # row * (g+1) + position
        blk = tl.program_id(1)
        row = row_pos // (GAMMA + 1)
        pos = row_pos % (GAMMA + 1)
        n = tl.load(num_draft_tokens_ptr + row)
        offs = blk * BLOCK_V + tl.arange(0, BLOCK_V)
        # Positions beyond n + 1 are padding: masked loads read nothing. (A scalar condition is
        # folded into the bound: the interpreter rejects scalar & vector masks.)
        mask = offs < tl.where(pos <= n, V, 0)
        threshold = tl.load(thresholds_ptr + row_pos)
        x = _warped_logits(logits_ptr + row_pos * V, offs, mask, threshold, temperature)
        bmax = tl.max(x, axis=0)
        safe = tl.where(bmax == float("-inf"), 0.0, bmax)
        bsum = tl.sum(tl.where(x == float("-inf"), 0.0, tl.exp(x - safe)), axis=0)
        tl.store(block_max_ptr + row_pos * NB + blk, bmax)
        tl.store(block_sum_ptr + row_pos * NB + blk, bsum)

    @triton.jit
    def _residual_block_masses_kernel(
        logits_ptr,  # [B, g+1, V]
        thresholds_ptr,  # [B, g+1] float32
        draft_ids_ptr,  # [B, g] long
        draft_probs_ptr,  # [B, g, V]
        num_draft_tokens_ptr,  # [B]
        eta_ptr,  # [B, g] float64
        block_max_ptr,  # [B, g+1, NB] float32
        block_sum_ptr,  # [B, g+1, NB] float32
        residual_masses_ptr,  # [B, g, NB] float32 (out)
        temperature,
        V: tl.constexpr,
        NB: tl.constexpr,
        GAMMA: tl.constexpr,
        BLOCK_V: tl.constexpr,
        NB_PAD: tl.constexpr,
        METHOD: tl.constexpr,
    ):
        row_t = tl.program_id(0).to(
            tl.int64
        )  # row * g + t: the residual of tau = t uses p_t, q_t (0-based) and r_t
        blk = tl.program_id(1)
        row = row_t // GAMMA
        t = row_t % GAMMA
        n = tl.load(num_draft_tokens_ptr + row)
        if METHOD == 0:
            # r_t = prod over k < t of the running min(1, r p/q); r_0 = 1.
            scale = tl.full((), 1.0, tl.float64)
            for k in range(t):
                p, q = _on_path_probs(
                    logits_ptr,
                    thresholds_ptr,
                    draft_ids_ptr,
                    draft_probs_ptr,
                    block_max_ptr,
                    block_sum_ptr,
                    row,
                    k,
                    temperature,
                    V,
                    NB,
                    GAMMA,
                    NB_PAD,
                )
                scale = _next_acceptance(scale, p, q)
            needed = t < n
        else:
            scale = tl.full((), 1.0, tl.float64)
            tau = _token_tau(
                logits_ptr,
                thresholds_ptr,
                draft_ids_ptr,
                draft_probs_ptr,
                eta_ptr,
                block_max_ptr,
                block_sum_ptr,
                row,
                n,
                temperature,
                V,
                NB,
                GAMMA,
                NB_PAD,
            )
            needed = (t < n) & (t == tau)
        m, s = _position_stats(block_max_ptr, block_sum_ptr, (row * (GAMMA + 1) + t) * NB, NB, NB_PAD)
        offs = blk * BLOCK_V + tl.arange(0, BLOCK_V)
        mask = offs < tl.where(needed, V, 0)
        threshold = tl.load(thresholds_ptr + row * (GAMMA + 1) + t)
        x = _warped_logits(logits_ptr + (row * (GAMMA + 1) + t) * V, offs, mask, threshold, temperature)
        p = tl.where(x == float("-inf"), 0.0, tl.exp(x - m) / s)
        q = tl.load(draft_probs_ptr + row_t * V + offs, mask=mask, other=0.0).to(tl.float32)
        w = scale.to(tl.float32) * p - q
        # `where(w < 0, 0, w)` rather than max: a NaN stays visible to the finiteness check.
        w = tl.where(w < 0, 0.0, w)
        tl.store(residual_masses_ptr + row_t * NB + blk, tl.sum(w, axis=0))

    @triton.jit
    def _choose_and_sample_kernel(
        logits_ptr,  # [B, g+1, V]
        thresholds_ptr,  # [B, g+1] float32
        draft_ids_ptr,  # [B, g] long
        draft_probs_ptr,  # [B, g, V]
        num_draft_tokens_ptr,  # [B]
        eta_ptr,  # [B, g] float64
        u_ptr,  # [B] float64
        block_max_ptr,  # [B, g+1, NB] float32
        block_sum_ptr,  # [B, g+1, NB] float32
        residual_masses_ptr,  # [B, g, NB] float32
        accepted_counts_ptr,  # [B] long (out)
        next_tokens_ptr,  # [B] long (out)
        temperature,
        V: tl.constexpr,
        NB: tl.constexpr,
        GAMMA: tl.constexpr,
        BLOCK_V: tl.constexpr,
        NB_PAD: tl.constexpr,
        METHOD: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        n = tl.load(num_draft_tokens_ptr + row)
        blocks = tl.arange(0, NB_PAD)
        in_vocab_blocks = blocks < NB
        # tau and the residual scale r_tau (r_0 = 1).
        if METHOD == 0:
            tau = tl.full((), 0, tl.int32)
            r = tl.full((), 1.0, tl.float64)
            scale = tl.full((), 1.0, tl.float64)
            for k in range(GAMMA):
                i = k + 1  # 1-based position of the paper
                p, q = _on_path_probs(
                    logits_ptr,
                    thresholds_ptr,
                    draft_ids_ptr,
                    draft_probs_ptr,
                    block_max_ptr,
                    block_sum_ptr,
                    row,
                    k,
                    temperature,
                    V,
                    NB,
                    GAMMA,
                    NB_PAD,
                )
                r = _next_acceptance(r, p, q)
                # Z_i is the residual at 0-based position i (p_{i+1} of the paper) with scale r_i.
                z_masses = tl.load(
                    residual_masses_ptr + (row * GAMMA + i) * NB + blocks,
                    mask=blocks < tl.where(i < n, NB, 0),
                    other=0.0,
                )
                z = tl.sum(z_masses.to(tl.float64), axis=0)
                denominator = z + 1.0 - r
                h = tl.where(denominator > 0, z / tl.where(denominator > 0, denominator, 1.0), 1.0)
                h = tl.where(i == n, r, tl.where(i < n, h, 0.0))
                passes = tl.load(eta_ptr + row * GAMMA + k) < h
                tau = tl.where(passes, i, tau)
                scale = tl.where(passes, r, scale)
        else:
            tau = _token_tau(
                logits_ptr,
                thresholds_ptr,
                draft_ids_ptr,
                draft_probs_ptr,
                eta_ptr,
                block_max_ptr,
                block_sum_ptr,
                row,
                n,
                temperature,
                V,
                NB,
                GAMMA,
                NB_PAD,
            )
            scale = tl.full((), 1.0, tl.float64)

        # The distribution of Y: the residual at tau, or p_tau (bonus, or a residual of zero mass).
        residual = tl.load(
            residual_masses_ptr + (row * GAMMA + tau) * NB + blocks,
            mask=blocks < tl.where(tau < n, NB, 0),
            other=0.0,
        ).to(tl.float64)
        use_target = (tau >= n) | ~(tl.sum(residual, axis=0) > 0)
        row_pos = row * (GAMMA + 1) + tau
        m, s = _position_stats(block_max_ptr, block_sum_ptr, row_pos * NB, NB, NB_PAD)
        bmax = tl.load(block_max_ptr + row_pos * NB + blocks, mask=in_vocab_blocks, other=float("-inf"))
        bsum = tl.load(block_sum_ptr + row_pos * NB + blocks, mask=in_vocab_blocks, other=0.0)
        target_masses = tl.where(bsum > 0, bsum * tl.exp(bmax - m) / s, 0.0).to(tl.float64)
        masses = tl.where(use_target, target_masses, residual)

        # Inverse CDF over blocks: the first block whose cumulative mass exceeds u * total.
        cumulative = tl.cumsum(masses, axis=0)
        total = tl.sum(masses, axis=0)
        # Strictly below the total (as sample_from_probs), so a block of positive mass is chosen.
        threshold_u = tl.minimum(tl.load(u_ptr + row) * total, total * (1.0 - 4.5e-16))
        chosen = tl.minimum(tl.sum((cumulative <= threshold_u).to(tl.int32), axis=0), NB - 1)
        before = tl.max(tl.where(cumulative <= threshold_u, cumulative, 0.0), axis=0)

        # Inverse CDF inside the chosen block (one re-read of BLOCK_V ids).
        lane = tl.arange(0, BLOCK_V)
        offs = chosen * BLOCK_V + lane
        mask = offs < V
        q_mask = offs < tl.where(use_target, 0, V)
        threshold = tl.load(thresholds_ptr + row_pos)
        x = _warped_logits(logits_ptr + row_pos * V, offs, mask, threshold, temperature)
        p = tl.where(x == float("-inf"), 0.0, tl.exp(x - m) / s)
        q_pos = tl.maximum(tl.minimum(tau, GAMMA - 1), 0)
        q = tl.load(draft_probs_ptr + (row * GAMMA + q_pos) * V + offs, mask=q_mask, other=0.0)
        w = scale.to(tl.float32) * p - q.to(tl.float32)
        weights = tl.where(use_target, p, tl.where(w > 0, w, 0.0))
        local = before + tl.cumsum(weights.to(tl.float64), axis=0)
        index = tl.sum((local <= threshold_u).to(tl.int32), axis=0)
        # Rounding between the block mass and its re-read can leave the threshold past the block's
        # end: take its last id of positive weight.
        last_positive = tl.maximum(tl.max(tl.where(weights > 0, lane, -1), axis=0), 0)
        index = tl.where((index >= BLOCK_V) | (chosen * BLOCK_V + index >= V), last_positive, index)
        tl.store(accepted_counts_ptr + row, tau.to(tl.int64))
        tl.store(next_tokens_ptr + row, (chosen * BLOCK_V + index).to(tl.int64))
