"""Verification rules: token (Leviathan et al. 2023), block (Sun et al. 2024, Algorithm 2), greedy.

Terms, used exactly so in this package:
- draft: the cheap model M_s; it proposed draft_ids X_1..X_g with probabilities q.
- target: the model M_b; target_probs p score positions 1..g+1 of the block in one forward pass.
- accepted: the kept draft prefix X_1..X_tau; accepted_counts holds tau per row.
- correction: the token sampled after a rejection (tau < n), from a residual distribution.
- bonus: the token sampled from p_{n+1} when all n drafts are kept.
- next_tokens: the correction or bonus token Y; an iteration emits tau + 1 tokens.
- num_draft_tokens: n per row (ragged blocks); positions >= n of a row are padding.

Every rule takes the same arguments and the randomness as explicit uniforms, so a rule is a pure
function: the same uniforms give the same result on every tensor-parallel rank, in the Triton
kernel and in the vocabulary-parallel path. Block verification (docs/design.md section 1):

    r_0 = 1,  r_i = min(1, r_{i-1} p_i(X_i) / q_i(X_i))
    Z_i = sum_x max(r_i p_{i+1}(x) - q_{i+1}(x), 0)             i < n
    h_i = Z_i / (Z_i + 1 - r_i)  (1 when the denominator is 0)    i < n;   h_n = r_n
    tau = the largest i with eta_i < h_i, else 0                  (no early break)
    Y ~ norm(max(r_tau p_{tau+1} - q_{tau+1}, 0)) if tau < n,  else Y ~ p_{n+1}

verify_block computes a Z_i only where it can decide tau (block_decisions); block_accepted_counts
is the same decision from every Z_i at once, for callers that reduce all of them anyway (the
vocabulary-parallel path).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from distributed_spec.verify.sampling import sample_from_probs

VERIFY_METHODS = ("block", "token", "greedy")

# Cap on log(p/q) where q(X_i) = 0 < p(X_i): r_i becomes 1 for any r_{i-1} above ~e^-1e4 (every
# non-zero float), and the cap keeps the cumulative sums below free of inf - inf.
_MAX_LOG_RATIO = 1.0e4
# Elements per chunk of the finiteness sums over V: small enough that one chunk of p and q stays
# in cache at large B.
_CHUNK_ELEMENTS = 1 << 18
# Below this many elements in p, one unchunked pass is cheaper: per-op overhead dominates there.
_UNCHUNKED_ELEMENTS = 1 << 21


@dataclass(frozen=True)
class VerifyUniforms:
    """The random numbers of one verification step."""

    # [B, g] float64 in [0, 1): one per draft position (the eta_i of block verification, the
    # acceptance draws of token verification).
    eta: torch.Tensor
    # [B] float64 in [0, 1): drives inverse-CDF sampling of the correction or bonus token.
    u: torch.Tensor


def draw_uniforms(
    batch_size: int,
    g: int,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> VerifyUniforms:
    """Draw the uniforms of one step; one call per step keeps a seeded run reproducible."""
    draws = torch.rand(batch_size, g + 1, generator=generator, dtype=torch.float64, device=device)
    return VerifyUniforms(eta=draws[:, :g], u=draws[:, g])


@dataclass(frozen=True)
class VerifyOutput:
    # [B] long: tau, the number of accepted draft tokens of each row.
    accepted_counts: torch.Tensor
    # [B] long: the correction or bonus token Y of each row.
    next_tokens: torch.Tensor
    # [B, g] bool: draft position i of row b was kept (i < tau_b); for acceptance per position.
    accepted_mask: torch.Tensor


def _check_inputs(
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    num_draft_tokens: torch.Tensor,
) -> None:
    batch_size, g = draft_ids.shape
    vocab_size = target_probs.shape[-1]
    if target_probs.shape != (batch_size, g + 1, vocab_size):
        raise ValueError(
            f"target_probs must be [B, g+1, V] = [{batch_size}, {g + 1}, V], got {tuple(target_probs.shape)}"
        )
    if draft_probs is not None and draft_probs.shape != (batch_size, g, vocab_size):
        raise ValueError(
            f"draft_probs must be [B, g, V] = [{batch_size}, {g}, {vocab_size}], got {tuple(draft_probs.shape)}"
        )
    if num_draft_tokens.shape != (batch_size,):
        raise ValueError(
            f"num_draft_tokens must be [B] = [{batch_size}], got {tuple(num_draft_tokens.shape)}"
        )
    # Host syncs: input validation must raise here, before any token is produced.
    if bool(((num_draft_tokens < 0) | (num_draft_tokens > g)).any()):
        raise ValueError(f"num_draft_tokens must lie in [0, g={g}], got {num_draft_tokens.tolist()}")
    if g > 0 and bool(((draft_ids < 0) | (draft_ids >= vocab_size)).any()):
        raise ValueError(f"draft_ids must lie in [0, V={vocab_size})")


def _check_finite(target_probs: torch.Tensor, draft_probs: torch.Tensor | None) -> None:
    """Raise ValueError if p [B, g+1, V] or q [B, g, V] hold NaN or inf (one chunked pass of sums)."""
    batch_size, num_positions, vocab_size = target_probs.shape
    chunk = max(1024, _CHUNK_ELEMENTS // max(1, batch_size * num_positions))
    if target_probs.numel() <= _UNCHUNKED_ELEMENTS:
        chunk = vocab_size
    target_sums = target_probs.new_zeros(batch_size, num_positions, dtype=torch.float32)
    draft_sums = None if draft_probs is None else target_sums.new_zeros(batch_size, num_positions - 1)
    for start in range(0, vocab_size, chunk):
        target_sums += target_probs[..., start : start + chunk].sum(dim=-1, dtype=torch.float32)
        if draft_probs is not None:
            draft_sums += draft_probs[..., start : start + chunk].sum(dim=-1, dtype=torch.float32)
    # Host sync: a non-finite input must raise instead of producing a silent NaN token.
    finite = bool(target_sums.isfinite().all()) and (draft_sums is None or bool(draft_sums.isfinite().all()))
    if not finite:
        raise ValueError(
            "target_probs or draft_probs hold NaN or inf; check the model logits and sampling settings"
        )


def residual_mass(target_probs: torch.Tensor, draft_probs: torch.Tensor, scale: float) -> float:
    """Z = sum_x max(r p(x) - q(x), 0) of one position: p [V], q [V], r a float."""
    # q - r p clamped to (-inf, 0] and summed is -Z: two passes over V, one temporary.
    negative = torch.add(draft_probs.float(), target_probs.float(), alpha=-scale).clamp_(max=0.0)
    return -negative.sum().item()


def _h(z: float, r: float) -> float:
    """h = Z / (Z + 1 - r); Z = 0 with r = 1 is 0/0, h = 1 (every later block is accepted then)."""
    denominator = z + 1.0 - r
    return z / denominator if denominator > 0 else 1.0


def block_decisions(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    target_on_path: torch.Tensor,
    draft_on_path: torch.Tensor,
    r: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    eta: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """tau and r_tau of block verification, row by row, paying for Z_i only where it decides tau.

    tau is the largest i <= n with eta_i < h_i, so each row scans i = n, n-1, .. 1 and stops at the
    first hit; h_n = r_n. For i < n, h_i = Z_i / (Z_i + 1 - r_i) grows with Z_i, and the next draft
    token X = X_{i+1} bounds Z_i = sum_x max(r_i p_{i+1}(x) - q_{i+1}(x), 0) on both sides:
        max(r_i p(X) - q(X), 0)  <=  Z_i  <=  r_i - min(r_i p(X), q(X))    (p sums to 1)
    Only an eta_i between the two bounds on h_i pays the pass over V that Z_i costs. The scan runs
    on the host (a few floats per row); the passes over V run on p's device.

    Args:
        target_probs: p [B, g+1, V]; draft_probs: q [B, g, V]
        target_on_path: p_i(X_i) [B, g]; draft_on_path: q_i(X_i) [B, g]
        r: r_1..r_g [B, g] float64; num_draft_tokens: n [B]; eta: [B, g] uniforms
    Returns:
        accepted_counts [B] long, residual_scales r_tau [B] float64 (r_0 = 1)
    """
    accepted_counts, residual_scales = [], []
    # Host sync: the scan below decides which rows of V are reduced.
    rows = zip(
        r.tolist(), eta.tolist(), num_draft_tokens.tolist(), target_on_path.tolist(), draft_on_path.tolist()
    )
    for row, (r_row, eta_row, n, p_path, q_path) in enumerate(rows):
        tau = _scan_row(target_probs[row], draft_probs[row], r_row, eta_row, n, p_path, q_path)
        accepted_counts.append(tau)
        residual_scales.append(r_row[tau - 1] if tau > 0 else 1.0)
    device = num_draft_tokens.device
    return (
        torch.tensor(accepted_counts, dtype=torch.long, device=device),
        torch.tensor(residual_scales, dtype=torch.float64, device=device),
    )


def _scan_row(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    r_row: list[float],
    eta_row: list[float],
    n: int,
    p_path: list[float],
    q_path: list[float],
) -> int:
    """tau of one row (see block_decisions): p [g+1, V], q [g, V]; the rest are that row's floats.

    Indices are 1-based in the math: r_i = r_row[i - 1], p_{i+1}(X_{i+1}) = p_path[i], p_{i+1} = p[i].
    """
    if n > 0 and eta_row[n - 1] < r_row[n - 1]:  # h_n = r_n
        return n
    for i in range(n - 1, 0, -1):
        r_i, eta_i = r_row[i - 1], eta_row[i - 1]
        scaled_p, q_next = r_i * p_path[i], q_path[i]  # r_i p_{i+1}(X_{i+1}), q_{i+1}(X_{i+1})
        if eta_i >= _h(r_i - min(scaled_p, q_next), r_i):  # above the upper bound on h_i
            continue
        if eta_i < _h(max(scaled_p - q_next, 0.0), r_i):  # below the lower bound
            return i
        if eta_i < _h(residual_mass(target_probs[i], draft_probs[i], r_i), r_i):
            return i
    return 0


def _on_path(probs: torch.Tensor, draft_ids: torch.Tensor) -> torch.Tensor:
    """probs [B, g(+1), V], draft_ids [B, g] -> probability of each draft token [B, g] float64."""
    g = draft_ids.shape[1]
    return probs[:, :g].gather(-1, draft_ids.unsqueeze(-1)).squeeze(-1).double()


def _sample_next_tokens(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    accepted_counts: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    residual_scales: torch.Tensor,
    u: torch.Tensor,
) -> torch.Tensor:
    """Sample Y: from norm(max(r p_{tau+1} - q_{tau+1}, 0)) where tau < n, else from p_{n+1}.

    Args:
        target_probs: p [B, g+1, V]; draft_probs: q [B, g, V]
        accepted_counts: tau [B]; num_draft_tokens: n [B]
        residual_scales: r_tau [B] (1 for token verification)
        u: [B] uniforms
    Returns:
        next_tokens [B] long
    """
    batch_size, g, _ = draft_probs.shape
    rows = torch.arange(batch_size, device=target_probs.device)
    p = target_probs[rows, accepted_counts].float()  # [B, V]
    is_bonus = accepted_counts >= num_draft_tokens  # [B]
    if g == 0:
        return sample_from_probs(p, u)
    q = draft_probs[rows, accepted_counts.clamp(max=g - 1)].float()  # [B, V]
    residual = (p * residual_scales.float().unsqueeze(-1)).sub_(q).clamp_(min=0.0)
    # A zero residual mass has probability zero in exact arithmetic; under rounding, fall back to
    # p rather than divide by zero.
    use_target = is_bonus | ~(residual.sum(dim=-1) > 0)
    weights = torch.where(use_target.unsqueeze(-1), p, residual)
    return sample_from_probs(weights, u)


def _accepted_mask(accepted_counts: torch.Tensor, g: int) -> torch.Tensor:
    positions = torch.arange(g, device=accepted_counts.device)
    return positions.unsqueeze(0) < accepted_counts.unsqueeze(1)


def _prefix_length(passes: torch.Tensor) -> torch.Tensor:
    """passes [B, g] bool -> length of the leading run of True per row [B] long."""
    return passes.long().cumprod(dim=1).sum(dim=1)


def block_acceptance_probs(
    target_on_path: torch.Tensor,
    draft_on_path: torch.Tensor,
) -> torch.Tensor:
    """r_1..r_g of block verification, vectorised over positions.

    r_i = min(1, r_{i-1} rho_i) in log space is L_i = min(0, L_{i-1} + l_i), whose closed form is
    L_i = S_i - max(0, S_1, .., S_i) with S_i the cumulative sum of l_j = log rho_j.

    Args:
        target_on_path: p_i(X_i) [B, g] float64; draft_on_path: q_i(X_i) [B, g] float64
    Returns:
        r [B, g] float64, non-increasing along g.
    """
    # p = 0 rejects for sure (0/q and 0/0); q = 0 < p accepts (p/0 = inf, capped).
    log_ratio = torch.log(target_on_path / draft_on_path).nan_to_num_(
        nan=float("-inf"), posinf=_MAX_LOG_RATIO, neginf=float("-inf")
    )
    cumulative = log_ratio.cumsum(dim=1)
    running_max = cumulative.cummax(dim=1).values.clamp_(min=0.0)
    return cumulative.sub_(running_max).exp_()


def block_accepted_counts(
    r: torch.Tensor,
    residual_masses: torch.Tensor | None,
    num_draft_tokens: torch.Tensor,
    eta: torch.Tensor,
) -> torch.Tensor:
    """tau of block verification from r_i and Z_i: the largest i with eta_i < h_i, else 0.

    Args:
        r: r_1..r_g [B, g] float64 (may be None when g = 0)
        residual_masses: Z_1..Z_{g-1} [B, g-1] (None when g <= 1)
        num_draft_tokens: n [B] long; h_n = r_n, positions past n are never chosen
        eta: [B, g] uniforms
    Returns:
        accepted_counts [B] long
    """
    g = eta.shape[1]
    if g == 0:
        return torch.zeros_like(num_draft_tokens)
    positions = torch.arange(1, g + 1, device=r.device)  # i = 1..g
    n = num_draft_tokens.unsqueeze(1)
    h = r
    if g > 1:
        z = residual_masses.double()
        # 0/0 (Z_i = 0, r_i = 1) is h_i = 1: with r_i = 1 every later block is accepted.
        h_inner = z.div(z + (1.0 - r[:, :-1])).nan_to_num_(nan=1.0)
        h = torch.where(positions == n, r, torch.cat([h_inner, r[:, -1:]], dim=1))  # h_n = r_n
    chosen = (eta < h) & (positions <= n)
    return (chosen * positions).amax(dim=1)


def verify_block(
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    uniforms: VerifyUniforms,
) -> VerifyOutput:
    """Block verification (Sun et al., Algorithm 2).

    Args:
        draft_ids: X [B, g] long
        draft_probs: q [B, g, V]
        target_probs: p [B, g+1, V]
        num_draft_tokens: n [B] long in [0, g]
        uniforms: eta [B, g], u [B]
    """
    g = draft_ids.shape[1]
    _check_inputs(draft_ids, draft_probs, target_probs, num_draft_tokens)
    _check_finite(target_probs, draft_probs)
    target_on_path, draft_on_path = _on_path(target_probs, draft_ids), _on_path(draft_probs, draft_ids)
    r = block_acceptance_probs(target_on_path, draft_on_path)
    accepted_counts, residual_scales = block_decisions(
        target_probs, draft_probs, target_on_path, draft_on_path, r, num_draft_tokens, uniforms.eta
    )
    next_tokens = _sample_next_tokens(
        target_probs, draft_probs, accepted_counts, num_draft_tokens, residual_scales, uniforms.u
    )
    return VerifyOutput(accepted_counts, next_tokens, _accepted_mask(accepted_counts, g))


def verify_token(
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    uniforms: VerifyUniforms,
) -> VerifyOutput:
    """Token verification (Leviathan et al.): keep X_i while eta_i < min(1, p_i(X_i) / q_i(X_i)).

    Same arguments as verify_block.
    """
    batch_size, g = draft_ids.shape
    _check_inputs(draft_ids, draft_probs, target_probs, num_draft_tokens)
    _check_finite(target_probs, draft_probs)
    positions = torch.arange(g, device=draft_ids.device)
    # eta < p / q written without the division: q = 0 < p accepts, p = 0 rejects.
    passes = uniforms.eta * _on_path(draft_probs, draft_ids) < _on_path(target_probs, draft_ids)
    passes &= positions.unsqueeze(0) < num_draft_tokens.unsqueeze(1)
    accepted_counts = _prefix_length(passes)
    next_tokens = _sample_next_tokens(
        target_probs,
        draft_probs,
        accepted_counts,
        num_draft_tokens,
        torch.ones(batch_size, dtype=torch.float64, device=draft_ids.device),
        uniforms.u,
    )
    return VerifyOutput(accepted_counts, next_tokens, _accepted_mask(accepted_counts, g))


def verify_greedy(
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    uniforms: VerifyUniforms | None = None,
) -> VerifyOutput:
    """Greedy verification (temperature 0): keep the longest prefix where X_i = argmax p_i.

    Same arguments as verify_block; draft_probs and uniforms are not used. target_probs may
    also be target logits (only the argmax matters).
    """
    batch_size, g = draft_ids.shape
    _check_inputs(draft_ids, None, target_probs, num_draft_tokens)
    _check_finite(target_probs, None)
    target_argmax = target_probs.argmax(dim=-1)  # [B, g+1]
    positions = torch.arange(g, device=draft_ids.device)
    passes = (draft_ids == target_argmax[:, :g]) & (
        positions.unsqueeze(0) < num_draft_tokens.unsqueeze(1)
    )
    accepted_counts = _prefix_length(passes)
    next_tokens = target_argmax.gather(1, accepted_counts.unsqueeze(1)).squeeze(1)
    return VerifyOutput(accepted_counts, next_tokens, _accepted_mask(accepted_counts, g))


VerifyFn = Callable[..., VerifyOutput]
_RULES: dict[str, VerifyFn] = {"block": verify_block, "token": verify_token, "greedy": verify_greedy}


def verify(
    method: str,
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    num_draft_tokens: torch.Tensor | None,
    uniforms: VerifyUniforms | None,
) -> VerifyOutput:
    """Dispatch to a rule by name ("block", "token" or "greedy"); n defaults to g on every row."""
    if method not in _RULES:
        raise ValueError(f"verifier.method must be one of {VERIFY_METHODS}, got {method!r}")
    if num_draft_tokens is None:
        num_draft_tokens = torch.full(
            (draft_ids.shape[0],), draft_ids.shape[1], dtype=torch.long, device=draft_ids.device
        )
    if method != "greedy" and (draft_probs is None or uniforms is None):
        raise ValueError(f"verifier.method={method!r} needs draft_probs and uniforms")
    return _RULES[method](draft_ids, draft_probs, target_probs, num_draft_tokens, uniforms)
