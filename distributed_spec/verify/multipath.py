"""Multi-path verification: K draft paths per row, one kept prefix and one token (docs/design.md section 7).

Terms as in rules.py, plus:
- path k: draft tokens X^k_1..X^k_n of a row, drawn from the draft process q^k; paths of a row are
  independent given the row's committed prefix (i.i.d. samples of one draft, or different proposers,
  e.g. a model path and an n-gram path with a point-mass q). Never deduplicated or drawn without
  replacement: the exactness argument below needs the independence.
- node v: an accepted prefix X^k_1..X^k_d (depth d); path j *shares* v when X^j_1..X^j_d = v.
- T: the first-token target at the current node; the process being sampled from v is
  P_{v,T} = T for the token after v, then the target p.

Recursive block verification over paths (this repository's own rule: Thomas & Pal's GBV, arXiv
2602.16961, is the reference for the idea, but its exact rule was not available to us):

    v = (), d = 0, T = p_1, k = 1
    1. block verification (rules.py) of path k's positions d+1..n against P_{v,T}:
         r_d = 1,  r_i = min(1, r_{i-1} P(X^k_i) / q^k_i(X^k_i))   P = T at i = d+1, p^k_i after
         h_i = Z_i / (Z_i + 1 - r_i),  Z_i = sum_x max(r_i p^k_{i+1}(x) - q^k_{i+1}(x), 0)   i < n
         h_n = r_n;  tau = the largest i in d+1..n with eta^k_i < h_i, else d
    2. tau = n: Y ~ p^k_{n+1} (bonus); stop.
    3. T' = norm(max(r_tau T'' - q^k_{tau+1}, 0)),  T'' = T if tau = d else p^k_{tau+1}
       (what block verification would draw Y from).
    4. j = the smallest index > k whose path shares v' = X^k_1..X^k_tau. None: Y ~ T' (with u); stop.
       Else v, d, T, k = v', tau, T', j and go to 1.

Why it is exact (induction on the paths left). Claim: from any state (v, T, k) the rule is a
lossless sampler of P_{v,T}: what it emits, continued by sampling from p, is distributed as P_{v,T}.
- Block verification is lossless for any target process and any draft process whose block it is
  given (Sun et al., Theorem 1); step 1 with "Y ~ T'" is block verification of P_{v,T}, so its
  accepted part followed by (Y ~ T', then p) is P_{v,T}.
- Step 4 replaces (Y ~ T', then p) with the rule from (v', T', j). By induction that is a lossless
  sampler of P_{v',T'}: the tail has the same law, so the whole does too. With no path left the
  rule draws Y ~ T' itself, which is block verification (the base case).
- The induction needs path j's tokens after v' to be distributed as q^j from v' given all seen so
  far. They are: paths are independent, path j was chosen by prefix tests only, and its uniforms
  eta^j are fresh. The paths skipped in step 4 do not share v', so no later node (which extends v')
  could use them; the paths after j are untouched.
At K = 1 step 4 finds nothing: the rule is block verification, and verify_multipath computes it with
verify_block's functions and arithmetic, so the same uniforms give the same tokens bit for bit.
With tau = d = 0 it is recursive rejection sampling over the paths' first tokens (multi-candidate
speculative sampling); beyond the root a path helps only where it shares the accepted prefix.

The kept path (path_indices) is the path whose verification accepted the last kept token (path 1 if
none): its first tau tokens are the accepted ones, so its cache entries are the ones to keep. With
one-hot p and q this is the smallest index among the longest greedy matches, as in
verify_multipath_greedy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from distributed_spec.verify.rules import (
    VerifyOutput,
    _accepted_mask,
    _check_finite,
    _check_inputs,
    _on_path,
    _prefix_length,
    _scan_row,
    block_acceptance_probs,
)
from distributed_spec.verify.sampling import sample_from_probs


@dataclass(frozen=True)
class MultiPathUniforms:
    """The random numbers of one multi-path verification step."""

    # [B, K, g] float64 in [0, 1): eta^k_i, one per path and draft position (each path is verified
    # at most once, so no uniform is used twice).
    eta: torch.Tensor
    # [B] float64 in [0, 1): drives inverse-CDF sampling of the correction or bonus token.
    u: torch.Tensor


def draw_multipath_uniforms(
    batch_size: int,
    num_paths: int,
    g: int,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> MultiPathUniforms:
    """Draw the uniforms of one step; at K = 1 the same draws as rules.draw_uniforms."""
    draws = torch.rand(
        batch_size, num_paths * g + 1, generator=generator, dtype=torch.float64, device=device
    )
    eta = draws[:, : num_paths * g].reshape(batch_size, num_paths, g)
    return MultiPathUniforms(eta=eta, u=draws[:, num_paths * g])


@dataclass(frozen=True)
class MultiPathVerifyOutput(VerifyOutput):
    # [B] long: the kept path k; draft_ids[b, k, :tau_b] are the accepted tokens.
    path_indices: torch.Tensor


def _check_paths(
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    num_draft_tokens: torch.Tensor,
) -> None:
    """Shapes of K paths ([B, K, g], [B, K, g, V], [B, K, g+1, V], [B]); then rules' checks on B*K rows."""
    if draft_ids.dim() != 3:
        raise ValueError(f"draft_ids must be [B, K, g], got {tuple(draft_ids.shape)}")
    batch_size, num_paths, g = draft_ids.shape
    if num_paths < 1:
        raise ValueError("multi-path verification needs K >= 1 paths")
    if target_probs.dim() != 4 or target_probs.shape[:2] != (batch_size, num_paths):
        raise ValueError(f"target_probs must be [B, K, g+1, V] with B, K = {batch_size}, {num_paths}")
    if draft_probs is not None and (
        draft_probs.dim() != 4 or draft_probs.shape[:2] != (batch_size, num_paths)
    ):
        raise ValueError(f"draft_probs must be [B, K, g, V] with B, K = {batch_size}, {num_paths}")
    if num_draft_tokens.shape != (batch_size,):
        raise ValueError(
            f"num_draft_tokens must be [B] = [{batch_size}], got {tuple(num_draft_tokens.shape)}"
        )
    flat_ids = draft_ids.reshape(batch_size * num_paths, g)
    flat_p = target_probs.reshape(batch_size * num_paths, *target_probs.shape[2:])
    flat_q = (
        None if draft_probs is None else draft_probs.reshape(batch_size * num_paths, *draft_probs.shape[2:])
    )
    _check_inputs(flat_ids, flat_q, flat_p, num_draft_tokens.repeat_interleave(num_paths))
    _check_finite(flat_p, flat_q)


def _next_sharing_path(row_ids: list[list[int]], k: int, depth: int) -> int | None:
    """The smallest j > k whose first `depth` tokens equal path k's, else None."""
    prefix = row_ids[k][:depth]
    return next((j for j in range(k + 1, len(row_ids)) if row_ids[j][:depth] == prefix), None)


def _verify_row(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    row_ids: list[list[int]],
    eta_row: list[list[float]],
    n: int,
    first_r: list[float],
    first_p_path: list[float],
    first_q_path: list[float],
) -> tuple[int, int, torch.Tensor]:
    """The recursion of the module docstring for one row.

    Args:
        target_probs: p [K, g+1, V]; draft_probs: q [K, g, V] (this row)
        row_ids: X [K][g]; eta_row: [K][g]; n: draft tokens per path
        first_r, first_p_path, first_q_path: r_1..r_g, p_i(X_i), q_i(X_i) of path 1 (computed for
            all rows at once, as verify_block does)
    Returns:
        tau, the kept path, and the weights [V] float32 Y is drawn from
    """
    k, depth, first_target, kept = 0, 0, None, 0  # first_target None: P = p at the first position
    r_row, p_path, q_path = first_r, first_p_path, first_q_path
    while True:
        p_k, q_k = target_probs[k, depth:], draft_probs[k, depth:]
        if first_target is not None:
            p_path = [first_target[row_ids[k][depth]].item()] + _on_path_row(p_k, row_ids[k][depth:n])[1:]
            q_path = _on_path_row(q_k, row_ids[k][depth:n])
            r_row = _acceptance_row(p_path, q_path)
        accepted = _scan_row(p_k, q_k, r_row, eta_row[k][depth:], n - depth, p_path, q_path)
        tau = depth + accepted
        if accepted > 0:
            kept = k
        if tau == n:  # every token of the path kept: the bonus token
            return tau, kept, target_probs[k, n].float()
        # What block verification draws Y from: norm(max(r_tau P_{tau+1} - q_{tau+1}, 0)), in
        # verify_block's float32 arithmetic (bit for bit at K = 1).
        base = target_probs[k, tau].float() if first_target is None or accepted > 0 else first_target.float()
        scale = torch.tensor(r_row[accepted - 1] if accepted > 0 else 1.0, dtype=torch.float64).float()
        residual = (base * scale).sub_(draft_probs[k, tau].float()).clamp_(min=0.0)
        if not residual.sum() > 0:
            residual = base  # probability zero in exact arithmetic (as in verify_block)
        j = _next_sharing_path(row_ids, k, tau)
        if j is None:
            return tau, kept, residual
        k, depth = j, tau
        first_target = residual.double() / residual.double().sum()


def _on_path_row(probs: torch.Tensor, ids: list[int]) -> list[float]:
    """probs [>= m, V], ids [m] -> probs[i, ids[i]] as float64 floats."""
    index = torch.tensor(ids, dtype=torch.long, device=probs.device)
    return probs[: len(ids)].gather(-1, index.unsqueeze(-1)).squeeze(-1).double().tolist()


def _acceptance_row(p_path: list[float], q_path: list[float]) -> list[float]:
    """r_1..r_m of one block from on-path floats (block_acceptance_probs on one row)."""
    if not p_path:
        return []
    tensors = [torch.tensor([values], dtype=torch.float64) for values in (p_path, q_path)]
    return block_acceptance_probs(*tensors)[0].tolist()


def verify_multipath(
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    uniforms: MultiPathUniforms,
) -> MultiPathVerifyOutput:
    """Recursive block verification over K paths (module docstring); K = 1 is verify_block.

    Args:
        draft_ids: X [B, K, g] long; the paths of a row share the row's committed prefix
        draft_probs: q [B, K, g, V]: q^k_i = the law X^k_i was drawn from
        target_probs: p [B, K, g+1, V]: p^k_i = p(. | prefix, X^k_1..X^k_{i-1}); equal on shared
            prefixes (p^k_1 is the same for every k)
        num_draft_tokens: n [B] long in [0, g], the same for every path of a row
        uniforms: eta [B, K, g], u [B]
    Returns:
        accepted_counts tau [B], next_tokens Y [B], accepted_mask [B, g], path_indices [B]
    """
    _check_paths(draft_ids, draft_probs, target_probs, num_draft_tokens)
    g = draft_ids.shape[2]
    # Path 1 of every row at once, exactly as verify_block computes r.
    target_on_path = _on_path(target_probs[:, 0], draft_ids[:, 0])
    draft_on_path = _on_path(draft_probs[:, 0], draft_ids[:, 0])
    r = block_acceptance_probs(target_on_path, draft_on_path)
    counts, kept, weights = [], [], []
    # Host sync: the recursion decides which paths and positions are reduced over V (as block_decisions).
    rows = zip(
        draft_ids.tolist(),
        uniforms.eta.tolist(),
        num_draft_tokens.tolist(),
        r.tolist(),
        target_on_path.tolist(),
        draft_on_path.tolist(),
    )
    for row, (row_ids, eta_row, n, r_row, p_path, q_path) in enumerate(rows):
        tau, path, row_weights = _verify_row(
            target_probs[row], draft_probs[row], row_ids, eta_row, n, r_row, p_path, q_path
        )
        counts.append(tau)
        kept.append(path)
        weights.append(row_weights)
    device = draft_ids.device
    accepted_counts = torch.tensor(counts, dtype=torch.long, device=device)
    next_tokens = sample_from_probs(torch.stack(weights), uniforms.u)
    return MultiPathVerifyOutput(
        accepted_counts,
        next_tokens,
        _accepted_mask(accepted_counts, g),
        torch.tensor(kept, dtype=torch.long, device=device),
    )


def verify_multipath_greedy(
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    uniforms: MultiPathUniforms | None = None,
) -> MultiPathVerifyOutput:
    """Greedy (temperature 0): the longest prefix of any path with X^k_i = argmax p^k_i; ties to the
    smallest k. Same arguments as verify_multipath; draft_probs and uniforms are not used, and
    target_probs may be logits. K = 1 is rules.verify_greedy."""
    _check_paths(draft_ids, None, target_probs, num_draft_tokens)
    batch_size, num_paths, g = draft_ids.shape
    target_argmax = target_probs.argmax(dim=-1)  # [B, K, g+1]
    positions = torch.arange(g, device=draft_ids.device)
    passes = (draft_ids == target_argmax[..., :g]) & (positions < num_draft_tokens[:, None, None])
    matches = _prefix_length(passes.reshape(batch_size * num_paths, g)).view(batch_size, num_paths)
    accepted_counts, path_indices = matches.max(dim=1)  # the first maximal index on ties
    rows = torch.arange(batch_size, device=draft_ids.device)
    next_tokens = target_argmax[rows, path_indices, accepted_counts]
    return MultiPathVerifyOutput(
        accepted_counts, next_tokens, _accepted_mask(accepted_counts, g), path_indices
    )


_MULTIPATH_RULES = {"block": verify_multipath, "greedy": verify_multipath_greedy}


def verify_paths(
    method: str,
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    num_draft_tokens: torch.Tensor | None,
    uniforms: MultiPathUniforms | None,
) -> MultiPathVerifyOutput:
    """Dispatch like rules.verify: "block" (recursive block verification) or "greedy"; n defaults to g."""
    if method not in _MULTIPATH_RULES:
        raise ValueError(f"multi-path verification supports {tuple(_MULTIPATH_RULES)}, got {method!r}")
    if num_draft_tokens is None:
        num_draft_tokens = torch.full(
            (draft_ids.shape[0],), draft_ids.shape[-1], dtype=torch.long, device=draft_ids.device
        )
    if method != "greedy" and (draft_probs is None or uniforms is None):
        raise ValueError(f"multi-path {method!r} verification needs draft_probs and uniforms")
    return _MULTIPATH_RULES[method](draft_ids, draft_probs, target_probs, num_draft_tokens, uniforms)
