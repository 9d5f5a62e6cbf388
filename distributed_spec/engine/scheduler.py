"""The one scheduling loop: admission, draft lengths, finishing and statistics, for either executor.

    from distributed_spec.engine.scheduler import Request, Scheduler
    scheduler = Scheduler(config, executor, tokenizer)
    for request in scheduler.run(requests):     # yields each request as it finishes
        print(request.key, request.output, request.finish_reason)
    scheduler.stats                              # RunStats of the run

Every step (vLLM v1's shape: the scheduler decides, the executor only runs the models):
1. admit: while fewer than `max_batch_size` rows run, the next request joins (continuous batching;
   `continuous_batching=False` admits only into an empty batch: static batches, for comparison).
   Its prompt goes through the target by chunks of `prefill_chunk_tokens`, in the same forwards as
   the other rows' blocks; a row decodes once its whole prompt is in.
2. draft lengths: the schedule (`EngineConfig.draft_len_schedule`) gives each decoding row its g, clipped
   so a row never verifies past its token budget, and to its n-gram proposal when the n-gram proposer
   serves it (proposers.py: it runs here, on token ids); the step drafts the longest (0: no draft).
3. uniforms: each row draws its own, from its own generator (seeded per request): draft uniforms
   [n], then the verifier's eta [n] and u ([K, n], [K, n] and u with K = num_paths > 1 draft
   paths). A row's tokens therefore never depend on which rows share its batch (up to
   floating-point ties) under any schedule that depends on the row's own history ("constant",
   "adaptive"); "goodput" picks g from timings, so its sampled draws follow its g.
   Each row also has its own sampling settings (temperature, top-k, top-p) and stop strings, the
   engine's unless its request sets them; the plan carries them to the executor row by row.
4. the executor runs the step (executor.py); the scheduler appends tau accepted drafts + Y per row,
   finishes rows (EOS, stop string, budget) and yields them, updates statistics and the schedule.
If the executor lost its batch (the Ray runtime restarted after a fault: `BatchLost`), every running
row joins again as a new row with prompt + the tokens it already has, its generator rewound to before
the failed step: the output is the one an uninterrupted run gives. A step that runs out of device
memory is retried the same way once per run with half its rows (the other half waits, unchanged, and
the run goes on at that batch size); a second one is raised to the caller.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import torch

from distributed_spec.engine.config import EngineConfig, RowStats, RunStats
from distributed_spec.engine.draft_length import next_draft_length
from distributed_spec.engine.executor import DecodeOptions, Executor, StepOutcome, StepPlan, is_out_of_memory
from distributed_spec.engine.goodput import GoodputPolicy, GoodputRow, RowAcceptance
from distributed_spec.engine.ngram import NgramProposer
from distributed_spec.engine.proposers import ngram_block
from distributed_spec.engine.stopping import StopChecker
from distributed_spec.verify import RowSampling, SamplingParams

logger = logging.getLogger(__name__)

# Value of a draft uniform in a column a row does not verify (any value in [0, 1) would do).
UNUSED_UNIFORM = 0.5


def request_seed(seed: int, key: Any) -> int:
    """The seed of a request's generator: a function of (the run's seed, the request's key) only, so a
    request draws the same uniforms in any batch, runtime or resumed run."""
    return zlib.crc32(f"{seed}\n{key}".encode()) & 0x7FFFFFFF


def draw_path_uniforms(
    rows: list[Request], num_draft_tokens: list[int], decoding: list[bool], g: int, num_paths: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each decoding row's uniforms for K paths of n drafts, from its own generator in one call: draft
    uniforms [K, n] (path by path), then eta [K, n], then u. Returns draft_uniforms [B, K, g], eta
    [B, K, g] float64 (UNUSED_UNIFORM / 1 past a row's n) and u [B]."""
    draft_uniforms = torch.full((len(rows), num_paths, g), UNUSED_UNIFORM, dtype=torch.float64)
    eta = torch.ones(len(rows), num_paths, g, dtype=torch.float64)
    u = torch.zeros(len(rows), dtype=torch.float64)
    for index, (request, num_drafts, on) in enumerate(zip(rows, num_draft_tokens, decoding)):
        if on:
            size = num_paths * num_drafts
            draws = torch.rand(2 * size + 1, generator=request.generator, dtype=torch.float64)
            draft_uniforms[index, :, :num_drafts] = draws[:size].view(num_paths, num_drafts)
            eta[index, :, :num_drafts] = draws[size : 2 * size].view(num_paths, num_drafts)
            u[index] = draws[-1]
    return draft_uniforms, eta, u


# A request source may yield this while rows are running to say "nothing to admit now, ask again
# next step" without ending the stream (a replica's work queue, jobs/replica_worker.py).
NOT_READY = object()


class BatchLost(RuntimeError):
    """The executor was rebuilt after a fault and holds no rows: the scheduler re-admits them."""


@dataclass
class Request:
    """One prompt being decoded, and everything the scheduler keeps about it."""

    # The caller's handle (an index, a record): returned untouched.
    key: Any
    prompt_ids: list[int]
    # Tokens it may generate (max_new_tokens clipped to the context).
    budget: int
    # Seeds this request's own torch.Generator (all its uniforms).
    seed: int
    # Its own sampling settings and stop strings; None: the engine's (EngineConfig).
    sampling: SamplingParams | None = None
    stop_strings: tuple[str, ...] | None = None
    output: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stats: RowStats = field(default_factory=RowStats)
    # Prompt tokens (of the sequence the executor was given, but its last) not yet fed to the target.
    num_prompt_left: int = 0
    # The draft tokens it verifies next under the "adaptive" schedule.
    num_draft_tokens: int = 0
    acceptance: RowAcceptance = field(default_factory=RowAcceptance)
    # Tokens of its sequence the draft model has not fed yet (it idles in steps without a draft and
    # catches up before it next drafts): what the goodput schedule prices drafting for this row at.
    draft_lag: int = 0
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        if self.generator is None:
            self.generator = torch.Generator().manual_seed(self.seed)

    @property
    def remaining(self) -> int:
        return self.budget - len(self.output)


class Scheduler:
    """Drives an executor over a stream of requests; see the module docstring."""

    # The clock that times steps for the goodput schedule (tests give a deterministic one).
    clock = staticmethod(time.perf_counter)

    def __init__(self, config: EngineConfig, executor: Executor, tokenizer=None) -> None:
        if config.sampling.stop and tokenizer is None:
            raise ValueError("sampling.stop needs a tokenizer: pass tokenizer= or clear the stop strings")
        self.config = config
        self.executor = executor
        self.tokenizer = tokenizer
        # One checker per distinct set of stop strings (the engine's, and the requests' own).
        stop = tuple(config.sampling.stop)
        self.stop_checkers = {stop: StopChecker(config.eos_token_ids, stop, tokenizer)}
        verifier = config.verifier
        goodput = verifier.uses_draft and verifier.draft_len_schedule == "goodput"
        self.goodput = GoodputPolicy(verifier.max_draft_len) if goodput else None
        self.ngram = NgramProposer(verifier.ngram_min, verifier.ngram_max) if verifier.uses_ngram else None
        self.stats = self._new_stats()
        # Tests: called with the step index after each step (e.g. to kill a shard).
        self.on_step = None

    def _new_stats(self) -> RunStats:
        max_num_draft_tokens = self.config.verifier.max_num_draft_tokens
        return RunStats(
            max_num_draft_tokens=max_num_draft_tokens,
            num_proposed_per_position=[0] * max_num_draft_tokens,
            num_accepted_per_position=[0] * max_num_draft_tokens,
            num_steps_per_draft_len=[0] * (max_num_draft_tokens + 1),
        )

    def options(self) -> DecodeOptions:
        return DecodeOptions(
            method=self.config.verifier.method,
            draft_confidence_threshold=self.config.verifier.draft_confidence_threshold,
            proposer=self.config.verifier.proposer,
        )

    def run(self, requests: Iterable[Request]) -> Iterator[Request]:
        """Decode every request; yields each one when it finishes (not in input order)."""
        config = self.config
        self.stats = self._new_stats()
        self.executor.begin(self.options())
        source = iter(requests)
        exhausted = False
        running: list[Request] = []
        keep_rows: torch.Tensor | None = None
        joining: list[Request] = []
        max_rows = config.max_batch_size  # halved once if a step runs out of memory
        start_time = time.perf_counter()
        try:
            while True:
                if config.scheduling.continuous_batching or not running:
                    while not exhausted and len(running) + len(joining) < max_rows:
                        request = next(source, None)
                        if request is None:
                            exhausted = True
                            break
                        if request is NOT_READY:
                            break
                        self._admit(request)
                        joining.append(request)
                rows = running + joining
                if not rows:
                    break
                step_start = self.clock()
                states = [request.generator.get_state() for request in rows]
                plan = self._plan(rows, keep_rows, joining)
                try:
                    outcome = self.executor.execute(plan)
                except Exception as error:
                    out_of_memory = is_out_of_memory(error)
                    if not isinstance(error, BatchLost) and not (
                        out_of_memory and max_rows == config.max_batch_size and len(rows) > 1
                    ):
                        raise
                    # Every row starts again from prompt + its tokens, its stream rewound: same output.
                    for request, state in zip(rows, states):
                        request.generator.set_state(state)
                        self._admit(request)
                    if out_of_memory:
                        max_rows = len(rows) // 2
                        logger.warning("out of memory at %d rows; going on with %d: %s", len(rows), max_rows, error)
                        # The other half goes back to the head of the queue.
                        rows, source, exhausted = rows[:max_rows], chain(rows[max_rows:], source), False
                    running, joining, keep_rows = [], rows, None
                    self.executor.begin(self.options())
                    continue
                finished = self._record(rows, plan, outcome)
                keep = [index for index, request in enumerate(rows) if request.finish_reason is None]
                keep_rows = None if len(keep) == len(rows) else torch.tensor(keep, dtype=torch.long)
                running, joining = [rows[index] for index in keep], []
                self._observe(rows, plan, outcome, self.clock() - step_start)
                if self.on_step is not None:
                    self.on_step(self.stats.num_target_calls)
                yield from finished
        finally:
            self.stats.total_s += time.perf_counter() - start_time
            stats = self.stats
            stats.other_s = stats.total_s - stats.draft_s - stats.target_s - stats.verify_s

    def _admit(self, request: Request) -> None:
        """(Re)join the batch: the executor gets prompt + output; all but its last token are staged."""
        if request.sampling is None:
            request.sampling = self.config.sampling.params
        self._stop_checker(request)
        request.num_prompt_left = len(request.prompt_ids) + len(request.output) - 1
        request.draft_lag = request.num_prompt_left
        if not request.num_draft_tokens:
            request.num_draft_tokens = self.config.verifier.num_draft_tokens

    def _stop_checker(self, request: Request) -> StopChecker:
        stop_strings = tuple(self.config.sampling.stop) if request.stop_strings is None else request.stop_strings
        checker = self.stop_checkers.get(stop_strings)
        if checker is None:
            if stop_strings and self.tokenizer is None:
                raise ValueError(f"request {request.key!r} has stop strings, which need a tokenizer: pass tokenizer=")
            checker = StopChecker(self.config.eos_token_ids, stop_strings, self.tokenizer)
            self.stop_checkers[stop_strings] = checker
        return checker

    def _plan(self, rows: list[Request], keep_rows: torch.Tensor | None, joining: list[Request]) -> StepPlan:
        config = self.config
        chunk = config.scheduling.prefill_chunk_tokens
        decoding = [chunk is None or request.num_prompt_left <= chunk for request in rows]
        prefill = [request.num_prompt_left if chunk is None else min(chunk, request.num_prompt_left) for request in rows]
        max_drafts = [max(request.remaining - 1, 0) if on else 0 for request, on in zip(rows, decoding)]
        proposals = self._ngram_proposals(rows, max_drafts)
        draft_rows = None
        if not config.verifier.uses_draft:
            scheduled_num_draft_tokens = [0] * len(rows)
        elif self.goodput is not None:
            proposals, scheduled_num_draft_tokens, draft_rows = self._goodput_step(rows, decoding, max_drafts, proposals)
        elif config.verifier.draft_len_schedule == "adaptive":
            scheduled_num_draft_tokens = [request.num_draft_tokens for request in rows]
        else:
            scheduled_num_draft_tokens = [config.verifier.num_draft_tokens] * len(rows)
        if proposals is not None and self.goodput is None:
            # A row the n-gram proposer serves can verify no more than it proposed; under "ngram" a
            # row without a match verifies none.
            max_drafts = [
                len(tokens) if tokens or config.verifier.proposer == "ngram" else limit
                for tokens, limit in zip(proposals, max_drafts)
            ]
        num_draft_tokens = [
            min(g, limit) if on else 0 for g, limit, on in zip(scheduled_num_draft_tokens, max_drafts, decoding)
        ]
        g = max(num_draft_tokens, default=0)
        ngram_ids = from_ngram = None
        model_g = g
        if proposals is not None:
            from_ngram = torch.tensor([bool(tokens) and n > 0 for tokens, n in zip(proposals, num_draft_tokens)])
            ngram_ids = ngram_block([tokens[:n] if on else [] for tokens, n, on in zip(proposals, num_draft_tokens, from_ngram.tolist())])
            model_g = max((n for n, on in zip(num_draft_tokens, from_ngram.tolist()) if not on), default=0)
        # K paths only in steps that draft (g = 0 is a plain decoding step, the same at every K).
        num_paths = config.verifier.num_paths if g > 0 else 1
        draft_uniforms, eta, u = draw_path_uniforms(rows, num_draft_tokens, decoding, g, num_paths)
        if num_paths == 1:
            # One path: [B, g] (the same draws in the same order as [B, 1, g]).
            draft_uniforms, eta = draft_uniforms[:, 0], eta[:, 0]
        return StepPlan(
            keep_rows=keep_rows,
            new_prompts=[request.prompt_ids + request.output for request in joining],
            decoding=torch.tensor(decoding, dtype=torch.bool),
            g=g,
            num_draft_tokens=torch.tensor(num_draft_tokens, dtype=torch.long),
            draft_uniforms=draft_uniforms,
            eta=eta,
            u=u,
            sampling=RowSampling(tuple(request.sampling for request in rows)),
            prefill_chunk_tokens=chunk,
            num_prompt_slots=len(rows) * max(prefill, default=0),
            # Joining rows are the last ones (rows = running + joining).
            num_prompt_slots_apart=len(rows) * max(prefill[: len(rows) - len(joining)], default=0),
            next_g_guess=self._next_g_guess(rows, scheduled_num_draft_tokens, num_draft_tokens, g),
            ngram_ids=ngram_ids,
            from_ngram=from_ngram,
            model_g=model_g if config.verifier.uses_draft_model else 0,
            num_paths=num_paths,
            draft_rows=None if draft_rows is None or model_g == 0 else torch.tensor(draft_rows, dtype=torch.bool),
        )

    def _goodput_step(
        self, rows: list[Request], decoding: list[bool], max_drafts: list[int], proposals: list[list[int]] | None
    ) -> tuple[list[list[int]] | None, list[int], list[bool] | None]:
        """The goodput schedule's step: the n-gram proposals it uses (a row served by the draft
        model this step gets []), each row's scheduled draft tokens, and the probe's drafting rows
        (None: every row). Each decoding row is offered with both of its limits: the draft model's
        (its budget) and its n-gram proposal's length, so goodput prices the two apart
        (engine/goodput.py: acceptance per proposer, and n-gram-only steps in cells of their own)."""
        config = self.config
        uses_model = config.verifier.uses_draft_model
        num_ngram = [len(tokens) for tokens in proposals] if proposals is not None else [0] * len(rows)
        candidates = [
            GoodputRow(limit if uses_model else 0, request.acceptance, ngram)
            for request, limit, ngram, on in zip(rows, max_drafts, num_ngram, decoding)
            if on
        ]
        debt_per_token = 0.0
        if uses_model:
            debt_per_token = sum(
                request.draft_lag / max(request.remaining, 1) for request, on in zip(rows, decoding) if on
            )
        g = self.goodput.choose_step(candidates, len(rows), debt_per_token)
        use_ngram = iter(self.goodput.ngram_rows(candidates, g))
        ngram_rows = [next(use_ngram) if on else False for on in decoding]
        model_drafts = self.goodput.model_drafts and uses_model
        scheduled = [
            min(g, ngram) if ngram_row else (g if model_drafts else 0) for ngram, ngram_row in zip(num_ngram, ngram_rows)
        ]
        if proposals is not None:
            proposals = [tokens if ngram_row else [] for tokens, ngram_row in zip(proposals, ngram_rows)]
        draft_rows = None
        if model_drafts and g > 0 and self.goodput.measuring and config.verifier.num_paths == 1:
            draft_rows = self._probe_rows(rows, decoding, max_drafts, proposals)
            if draft_rows is not None:
                # The other model rows verify no draft this step (n-gram rows keep their blocks).
                scheduled = [
                    n if on or ngram_row else 0 for n, on, ngram_row in zip(scheduled, draft_rows, ngram_rows)
                ]
        return proposals, scheduled, draft_rows

    def _probe_rows(
        self, rows: list[Request], decoding: list[bool], max_drafts: list[int], proposals: list[list[int]] | None
    ) -> list[bool] | None:
        """The rows the draft model drafts for in a goodput measurement step: the `probe_rows` of its
        rows that owe it least per token left (None: all of them, when there are no more than that).
        Measuring a longer block at a large batch with every row once paid the draft's catch-up of the
        whole batch's prompts (a tenth of a short job at B = 32); the target's forward is [B, g + 1]
        whatever each row verifies, so a few drafting rows measure the step's cost as well."""
        model_rows = [
            index for index, (on, limit) in enumerate(zip(decoding, max_drafts))
            if on and limit > 0 and not (proposals is not None and proposals[index])
        ]
        if len(model_rows) <= self.goodput.probe_rows:
            return None
        owed = sorted(model_rows, key=lambda index: (rows[index].draft_lag / max(rows[index].remaining, 1), index))
        chosen = set(owed[: self.goodput.probe_rows])
        return [index in chosen for index in range(len(rows))]

    def _ngram_proposals(self, rows: list[Request], max_drafts: list[int]) -> list[list[int]] | None:
        """Each row's n-gram proposal, up to the longest block the schedule may give it (None when the
        proposer is the model alone). Rows not decoding (max_drafts 0) get []."""
        if self.ngram is None:
            return None
        limits = [min(limit, self.config.verifier.max_num_draft_tokens) for limit in max_drafts]
        return self.ngram.propose([request.prompt_ids + request.output for request in rows], limits)

    def _next_g_guess(
        self, rows: list[Request], scheduled_num_draft_tokens: list[int], num_draft_tokens: list[int], g: int
    ) -> int:
        """The draft model's g in the next step if every row keeps its whole block and none finishes
        early (> 0: the draft catches up in a step it does not draft in, executor.py). Under goodput,
        0 after a step without the draft model: the schedule takes the same kind of step again until it
        explores, and an n-gram step whose rows had blocks made the draft catch up the whole batch
        (prompts of rows that joined) for a next step that did not use it either."""
        if self.goodput is not None and not self.goodput.model_drafts:
            return 0
        guesses = []
        for request, scheduled, num_drafts in zip(rows, scheduled_num_draft_tokens, num_draft_tokens):
            left = request.remaining - num_drafts - 1
            if left < 1:
                continue
            if self.config.verifier.draft_len_schedule == "adaptive":
                scheduled = next_draft_length(scheduled, num_drafts, num_drafts, self.config.verifier.max_draft_len)
            guesses.append(min(scheduled, left - 1))
        return max(guesses, default=g)

    def _record(self, rows: list[Request], plan: StepPlan, outcome: StepOutcome) -> list[Request]:
        """Append each decoding row's tokens and update the counters; return the rows that finished."""
        stats = self.stats
        accepted_counts = outcome.accepted_counts.tolist()
        next_tokens = outcome.next_tokens.tolist()
        draft_ids = outcome.draft_ids.tolist()
        num_draft_tokens = outcome.num_draft_tokens.tolist()
        decoding = plan.decoding.tolist()
        from_ngram = plan.from_ngram.tolist() if plan.from_ngram is not None else [False] * len(rows)
        chunk = self.config.scheduling.prefill_chunk_tokens
        # Whether the draft model fed every row's sequence in this step (it drafted, or caught up
        # ahead of a drafting step: executor.py); otherwise it fell behind by the tokens kept.
        draft_in_step = plan.num_model_drafts > 0 or plan.next_g_guess > 0
        # A probe step feeds its drafting rows alone (StepPlan.draft_rows).
        fed = [draft_in_step] * len(rows) if plan.draft_rows is None else plan.draft_rows.tolist()
        finished = []
        for index, request in enumerate(rows):
            if fed[index]:
                request.draft_lag = 0
            if not decoding[index]:
                request.num_prompt_left -= chunk
                continue
            request.num_prompt_left = 0
            tau = accepted_counts[index]
            num_drafts = num_draft_tokens[index]
            if self.config.verifier.uses_draft:
                self._count_proposer("ngram" if from_ngram[index] else "model" if num_drafts else "none", num_drafts, tau)
            for position in range(num_drafts):
                stats.num_proposed_per_position[position] += 1
                stats.num_accepted_per_position[position] += int(position < tau)
            stats.num_row_iterations += 1
            request.stats.num_iterations += 1
            request.stats.num_accepted += tau
            if self.goodput is not None:
                request.acceptance.observe(tau, self.goodput.predicted_accepted(num_drafts, ngram=from_ngram[index]))
            if self.config.verifier.draft_len_schedule == "adaptive":
                request.num_draft_tokens = next_draft_length(request.num_draft_tokens, tau, num_drafts, self.config.verifier.max_draft_len)
            emitted = draft_ids[index][:tau] + [next_tokens[index]]
            if not fed[index]:
                request.draft_lag += len(emitted)
            num_before = len(request.output)
            request.finish_reason = self._stop_checker(request).append(request.output, emitted, request.budget)
            stats.num_tokens += len(request.output) - num_before
            if request.finish_reason is not None:
                request.stats.num_tokens = len(request.output)
                finished.append(request)
        return finished

    def _count_proposer(self, source: str, num_drafts: int, num_accepted: int) -> None:
        """Per-proposer counters in RunStats.extra: decoding rows (row-steps) whose block came from
        `source` ("model", "ngram", or "none": the row verified no draft), drafts verified and kept."""
        extra = self.stats.extra
        for name, value in ((f"rows_{source}", 1), (f"proposed_{source}", num_drafts), (f"accepted_{source}", num_accepted)):
            if source != "none" or name.startswith("rows"):
                key = f"proposer/{name}"
                extra[key] = extra.get(key, 0.0) + value

    def _observe(self, rows: list[Request], plan: StepPlan, outcome: StepOutcome, seconds: float) -> None:
        stats = self.stats
        stats.num_target_calls += 1
        if self.config.verifier.uses_draft_model:
            # Steps in which the draft model ran (the others, with proposer=model+ngram: n-grams only).
            drafted = (plan.g if plan.model_g is None else plan.model_g) > 0
            stats.extra["proposer/model_steps"] = stats.extra.get("proposer/model_steps", 0.0) + float(drafted)
        stats.num_steps_per_draft_len[plan.g] += 1
        stats.num_draft_calls = outcome.num_draft_calls
        stats.draft_s += outcome.draft_s
        stats.target_s += outcome.target_s
        stats.verify_s += outcome.verify_s
        for name, value in outcome.extra.items():
            stats.extra[name] = stats.extra.get(name, 0.0) + value
        decoding = plan.decoding.tolist()
        if self.goodput is None:
            return
        num_draft_tokens = [n for n, on in zip(outcome.num_draft_tokens.tolist(), decoding) if on]
        accepted = [tau for tau, on in zip(outcome.accepted_counts.tolist(), decoding) if on]
        from_ngram = None
        if plan.from_ngram is not None:
            from_ngram = [ngram for ngram, on in zip(plan.from_ngram.tolist(), decoding) if on]
        self.goodput.observe_acceptance(num_draft_tokens, accepted, from_ngram)
        self.goodput.observe_catch_up(outcome.catch_up_s, outcome.num_catch_up_tokens)
        # Prompt forwards run apart were timed: their seconds come off the step; the prompt slots
        # of the shared forward are priced by a fitted cost per slot (StepCostModel).
        fed_apart = outcome.num_prefill_apart_tokens > 0
        self.goodput.observe_step(
            len(rows),
            plan.g,
            max(seconds - outcome.prefill_s, 0.0),
            plan.num_prompt_slots_apart if fed_apart else plan.num_prompt_slots,
            # An n-gram-only step (the draft model idle) is priced in cells of its own.
            model=self.config.verifier.uses_draft_model and plan.num_model_drafts > 0,
            draft_seconds=outcome.draft_own_s,
        )
