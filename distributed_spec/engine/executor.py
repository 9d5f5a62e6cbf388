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
from distributed_spec.engine.runner import ModelRunner
from distributed_spec.engine.sides import DraftSide, TargetSide
from distributed_spec.engine.steps import sample_autoregressive
from distributed_spec.verify import SamplingParams, VerifyUniforms, verify_logits


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
    gamma: int
    # [B] long in [0, gamma]: draft tokens each row verifies (0 for rows not decoding).
    num_draft_tokens: torch.Tensor
    # [B, gamma] float64: the draft's sampling uniforms; [B, gamma] eta and [B] u: the verifier's.
    # With num_paths = K > 1: draft_uniforms and eta are [B, K, gamma] (one row per path).
    draft_uniforms: torch.Tensor
    eta: torch.Tensor
    u: torch.Tensor
    # Prompt tokens the target feeds per row at most in this step (engine.prefill_chunk_tokens).
    prefill_chunk_tokens: int | None = None
    # Prompt tokens of the longest chunk fed in this step (0: no row is taking in its prompt).
    max_prefill_tokens: int = 0
    # The next step's gamma if every row keeps its whole block (what a draft may propose ahead).
    next_gamma_guess: int = 0
    # K draft paths per row (multipath_step.py); 1: one path.
    num_paths: int = 1

    @property
    def num_rows(self) -> int:
        return int(self.decoding.shape[0])


@dataclass
class StepOutcome:
    """What one step produced, per row of the plan (values of rows not decoding are meaningless)."""

    # [B] long: tau, accepted draft tokens.
    accepted_counts: torch.Tensor
    # [B] long: Y, the correction or bonus token.
    next_tokens: torch.Tensor
    # [B, gamma] long: the verified block.
    draft_ids: torch.Tensor
    # [B] long: draft tokens each row verified (the plan's, or fewer after a confidence stop).
    num_draft_tokens: torch.Tensor
    # Seconds: draft proposal, target forward, verification (+ cache rollback).
    draft_s: float = 0.0
    target_s: float = 0.0
    verify_s: float = 0.0
    # Draft forward calls so far (cumulative) and target forward calls so far.
    num_draft_calls: int = 0
    num_target_calls: int = 0
    # Runtime-specific additive counters (the Ray runtime's transfer time, wire bytes, ...).
    extra: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class DecodeOptions:
    """How the models' outputs are turned into tokens; fixed for a run."""

    # Verifier: "block", "token", "greedy", or "autoregressive" (no draft).
    method: str
    sampling: SamplingParams
    draft_confidence_threshold: float = 0.0


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
    sampling: SamplingParams,
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
        num_draft_tokens: [B]; eta: [B, >= g] float64; u: [B] float64.
    Returns:
        accepted_counts [B] long, next_tokens [B] long.
    """
    device = target_logits.device
    gamma = draft_ids.shape[1]
    if gamma == 0:
        next_tokens = sample_autoregressive(target_logits, u.to(device), sampling)
        return torch.zeros_like(next_tokens), next_tokens
    uniforms = VerifyUniforms(eta=eta[:, :gamma].to(device), u=u.to(device))
    verified = verify_logits(
        method, draft_ids, draft_probs, target_logits, num_draft_tokens.to(device), uniforms, sampling
    )
    return verified.accepted_counts, verified.next_tokens


class LocalExecutor:
    """Both models in this process: a TargetSide and (unless autoregressive) a DraftSide."""

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

    def execute(self, plan: StepPlan) -> StepOutcome:
        options = self.options
        watch = _Stopwatch(self.device)
        self.target.update_rows(plan.keep_rows, plan.new_prompts)
        if self.draft is not None:
            self.draft.update_rows(plan.keep_rows, plan.new_prompts)
        if plan.num_paths > 1 and plan.gamma > 0:
            accepted_counts, next_tokens, draft_ids = run_multipath_step(
                self.target, self.draft, options.method, options.sampling, plan, watch.section
            )
            return self._outcome(watch, accepted_counts, next_tokens, draft_ids, plan.num_draft_tokens)
        decoding = plan.decoding.to(self.device)
        num_draft_tokens = plan.num_draft_tokens.to(self.device)
        draft_probs = None
        if plan.gamma > 0:
            with watch.section("draft"):
                draft_ids, draft_probs, num_drafted = self.draft.propose(
                    plan.gamma,
                    options.sampling,
                    plan.draft_uniforms,
                    decoding,
                    confidence_threshold=options.draft_confidence_threshold,
                )
            # A confidence stop may end the block early: g' <= gamma columns, n[b] <= g' per row.
            num_draft_tokens = torch.minimum(num_draft_tokens, num_drafted)
        else:
            draft_ids = torch.zeros(plan.num_rows, 0, dtype=torch.long, device=self.device)
            if self.draft is not None:
                with watch.section("draft"):
                    self.draft.catch_up()
        with watch.section("target"):
            target_logits = self.target.score(draft_ids, decoding, plan.prefill_chunk_tokens)
        with watch.section("verify"):
            accepted_counts, next_tokens = verify_step(
                options.method,
                options.sampling,
                draft_ids,
                draft_probs,
                target_logits,
                num_draft_tokens,
                plan.eta,
                plan.u,
            )
            self.target.commit(accepted_counts, next_tokens, decoding, draft_ids.shape[1])
            if self.draft is not None:
                self.draft.commit(draft_ids, accepted_counts, next_tokens, decoding)
        return self._outcome(watch, accepted_counts, next_tokens, draft_ids, num_draft_tokens)

    def _outcome(
        self,
        watch: _Stopwatch,
        accepted_counts: torch.Tensor,
        next_tokens: torch.Tensor,
        draft_ids: torch.Tensor,
        num_draft_tokens: torch.Tensor,
    ) -> StepOutcome:
        return StepOutcome(
            # Host copies: the scheduler reads the tokens to finish rows (EOS, stop strings, length).
            accepted_counts=accepted_counts.cpu(),
            next_tokens=next_tokens.cpu(),
            draft_ids=draft_ids.cpu(),
            num_draft_tokens=num_draft_tokens.cpu(),
            draft_s=watch.seconds.get("draft", 0.0),
            target_s=watch.seconds.get("target", 0.0),
            verify_s=watch.seconds.get("verify", 0.0),
            num_draft_calls=self.draft.runner.num_forward_calls if self.draft is not None else 0,
            num_target_calls=self.target.runner.num_forward_calls,
        )
