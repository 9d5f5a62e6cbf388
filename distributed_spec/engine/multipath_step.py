"""One speculative step with K draft paths per row: fork, one target forward, keep one path.

    from distributed_spec.engine.multipath_step import run_multipath_step

"K rows sharing the prefix" (docs/design.md section 7): each row of the batch becomes K rows of the
runners (row b's paths are rows b*K .. b*K+K-1), which share the row's cache and differ in their
draft tokens only.
1. draft: the draft feeds each row's pending input once (B rows), forks its rows K ways, and samples
   K paths of g tokens from the same first logits with each path's own uniforms: i.i.d. paths
   given the prefix, as the multi-path rule needs (never deduplicated).
2. target: prompt chunks still staged go in first, unforked (a separate forward, only in steps
   where rows take in prompts: forking them would feed each prompt K times); then the target forks
   its rows K ways and scores all K blocks [Y, X^k_1..X^k_g] in ONE forward of [B*K, g+1].
3. verify: verify_paths (recursive block verification or the greedy rule) gives tau, Y and the
   kept path per row.
4. commit: both sides roll back as in a one-path step (on all B*K rows, with the row's tau), then
   keep only the kept path's row of each row: B rows again, the one-path invariant of sides.py.
At K = 1 the executor never comes here (its one-path code is unchanged).

Each step is split into the draft's half (`propose_paths`, `commit_draft_paths`) and the target's
(`score_paths`, `verify_paths_from_logits`, `commit_target_paths`), so that the Ray runtime runs
the same functions in its draft actor and its target shards (distributed/draft_worker.py,
distributed/target_shard.py) as `run_multipath_step` runs here in one process.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

import torch

from distributed_spec.engine.runner import ModelRunner
from distributed_spec.engine.sides import DraftSide, TargetSide
from distributed_spec.engine.steps import draft_from_logits
from distributed_spec.verify import MultiPathUniforms, RowSampling, Sampling, logits_to_probs, verify_paths

if TYPE_CHECKING:  # executor.py imports this module
    from distributed_spec.engine.executor import StepPlan


def path_rows(batch_size: int, num_paths: int, device: torch.device | str | None = None) -> torch.Tensor:
    """[B*K] long: the fork index, row b repeated K times (row b's path k is row b*K + k)."""
    return torch.arange(batch_size, device=device).repeat_interleave(num_paths)


def kept_path_rows(path_indices: torch.Tensor, num_paths: int) -> torch.Tensor:
    """path_indices [B] long (the kept path k_b) -> [B] long: the forked rows b*K + k_b to keep."""
    return torch.arange(path_indices.shape[0], device=path_indices.device) * num_paths + path_indices


def propose_paths(
    draft: DraftSide,
    g: int,
    num_paths: int,
    params: Sampling,
    draft_uniforms: torch.Tensor,
    decoding: torch.Tensor,
    to_sampled: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K independent draft paths per row; leaves the draft side forked to B*K rows.

    Args:
        draft_uniforms: [B, K, g] float64, path k of row b samples with draft_uniforms[b, k].
        decoding: [B] bool (rows still prefilling feed their staged prompt only).
        to_sampled: as in engine.steps.propose (the Ray draft samples q as it goes on the wire),
            called on [B*K, V] per position, path-major rows.
    Returns:
        draft_ids [B, K, g] long, draft_probs [B, K, g, V] float32 (q^k_i, warped).
    """
    batch_size = decoding.shape[0]
    # The pending input and any staged prompt go in once per row, not once per path.
    first_logits = draft.feed_pending(decoding)  # [B, V]
    forks = path_rows(batch_size, num_paths, draft.device)
    draft.update_rows(forks, [])
    if isinstance(params, RowSampling):
        params = params.select(forks.tolist())
    draft_ids, draft_probs, _ = draft_from_logits(
        draft.runner,
        first_logits[forks],
        g,
        params,
        draft_uniforms.reshape(batch_size * num_paths, g),
        to_sampled,
    )
    return draft_ids.view(batch_size, num_paths, g), draft_probs.view(batch_size, num_paths, g, -1)


def feed_staged_prompts(runner: ModelRunner, max_staged: int | None) -> None:
    """Feed each row's next staged prompt chunk (at most max_staged tokens) in a forward of its own,
    so that forking does not feed it K times. No-op when nothing is staged."""
    if not any(runner.num_staged_tokens()):
        return
    # One masked placeholder slot carries the forward (forward_tokens appends the caller's tokens
    # after the staged ones); rolled back at once, so it leaves no hole.
    placeholder = torch.zeros(runner.batch_size, 1, dtype=torch.long, device=runner.device)
    runner.forward_tokens(placeholder, torch.zeros_like(placeholder), num_logits=1, max_staged=max_staged)
    runner.rollback(torch.zeros(runner.batch_size, dtype=torch.long, device=runner.device), 1)


def score_paths(
    target: TargetSide, draft_ids: torch.Tensor, decoding: torch.Tensor, max_staged: int | None
) -> torch.Tensor:
    """Fork the target side K ways and score every path in one forward; leaves it forked to B*K rows.

    Args:
        draft_ids: [B, K, g] long; decoding: [B] bool; max_staged: engine.prefill_chunk_tokens.
    Returns:
        target_logits [B, K, g+1, V] (unwarped; meaningless for rows not decoding).
    """
    batch_size, num_paths, g = draft_ids.shape
    feed_staged_prompts(target.runner, max_staged)
    forks = path_rows(batch_size, num_paths, target.device)
    target.update_rows(forks, [])
    # max_staged=0: a prompt longer than a chunk keeps its rest staged, fed in later steps.
    logits = target.score(draft_ids.reshape(batch_size * num_paths, g), decoding.to(target.device)[forks], 0)
    return logits.view(batch_size, num_paths, g + 1, -1)


def verify_paths_from_logits(
    method: str,
    sampling: Sampling,
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    eta: torch.Tensor,
    u: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Warp the target logits as the draft's were, then verify_paths.

    Args:
        draft_ids: [B, K, g]; draft_probs: [B, K, g, V] (None: greedy, which never reads q);
        target_logits: [B, K, g+1, V];
        num_draft_tokens: [B]; eta: [B, K, >= g] float64; u: [B] float64.
    Returns:
        accepted_counts [B], next_tokens [B], path_indices [B] (long).
    """
    device = target_logits.device
    g = draft_ids.shape[2]
    uniforms = MultiPathUniforms(eta=eta[:, :, :g].to(device), u=u.to(device))
    target_probs = logits_to_probs(target_logits, sampling)
    verified = verify_paths(
        method, draft_ids, draft_probs, target_probs, num_draft_tokens.to(device), uniforms
    )
    return verified.accepted_counts, verified.next_tokens, verified.path_indices


def commit_target_paths(
    target: TargetSide,
    accepted_counts: torch.Tensor,
    next_tokens: torch.Tensor,
    path_indices: torch.Tensor,
    decoding: torch.Tensor,
    num_paths: int,
    g: int,
) -> None:
    """Step 4 on the target side: roll back the B*K forked rows, keep the kept paths' B.

    Args:
        accepted_counts, next_tokens, path_indices: [B] long; decoding: [B] bool; g: the block width.
    """
    target.commit(*fork_verdict(num_paths, accepted_counts, next_tokens, decoding), g)
    target.update_rows(kept_path_rows(path_indices, num_paths).to(target.device), [])


def commit_draft_paths(
    draft: DraftSide,
    draft_ids: torch.Tensor,
    accepted_counts: torch.Tensor,
    next_tokens: torch.Tensor,
    path_indices: torch.Tensor,
    decoding: torch.Tensor,
) -> None:
    """Step 4 on the draft side: roll back the B*K forked rows, keep the kept paths' B.

    Args:
        draft_ids: [B, K, g] (the paths propose_paths drew); accepted_counts, next_tokens,
        path_indices: [B] long; decoding: [B] bool.
    """
    batch_size, num_paths, g = draft_ids.shape
    verdict = fork_verdict(num_paths, accepted_counts, next_tokens, decoding)
    draft.commit(draft_ids.reshape(batch_size * num_paths, g), *verdict)
    draft.update_rows(kept_path_rows(path_indices, num_paths).to(draft.device), [])


def fork_verdict(
    num_paths: int, accepted_counts: torch.Tensor, next_tokens: torch.Tensor, decoding: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's verdict for each of its K forked rows: accepted_counts, next_tokens [B*K] long and
    decoding [B*K] bool (on accepted_counts' device), from the same [B] tensors.

    Every path of a row rolls back with the row's tau: right for the kept path, whose first tau
    tokens are the accepted ones; the other paths' rows are dropped right after. Rolling back before
    dropping keeps each row's slot layout consistent (dropping rows may compact)."""
    device = accepted_counts.device
    forks = path_rows(accepted_counts.shape[0], num_paths, device)
    return accepted_counts[forks], next_tokens.to(device)[forks], decoding.to(device)[forks]


def kept_blocks(draft_ids: torch.Tensor, path_indices: torch.Tensor) -> torch.Tensor:
    """draft_ids [B, K, g], path_indices [B] long -> the kept path's block [B, g] (what the scheduler
    appends tau of)."""
    rows = torch.arange(draft_ids.shape[0], device=draft_ids.device)
    return draft_ids[rows, path_indices.to(draft_ids.device)]


def run_multipath_step(
    target: TargetSide,
    draft: DraftSide,
    method: str,
    sampling: Sampling,
    plan: StepPlan,
    section: Callable[[str], AbstractContextManager],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Steps 1-4 of the module docstring for one StepPlan with plan.num_paths = K > 1 and g > 0
    (rows already updated). section(name) times the "draft", "target" and "verify" parts.

    Returns:
        accepted_counts [B], next_tokens [B], the kept blocks [B, g] (long, on the target's device).
    """
    decoding = plan.decoding.to(target.device)
    with section("draft"):
        draft_ids, draft_probs = propose_paths(
            draft, plan.g, plan.num_paths, sampling, plan.draft_uniforms, decoding
        )
    with section("target"):
        target_logits = score_paths(target, draft_ids.to(target.device), decoding, plan.prefill_chunk_tokens)
    with section("verify"):
        accepted_counts, next_tokens, path_indices = verify_paths_from_logits(
            method,
            sampling,
            draft_ids.to(target.device),
            draft_probs.to(target.device),
            target_logits,
            plan.num_draft_tokens,
            plan.eta,
            plan.u,
        )
        commit_target_paths(
            target, accepted_counts, next_tokens, path_indices, decoding, plan.num_paths, plan.g
        )
        commit_draft_paths(draft, draft_ids, accepted_counts, next_tokens, path_indices, decoding)
    return accepted_counts, next_tokens, kept_blocks(draft_ids, path_indices)
