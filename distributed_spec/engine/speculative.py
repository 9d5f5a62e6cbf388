"""SpeculativeEngine: the single-process reference loop (batched speculative and autoregressive decoding).

    from distributed_spec.engine import EngineConfig, SpeculativeEngine
    results = SpeculativeEngine(target_model, draft_model, EngineConfig(method="block", gamma=4)).generate(
        [[1, 2, 3], [4, 5]]
    )

Per batch: stage prompt[:-1] in both runners (the last prompt token is the first pending Y; the staged
tokens go through each model with its first forward of the first iteration, so a batch costs no
separate prefill call), then iterate propose -> score -> verify -> commit (steps.py) until every row
has finished. Rows finish on an EOS id, a stop string or max_new_tokens, and are then dropped from
both caches. Every generated
token comes out of a decoding iteration, so block efficiency = tokens / (row, target call) pairs.
The "autoregressive" method is the same loop with g = 0 and no draft: the baseline.

Randomness: one torch.Generator seeded from EngineConfig.seed per `generate` call; per iteration the
draft's sampling uniforms [B, g] are drawn first, then `draw_uniforms(B, g)` for the verifier.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from distributed_spec.engine.config import EngineConfig, GenerationResult, RowStats, RunStats
from distributed_spec.engine.draft_length import adapt_draft_lengths, plan_step
from distributed_spec.engine.runner import ModelRunner
from distributed_spec.engine.steps import (
    commit_draft,
    commit_target,
    propose,
    sample_autoregressive,
    score,
)
from distributed_spec.verify import VerifyUniforms, draw_uniforms, verify_logits

logger = logging.getLogger(__name__)


class _Stopwatch:
    """Accumulates wall-clock seconds per section; synchronises CUDA so times are not just launches."""

    def __init__(self, device: torch.device) -> None:
        self.sync = device.type == "cuda"
        self.seconds: dict[str, float] = {"draft": 0.0, "target": 0.0, "verify": 0.0}

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        if self.sync:
            # Host sync: without it the clock measures kernel launches, not their execution.
            torch.cuda.synchronize()
        start = time.perf_counter()
        yield
        if self.sync:
            torch.cuda.synchronize()
        self.seconds[name] += time.perf_counter() - start


@dataclass
class _Batch:
    """Host-side state of one batch being decoded; per-row tensors hold the active rows only."""

    # Active row i is prompt rows[i] of the batch; finished rows leave every per-row tensor.
    rows: list[int]
    budgets: list[int]
    # Each prompt row's draft block length g for its next iteration (draft_length.py).
    gammas: list[int]
    outputs: list[list[int]]
    finish_reasons: list[str | None]
    row_stats: list[RowStats]
    # [B] Y: the last kept token of each active row, in neither cache yet.
    last_ids: torch.Tensor
    # [B, k] / [B, k]: the draft's pending input ([X_g or padding, Y] after the first iteration).
    draft_input_ids: torch.Tensor
    draft_input_mask: torch.Tensor

    @classmethod
    def start(cls, prompts: list[list[int]], budgets: list[int], gamma: int, device: torch.device) -> _Batch:
        last_ids = torch.tensor([prompt[-1] for prompt in prompts], dtype=torch.long, device=device)
        return cls(
            rows=list(range(len(prompts))),
            budgets=budgets,
            gammas=[gamma] * len(prompts),
            outputs=[[] for _ in prompts],
            finish_reasons=[None] * len(prompts),
            row_stats=[RowStats() for _ in prompts],
            last_ids=last_ids,
            draft_input_ids=last_ids[:, None],
            draft_input_mask=torch.ones_like(last_ids[:, None]),
        )


@dataclass
class _StepResult:
    """One iteration's outcome per active row, on the host."""

    accepted_counts: list[int]
    draft_ids: list[list[int]]
    num_draft_tokens: list[int]
    next_tokens: list[int]


def _model_context(model: PreTrainedModel) -> int | None:
    return getattr(model.config, "max_position_embeddings", None)


def _model_name(model: PreTrainedModel) -> str:
    return getattr(model, "name_or_path", "") or type(model).__name__


class SpeculativeEngine:
    """Batched speculative decoding of `target` with `draft` (draft may be None for "autoregressive")."""

    def __init__(
        self,
        target: PreTrainedModel,
        draft: PreTrainedModel | None,
        config: EngineConfig,
        tokenizer=None,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.target_runner = ModelRunner(target, config.compact_fraction)
        self.draft_runner: ModelRunner | None = None
        self.device = self.target_runner.device
        if config.uses_draft:
            if draft is None:
                raise ValueError(
                    f"engine.method={config.method!r} needs a draft model; set engine.method=autoregressive "
                    "to decode with the target alone"
                )
            self.draft_runner = ModelRunner(draft, config.compact_fraction)
            if self.draft_runner.vocab_size != self.target_runner.vocab_size:
                raise ValueError(
                    f"draft {_model_name(draft)!r} has vocabulary size {self.draft_runner.vocab_size} but target "
                    f"{_model_name(target)!r} has {self.target_runner.vocab_size}: pick a draft that shares "
                    "the target's tokenizer"
                )
            if self.draft_runner.device != self.device:
                raise ValueError(
                    f"draft is on {self.draft_runner.device} but target is on {self.device}: "
                    "set both models' device to the same value"
                )
        contexts = [_model_context(target)] + ([_model_context(draft)] if config.uses_draft else [])
        known = [context for context in contexts if context]
        self.max_context = min(known) if known else None

    def generate(self, prompts_token_ids: Sequence[Sequence[int]], tokenizer=None) -> list[GenerationResult]:
        """Generate for every prompt (token ids); results are in prompt order."""
        return self.generate_with_stats(prompts_token_ids, tokenizer)[0]

    def generate_with_stats(
        self, prompts_token_ids: Sequence[Sequence[int]], tokenizer=None
    ) -> tuple[list[GenerationResult], RunStats]:
        """Like `generate`, also returning the statistics of the whole run (all batches)."""
        tokenizer = tokenizer or self.tokenizer
        if self.config.stop_strings and tokenizer is None:
            raise ValueError(
                "engine.stop_strings needs a tokenizer: pass tokenizer= or clear engine.stop_strings"
            )
        prompts = [list(map(int, prompt)) for prompt in prompts_token_ids]
        budgets = self._check_prompts(prompts)
        generator = torch.Generator().manual_seed(self.config.seed)
        results: list[GenerationResult] = []
        stats = RunStats(gamma=self.config.gamma_limit)
        batch_size = self.config.max_batch_size
        for start in range(0, len(prompts), batch_size):
            batch_results, batch_stats = self._generate_batch(
                prompts[start : start + batch_size], budgets[start : start + batch_size], generator, tokenizer
            )
            results.extend(batch_results)
            stats = stats.merge(batch_stats)
        return results, stats

    def _check_prompts(self, prompts: list[list[int]]) -> list[int]:
        return prompt_budgets(prompts, self.target_runner.vocab_size, self.max_context, self.config.max_new_tokens)

    def _start(self, prompts: list[list[int]]) -> None:
        """Stage prompt[:-1] in both runners; the last prompt token is each row's first Y."""
        for runner in (self.target_runner, self.draft_runner):
            if runner is not None:
                runner.start([prompt[:-1] for prompt in prompts])

    def _generate_batch(
        self,
        prompts: list[list[int]],
        budgets: list[int],
        generator: torch.Generator,
        tokenizer,
    ) -> tuple[list[GenerationResult], RunStats]:
        """Decode one batch to the end: stage the prompts, then step / record / drop finished rows until none
        is left."""
        gamma_limit = self.config.gamma_limit
        stats = RunStats(
            gamma=gamma_limit,
            num_proposed_per_position=[0] * gamma_limit,
            num_accepted_per_position=[0] * gamma_limit,
        )
        watch = _Stopwatch(self.device)
        start_time = time.perf_counter()
        self._start(prompts)
        target_calls_before = self.target_runner.num_forward_calls
        draft_calls_before = self.draft_runner.num_forward_calls if self.draft_runner else 0
        batch = _Batch.start(prompts, budgets, self.config.gamma, self.device)
        while batch.rows:
            if self.config.uses_draft:
                step = self._speculative_step(batch, generator, watch)
            else:
                step = self._autoregressive_step(batch, generator, watch)
            keep = self._record(batch, step, stats, tokenizer)
            if len(keep) < len(batch.rows):
                self._drop_finished(batch, keep)

        stats.num_target_calls = self.target_runner.num_forward_calls - target_calls_before
        if self.draft_runner is not None:
            stats.num_draft_calls = self.draft_runner.num_forward_calls - draft_calls_before
        stats.total_s = time.perf_counter() - start_time
        stats.draft_s, stats.target_s, stats.verify_s = (watch.seconds[name] for name in ("draft", "target", "verify"))
        stats.other_s = stats.total_s - stats.draft_s - stats.target_s - stats.verify_s
        stats.num_tokens = sum(len(output) for output in batch.outputs)
        results = []
        for output, reason, row_stats in zip(batch.outputs, batch.finish_reasons, batch.row_stats):
            row_stats.num_tokens = len(output)
            results.append(GenerationResult(token_ids=output, finish_reason=reason, stats=row_stats))
        return results, stats

    def _speculative_step(self, batch: _Batch, generator: torch.Generator, watch: _Stopwatch) -> _StepResult:
        """propose -> score -> verify -> commit for every active row."""
        config = self.config
        remaining = [batch.budgets[row] - len(batch.outputs[row]) for row in batch.rows]
        step_gamma, planned = plan_step([batch.gammas[row] for row in batch.rows], remaining)
        draft_uniforms = torch.rand(len(batch.rows), step_gamma, generator=generator, dtype=torch.float64)
        uniforms = draw_uniforms(len(batch.rows), step_gamma, generator)
        with watch.section("draft"):
            draft_ids, draft_probs, num_drafted = propose(
                self.draft_runner,
                batch.draft_input_ids,
                batch.draft_input_mask,
                step_gamma,
                config.sampling,
                draft_uniforms,
                confidence_threshold=config.draft_confidence_threshold,
            )
        # A confidence stop may end the block early: g' <= step_gamma columns, n[b] <= g' per row.
        block_gamma = draft_ids.shape[1]
        num_draft_tokens = torch.minimum(torch.tensor(planned, device=self.device), num_drafted)  # [B]
        uniforms = VerifyUniforms(eta=uniforms.eta[:, :block_gamma].to(self.device), u=uniforms.u.to(self.device))
        with watch.section("target"):
            target_logits = score(self.target_runner, batch.last_ids, draft_ids)
        with watch.section("verify"):
            verified = verify_logits(
                config.method, draft_ids, draft_probs, target_logits, num_draft_tokens, uniforms, config.sampling
            )
        commit_target(self.target_runner, verified.accepted_counts, block_gamma)
        batch.draft_input_ids, batch.draft_input_mask = commit_draft(
            self.draft_runner, draft_ids, verified.accepted_counts, verified.next_tokens
        )
        batch.last_ids = verified.next_tokens
        # Host sync: the emitted tokens are needed on the host to check EOS, stop strings and length.
        step = _StepResult(
            accepted_counts=verified.accepted_counts.tolist(),
            draft_ids=draft_ids.tolist(),
            num_draft_tokens=num_draft_tokens.tolist(),
            next_tokens=verified.next_tokens.tolist(),
        )
        if config.gamma_schedule == "adaptive":
            adapt_draft_lengths(
                batch.gammas, batch.rows, step.accepted_counts, step.num_draft_tokens, config.max_gamma
            )
        return step

    def _autoregressive_step(
        self, batch: _Batch, generator: torch.Generator, watch: _Stopwatch
    ) -> _StepResult:
        """The baseline through the same verbs: score [Y] alone (g = 0) and sample from p_1."""
        num_rows = len(batch.rows)
        uniforms = draw_uniforms(num_rows, 0, generator)
        no_draft_ids = torch.zeros(num_rows, 0, dtype=torch.long, device=self.device)
        with watch.section("target"):
            target_logits = score(self.target_runner, batch.last_ids, no_draft_ids)
        with watch.section("verify"):
            batch.last_ids = sample_autoregressive(target_logits, uniforms.u, self.config.sampling)
        # Host sync: the emitted tokens are needed on the host to check EOS, stop strings and length.
        return _StepResult(
            accepted_counts=[0] * num_rows,
            draft_ids=[[] for _ in range(num_rows)],
            num_draft_tokens=[0] * num_rows,
            next_tokens=batch.last_ids.tolist(),
        )

    def _record(self, batch: _Batch, step: _StepResult, stats: RunStats, tokenizer) -> list[int]:
        """Append each row's emitted tokens, update the statistics; return the indices of unfinished rows."""
        stats.num_row_iterations += len(batch.rows)
        keep = []
        for index, row in enumerate(batch.rows):
            tau = step.accepted_counts[index]
            for position in range(step.num_draft_tokens[index]):
                stats.num_proposed_per_position[position] += 1
                stats.num_accepted_per_position[position] += int(position < tau)
            batch.row_stats[row].num_iterations += 1
            batch.row_stats[row].num_accepted += tau
            emitted = step.draft_ids[index][:tau] + [step.next_tokens[index]]
            batch.finish_reasons[row] = append_tokens(
                batch.outputs[row], emitted, batch.budgets[row], self.config, tokenizer
            )
            if batch.finish_reasons[row] is None:
                keep.append(index)
        return keep

    def _drop_finished(self, batch: _Batch, keep: list[int]) -> None:
        """Remove finished rows from both caches and the batch state: they stop costing work."""
        keep_index = torch.tensor(keep, dtype=torch.long, device=self.device)
        for runner in (self.target_runner, self.draft_runner):
            if runner is not None:
                runner.drop_rows(keep_index)
        batch.last_ids = batch.last_ids[keep_index]
        batch.draft_input_ids = batch.draft_input_ids[keep_index]
        batch.draft_input_mask = batch.draft_input_mask[keep_index]
        batch.rows = [batch.rows[index] for index in keep]


def prompt_budgets(
    prompts: list[list[int]], vocab_size: int, max_context: int | None, max_new_tokens: int
) -> list[int]:
    """Validate prompts; return each row's token budget (max_new_tokens, clipped to the context).

    The Ray coordinator checks its prompts with this same function.
    """
    budgets = []
    for index, prompt in enumerate(prompts):
        if not prompt:
            raise ValueError(f"prompt {index} is empty: every prompt needs at least one token id")
        if min(prompt) < 0 or max(prompt) >= vocab_size:
            raise ValueError(f"prompt {index} has token ids outside [0, {vocab_size}) (the model's vocabulary)")
        budget = max_new_tokens
        if max_context is not None:
            if len(prompt) >= max_context:
                raise ValueError(
                    f"prompt {index} has {len(prompt)} tokens, the model context is {max_context}: "
                    "shorten the prompt (or pick a model with a longer max_position_embeddings)"
                )
            if len(prompt) + budget > max_context:
                logger.warning(
                    "prompt %d: %d tokens + engine.max_new_tokens=%d exceed the context %d; "
                    "generating at most %d tokens",
                    index,
                    len(prompt),
                    budget,
                    max_context,
                    max_context - len(prompt),
                )
                budget = max_context - len(prompt)
        budgets.append(budget)
    return budgets


def append_tokens(
    output: list[int], new_tokens: list[int], budget: int, config: EngineConfig, tokenizer
) -> str | None:
    """Append one iteration's tokens to a row's output; return its finish reason, or None.

    Stops at EOS (kept as the last token), at the budget, or at a stop string (the output is cut
    right after it). The Ray coordinator finishes rows with this same function.
    """
    start = len(output)
    reason = None
    for token_id in new_tokens:
        output.append(token_id)
        if token_id in config.eos_token_ids:
            reason = "eos"
            break
        if len(output) >= budget:
            reason = "length"
            break
    if config.stop_strings:
        num_kept = _stop_string_cut(output, start, tokenizer, config.stop_strings)
        if num_kept is not None:
            del output[num_kept:]
            return "stop"
    return reason


def _stop_string_cut(output: list[int], start: int, tokenizer, stop_strings: tuple[str, ...]) -> int | None:
    """The shortest prefix length > start whose text contains a stop string, or None if none does."""
    if not any(stop in tokenizer.decode(output) for stop in stop_strings):
        return None
    for num_kept in range(start + 1, len(output) + 1):
        text = tokenizer.decode(output[:num_kept])
        if any(stop in text for stop in stop_strings):
            return num_kept
    return len(output)
