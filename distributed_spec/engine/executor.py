"""What runs the model work of one step: the `Executor` interface and the in-process `LocalExecutor`.

    from distributed_spec.engine.executor import LocalExecutor, StepPlan, StepOutcome

The scheduler (scheduler.py) decides, every step, which rows run, which join, how many draft tokens
each verifies and which uniforms it uses, and hands that over as a `StepPlan`; an executor runs the
draft and the target on it and answers a `StepOutcome`. `LocalExecutor` runs both models in this
process; the Ray runtime's executor (distributed/coordinator.py) runs the same sides (sides.py) in
the draft actor and the target shards. The scheduler is the only loop: a feature written there
works in both runtimes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import torch

from distributed_spec.engine.multipath_step import run_multipath_step
from distributed_spec.engine.proposers import combine_blocks
from distributed_spec.engine.runner import ModelRunner
from distributed_spec.engine.sides import DraftSide, TargetSide
from distributed_spec.engine.steps import sample_autoregressive
from distributed_spec.verify import RowSampling, VerifyUniforms, verify_logits


@dataclass
class StepPlan:
    """One step as the scheduler decided it (the executor's whole input)."""

    # [B_prev'] long: rows of the previous step that stay, in order; None keeps all.
    keep_rows: torch.Tensor | None
    # Prompts of the rows that join the batch after the kept ones (their prompt[:-1] is staged).
    new_prompts: list[list[int]]
    # [B] bool: rows whose whole prompt has gone (or goes now) through the target; only these verify.
    decoding: torch.Tensor
    # Draft tokens proposed per row (the widest row's count); 0 = an autoregressive step, no draft.
    g: int
    # [B] long in [0, g]: draft tokens each row verifies (0 for rows not decoding).
    num_draft_tokens: torch.Tensor
    # [B, g] float64: the draft's sampling uniforms; [B, g] eta and [B] u: the verifier's.
    # With num_paths = K > 1: draft_uniforms and eta are [B, K, g] (one row per path).
    draft_uniforms: torch.Tensor
    eta: torch.Tensor
    u: torch.Tensor
    # Each row's sampling settings (its request's): draft and target warp row b with rows[b].
    sampling: RowSampling
    # Prompt tokens the target feeds per row at most in this step (engine.prefill_chunk_tokens).
    prefill_chunk_tokens: int | None = None
    # What the step's prompt chunks cost the target's shared forward, in padded slots: rows x the
    # longest chunk fed (a chunk pads every row of the forward to its length; 0: no row is taking in
    # its prompt). `_apart`: the same count when the joining rows' first chunks go through a forward
    # of their own (runner.py), which is timed apart. The goodput schedule prices prompts per slot.
    num_prompt_slots: int = 0
    num_prompt_slots_apart: int = 0
    # The next step's g if every row keeps its whole block (what a draft may propose ahead).
    next_g_guess: int = 0
    # The n-gram proposer's blocks (proposers.py), None when it does not run: [B, w] long, each
    # row's proposal first (zeros past it), and [B] bool, the decoding rows whose block it is.
    ngram_ids: torch.Tensor | None = None
    from_ngram: torch.Tensor | None = None
    # Tokens the draft model drafts (the longest block of its own rows; 0: it does not run); None:
    # g (every proposing row is the model's).
    model_g: int | None = None
    # K draft paths per row (multipath_step.py); 1: one path.
    num_paths: int = 1
    # [B] bool: the only rows the draft model feeds and drafts for in this step (a goodput probe
    # measures a longer block with a few rows, so the draft catches up those rows alone); the others
    # verify no draft (num_draft_tokens 0). None: every row.
    draft_rows: torch.Tensor | None = None

    @property
    def num_rows(self) -> int:
        return int(self.decoding.shape[0])

    @property
    def num_model_drafts(self) -> int:
        """Tokens the draft model drafts in this step (0: it does not run)."""
        return self.g if self.model_g is None else self.model_g


@dataclass
class StepOutcome:
    """What one step produced, per row of the plan (values of rows not decoding are meaningless)."""

    # [B] long: tau, accepted draft tokens.
    accepted_counts: torch.Tensor
    # [B] long: Y, the correction or bonus token.
    next_tokens: torch.Tensor
    # [B, g] long: the verified block.
    draft_ids: torch.Tensor
    # [B] long: draft tokens each row verified (the plan's, or fewer after a confidence stop).
    num_draft_tokens: torch.Tensor
    # Seconds: draft proposal, target forward, verification (+ cache rollback).
    draft_s: float = 0.0
    target_s: float = 0.0
    verify_s: float = 0.0
    # Of draft_s, the draft's forwards for this step's block (not its catch-up or prompts fed apart):
    # what a step of n-gram blocks alone would not spend (goodput prices those steps from it).
    draft_own_s: float = 0.0
    # Seconds and prompt tokens of the forwards that fed joining rows apart from the block
    # (ModelRunner.prefill_apart_s: target and draft) and of the draft's catch-up forwards
    # (DraftSide.catch_up_s): work owed by earlier steps, which the goodput schedule takes off.
    prefill_s: float = 0.0
    num_prefill_apart_tokens: int = 0
    # The draft's catch-up forwards in this step (already in prefill_s): seconds and tokens fed.
    catch_up_s: float = 0.0
    num_catch_up_tokens: int = 0
    # Draft forward calls so far (cumulative) and target forward calls so far.
    num_draft_calls: int = 0
    num_target_calls: int = 0
    # Runtime-specific additive counters (the Ray runtime's transfer time, wire bytes, ...).
    extra: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class DecodeOptions:
    """How the models' outputs are turned into tokens; fixed for a run."""

    # Verifier: "block", "token", "greedy", or "autoregressive" (no draft). Sampling settings are
    # per row and come with each step (StepPlan.sampling).
    method: str
    draft_confidence_threshold: float = 0.0
    # What proposes the blocks (proposers.py): "model", "ngram" or "model+ngram".
    proposer: str = "model"

    @property
    def uses_draft_model(self) -> bool:
        return self.method != "autoregressive" and self.proposer != "ngram"


class Executor(Protocol):
    """Runs the model work of the steps the scheduler plans."""

    # The target's vocabulary size (logits' width) and context length (None: unknown).
    vocab_size: int
    max_context: int | None

    def begin(self, options: DecodeOptions) -> None:
        """Start a run with an empty batch."""
        ...

    def execute(self, plan: StepPlan) -> StepOutcome:
        """Apply the plan's row changes, run one step, return its outcome."""
        ...


def is_out_of_memory(error: BaseException) -> bool:
    """A device out-of-memory error: torch's OutOfMemoryError raised here, or re-raised from an actor
    (Ray's `as_instanceof_cause` subclasses it; a cause that did not survive pickling keeps its text)."""
    return any(cls.__name__ == "OutOfMemoryError" for cls in type(error).__mro__) or (
        "CUDA out of memory" in str(error)
    )


class _Stopwatch:
    """Accumulates wall-clock seconds per section; synchronises CUDA so times are not just launches."""

    def __init__(self, device: torch.device) -> None:
        self.sync = device.type == "cuda"
        self.seconds: dict[str, float] = {}

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        if self.sync:
            # Host sync: without it the clock measures kernel launches, not their execution.
            torch.cuda.synchronize()
        start = time.perf_counter()
        yield
        if self.sync:
            torch.cuda.synchronize()
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


def verify_step(
    method: str,
    sampling: RowSampling,
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    eta: torch.Tensor,
    u: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify one step's blocks, or sample Y from p_1 when the step drafted nothing.

    Args:
        draft_ids: [B, g]; draft_probs: [B, g, V] (None when g = 0); target_logits: [B, g+1, V];
        num_draft_tokens: [B]; eta: [B, >= g] float64; u: [B] float64; sampling: each row's settings.
    Returns:
        accepted_counts [B] long, next_tokens [B] long.
    """
    device = target_logits.device
    g = draft_ids.shape[1]
    if g == 0:
        next_tokens = sample_autoregressive(target_logits, u.to(device), sampling)
        return torch.zeros_like(next_tokens), next_tokens
    uniforms = VerifyUniforms(eta=eta[:, :g].to(device), u=u.to(device))
    verified = verify_logits(
        method, draft_ids, draft_probs, target_logits, num_draft_tokens.to(device), uniforms, sampling
    )
    return verified.accepted_counts, verified.next_tokens


class LocalExecutor:
    """Both models in this process: a TargetSide and (unless no draft model runs) a DraftSide."""

    def __init__(self, target_runner: ModelRunner, draft_runner: ModelRunner | None) -> None:
        self.target = TargetSide(target_runner)
        self.draft = DraftSide(draft_runner) if draft_runner is not None else None
        self.device = target_runner.device
        self.vocab_size = target_runner.vocab_size
        self.max_context: int | None = None
        self.options: DecodeOptions | None = None

    def begin(self, options: DecodeOptions) -> None:
        self.options = options
        self.target.reset()
        if self.draft is not None:
            self.draft.reset()
        # A loaded draft sits idle while the run needs none (the baseline, n-gram blocks).
        self.active_draft = self.draft if options.uses_draft_model else None

    def execute(self, plan: StepPlan) -> StepOutcome:
        options = self.options
        watch = _Stopwatch(self.device)
        draft = self.active_draft
        prefill_before = self._prefill_counters()
        self.target.update_rows(plan.keep_rows, plan.new_prompts)
        if draft is not None:
            draft.update_rows(plan.keep_rows, plan.new_prompts)
        if draft is not None and plan.num_model_drafts > 0:
            with watch.section("draft"):
                # What the draft lags behind goes in first, timed apart (a debt of earlier steps).
                draft.catch_up(rows=plan.draft_rows)
        if plan.num_paths > 1 and plan.g > 0:
            accepted_counts, next_tokens, draft_ids = run_multipath_step(
                self.target, draft, options.method, plan.sampling, plan, watch.section
            )
            return self._outcome(watch, prefill_before, accepted_counts, next_tokens, draft_ids, plan.num_draft_tokens)
        decoding = plan.decoding.to(self.device)
        num_draft_tokens = plan.num_draft_tokens.to(self.device)
        draft_ids = torch.zeros(plan.num_rows, 0, dtype=torch.long, device=self.device)
        draft_probs = None
        num_model_drafts = plan.num_model_drafts
        draft_own_s = 0.0
        if num_model_drafts > 0:
            own_start, apart_before = time.perf_counter(), draft.runner.prefill_apart_s
            with watch.section("draft"):
                draft_ids, draft_probs, num_drafted = draft.propose(
                    num_model_drafts,
                    plan.sampling,
                    plan.draft_uniforms[:, :num_model_drafts],
                    decoding,
                    confidence_threshold=options.draft_confidence_threshold,
                    draft_rows=plan.draft_rows,
                )
            draft_own_s = time.perf_counter() - own_start - (draft.runner.prefill_apart_s - apart_before)
            # A confidence stop may end the block early: g' <= g columns, n[b] <= g' per row.
            num_drafted = num_drafted.to(self.device)
            if plan.from_ngram is not None:
                num_drafted = torch.where(plan.from_ngram.to(self.device), num_draft_tokens, num_drafted)
            num_draft_tokens = torch.minimum(num_draft_tokens, num_drafted)
            num_model_drafts = draft_ids.shape[1]
        elif draft is not None and plan.next_g_guess > 0:
            # Only when the next step is expected to draft: a run of autoregressive steps (goodput at a
            # large batch) leaves the draft idle, and a row that finishes before drafting never pays.
            with watch.section("draft"):
                draft.catch_up()
        if plan.from_ngram is not None and plan.g > 0:
            draft_ids, draft_probs = combine_blocks(
                plan.ngram_ids.to(self.device),
                plan.from_ngram,
                draft_ids if num_model_drafts > 0 else None,
                draft_probs,
                self.vocab_size,
            )
        with watch.section("target"):
            target_logits = self.target.score(draft_ids, decoding, plan.prefill_chunk_tokens)
        with watch.section("verify"):
            accepted_counts, next_tokens = verify_step(
                options.method,
                plan.sampling,
                draft_ids,
                draft_probs,
                target_logits,
                num_draft_tokens,
                plan.eta,
                plan.u,
            )
            self.target.commit(accepted_counts, next_tokens, decoding, draft_ids.shape[1])
            if draft is not None:
                draft.commit(
                    draft_ids,
                    accepted_counts,
                    next_tokens,
                    decoding,
                    plan.from_ngram,
                    num_model_drafts,
                    plan.draft_rows if num_model_drafts > 0 else None,
                )
        outcome = self._outcome(watch, prefill_before, accepted_counts, next_tokens, draft_ids, num_draft_tokens)
        outcome.draft_own_s = draft_own_s
        return outcome

    def _prefill_counters(self) -> tuple[float, int, float, int]:
        """Work owed by earlier steps so far: (seconds, target prompt tokens) fed apart, both models'
        prompt forwards apart and the draft's catch-up forwards (sides.DraftSide.catch_up) together,
        then the catch-up's own (seconds, tokens)."""
        seconds, catch_up_s, num_catch_up_tokens = self.target.runner.prefill_apart_s, 0.0, 0
        if self.active_draft is not None:
            catch_up_s, num_catch_up_tokens = self.active_draft.catch_up_s, self.active_draft.num_catch_up_tokens
            seconds += self.active_draft.runner.prefill_apart_s + catch_up_s
        return seconds, self.target.runner.num_prefill_apart_tokens, catch_up_s, num_catch_up_tokens

    def _outcome(
        self,
        watch: _Stopwatch,
        prefill_before: tuple[float, int, float, int],
        accepted_counts: torch.Tensor,
        next_tokens: torch.Tensor,
        draft_ids: torch.Tensor,
        num_draft_tokens: torch.Tensor,
    ) -> StepOutcome:
        prefill_s, num_prefill_tokens, catch_up_s, num_catch_up_tokens = (
            now - before for now, before in zip(self._prefill_counters(), prefill_before)
        )
        return StepOutcome(
            prefill_s=prefill_s,
            num_prefill_apart_tokens=int(num_prefill_tokens),
            catch_up_s=catch_up_s,
            num_catch_up_tokens=int(num_catch_up_tokens),
            # Host copies: the scheduler reads the tokens to finish rows (EOS, stop strings, length).
            accepted_counts=accepted_counts.cpu(),
            next_tokens=next_tokens.cpu(),
            draft_ids=draft_ids.cpu(),
            num_draft_tokens=num_draft_tokens.cpu(),
            draft_s=watch.seconds.get("draft", 0.0),
            target_s=watch.seconds.get("target", 0.0),
            verify_s=watch.seconds.get("verify", 0.0),
            num_draft_calls=self.active_draft.runner.num_forward_calls if self.active_draft is not None else 0,
            num_target_calls=self.target.runner.num_forward_calls,
        )
