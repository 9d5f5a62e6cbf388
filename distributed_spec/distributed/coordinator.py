"""RayCoordinator: the speculative loop of engine/speculative.py, replayed over Ray actors.

    from distributed_spec.distributed import RayCoordinator, RayRuntimeConfig
    with RayCoordinator(target_factory, draft_factory, EngineConfig(method="block", gamma=4),
                        RayRuntimeConfig(tp_size=2)) as coordinator:
        results, stats = coordinator.generate_with_stats([[1, 2, 3], [4, 5]])

`target_factory` / `draft_factory` are picklable zero-argument callables that build the models
(each actor calls its factory; every shard builds the same full target and keeps its slice).

One iteration (DESIGN.md section 2), with the same order of random draws as the engine:
1. the coordinator draws the draft's uniforms [B, g] and the verifier's (eta [B, g], u [B]);
2. draft actor: `propose` -> a DraftBlock (draft ids [B, g], q on the wire) in Ray's object store;
3. every shard: `score_and_verify(block, request)`; the block goes from the draft straight to the
   shards (an ObjectRef; the coordinator never fetches it); rank 0 answers a StepResult;
4. draft actor: `commit(result of rank 0)` (an ObjectRef too), applied at its next `propose`;
5. the coordinator appends tau accepted drafts + Y per row, finishes rows (EOS, stop string,
   max_new_tokens) and passes the surviving rows to the next propose / score_and_verify.
With parallel.overlap the draft also runs `propose_ahead` between 2 and 4, i.e. while the shards work.

Faults: every wait covers all shards and the draft (`ray.wait`, so a dead actor surfaces at once
as RayActorError; a hung group after parallel.step_timeout_s). The coordinator then tears the whole
runtime down, launches a new one (new placement group, new port), starts each unfinished row again
from prompt + the tokens it already committed, and goes on; at most parallel.max_restarts times.
Shutdown: `close()` (also from the context manager, Ctrl-C, SIGTERM and interpreter exit) kills
every actor and removes the placement group.
"""

from __future__ import annotations

import atexit
import logging
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import ray
import torch

from distributed_spec.distributed.config import RayRuntimeConfig
from distributed_spec.distributed.group import ModelFactory, RuntimeActors, launch, teardown
from distributed_spec.distributed.messages import DecodeSettings, StepRequest, StepResult
from distributed_spec.distributed.placement import local_num_cpus
from distributed_spec.distributed.wire import DraftBlock, WireFormat
from distributed_spec.engine.config import EngineConfig, GenerationResult, RowStats, RunStats
from distributed_spec.engine.draft_length import adapt_draft_lengths, next_draft_length, plan_step
from distributed_spec.engine.speculative import append_tokens, prompt_budgets
from distributed_spec.verify import draw_uniforms

logger = logging.getLogger(__name__)

# What a dead or hung actor looks like from the coordinator.
FAULT_ERRORS = (ray.exceptions.RayError, TimeoutError)


class GroupFailure(RuntimeError):
    """The runtime stopped answering (an actor died or an iteration timed out)."""


@dataclass
class RuntimeTimings:
    """Where the iterations' wall-clock time went (the prompts are processed in the first iteration)."""

    num_iterations: int = 0
    # Sum of the coordinator's wall-clock time per iteration.
    iteration_s: float = 0.0
    # Draft forwards + sampling that the iteration waited for (propose on the critical path).
    draft_s: float = 0.0
    # Draft work hidden behind verification (blocks drafted ahead that were used).
    draft_overlapped_s: float = 0.0
    # Blocks drafted ahead and discarded: the part the next propose had to wait for (an upper
    # bound: the rest of the iteration not explained otherwise, at most their compute time).
    # Included in draft_s.
    draft_discarded_s: float = 0.0
    # Target forward over g+1 positions (rank 0).
    target_s: float = 0.0
    # Decode q, verify, broadcast the verdict, crop the KV cache (rank 0).
    verify_s: float = 0.0
    # The coordinator's own Python: uniforms, bookkeeping, finishing rows, submitting calls.
    coordinator_s: float = 0.0
    # Everything else: serialisation, object store, Ray scheduling and the draft's commit.
    transfer_s: float = 0.0
    # Bytes of draft blocks sent to the shard group.
    num_wire_bytes: int = 0
    # Blocks drafted ahead that were used / drafted in all.
    num_overlap_hits: int = 0
    num_restarts: int = 0

    def fractions(self) -> dict[str, float]:
        """Share of the iteration time per part (draft, transfer, target, verify, coordinator)."""
        total = max(self.iteration_s, 1e-12)
        parts = ("draft_s", "transfer_s", "target_s", "verify_s", "coordinator_s")
        return {part[:-2]: getattr(self, part) / total for part in parts}

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


@dataclass
class _Batch:
    """Per-prompt state of one batch; survives restarts of the runtime."""

    prompts: list[list[int]]
    budgets: list[int]
    outputs: list[list[int]]
    finish_reasons: list[str | None]
    row_stats: list[RowStats]
    # Active rows (prompt indices), in the order of the actors' batch rows.
    rows: list[int]
    # Each prompt row's draft block length g for its next iteration (engine/draft_length.py).
    gammas: list[int]


class RayCoordinator:
    """Owns the batch and drives the draft actor and the target shard group."""

    def __init__(
        self,
        target_factory: ModelFactory,
        draft_factory: ModelFactory | None,
        config: EngineConfig,
        runtime: RayRuntimeConfig,
        tokenizer=None,
    ) -> None:
        if config.uses_draft and draft_factory is None:
            raise ValueError(
                f"engine.method={config.method!r} needs a draft model; set engine.method=autoregressive "
                "to decode with the target alone"
            )
        self.config = config
        self.runtime = runtime
        self.tokenizer = tokenizer
        self.target_factory = target_factory
        self.draft_factory = draft_factory
        self.actors: RuntimeActors | None = None
        self.timings = RuntimeTimings()
        self._started_ray = False
        self._closed = False
        self._previous_handlers: dict[int, object] = {}
        self._num_launches = 0
        # Tests: called with the iteration index after each iteration (e.g. to kill a shard).
        self.on_iteration: Callable[[int], None] | None = None
        atexit.register(self.close)

    # ---- lifecycle ---------------------------------------------------------------------------

    def start(self) -> RayCoordinator:
        """Start Ray if needed and launch the runtime (done lazily by generate otherwise)."""
        if self._closed:
            raise RuntimeError("this RayCoordinator was closed; build a new one")
        if not ray.is_initialized():
            # A cluster brings its own resources; a Ray started here gets enough logical CPUs.
            local = {} if self.runtime.ray_address else {"num_cpus": local_num_cpus(self.runtime)}
            ray.init(address=self.runtime.ray_address, include_dashboard=False, log_to_driver=True, **local)
            self._started_ray = True
        if self.actors is None:
            self.actors = launch(
                self.runtime,
                self.config,
                self.target_factory,
                self.draft_factory,
                draft_seed=self.config.seed + 7919 * (self._num_launches + 1),
            )
            self._num_launches += 1
        return self

    def close(self) -> None:
        """Kill every actor and release the placement group; idempotent."""
        if self.actors is not None:
            actors, self.actors = self.actors, None
            teardown(actors)
        self._restore_signal_handlers()
        if self._started_ray and ray.is_initialized():
            ray.shutdown()
        self._started_ray = False
        self._closed = True
        atexit.unregister(self.close)

    def __enter__(self) -> RayCoordinator:
        self._install_signal_handlers()
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _install_signal_handlers(self) -> None:
        """SIGTERM becomes SystemExit, so the context manager's close() runs (SIGINT already raises)."""
        if threading.current_thread() is not threading.main_thread():
            return

        def _terminate(signum, frame) -> None:
            raise SystemExit(128 + signum)

        self._previous_handlers[signal.SIGTERM] = signal.signal(signal.SIGTERM, _terminate)

    def _restore_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers.clear()

    # ---- generation --------------------------------------------------------------------------

    def generate(self, prompts_token_ids: Sequence[Sequence[int]], tokenizer=None) -> list[GenerationResult]:
        """Generate for every prompt (token ids); results are in prompt order."""
        return self.generate_with_stats(prompts_token_ids, tokenizer)[0]

    def generate_with_stats(
        self, prompts_token_ids: Sequence[Sequence[int]], tokenizer=None
    ) -> tuple[list[GenerationResult], RunStats]:
        """Like the engine's: results and RunStats; `self.timings` holds the runtime's time split."""
        tokenizer = tokenizer or self.tokenizer
        if self.config.stop_strings and tokenizer is None:
            raise ValueError(
                "engine.stop_strings needs a tokenizer: pass tokenizer= or clear engine.stop_strings"
            )
        self.start()
        prompts = [list(map(int, prompt)) for prompt in prompts_token_ids]
        budgets = self._check_prompts(prompts)
        generator = torch.Generator().manual_seed(self.config.seed)
        self.timings = RuntimeTimings()
        results: list[GenerationResult] = []
        stats = RunStats(gamma=self.config.gamma_limit)
        size = self.config.max_batch_size
        for start in range(0, len(prompts), size):
            batch_results, batch_stats = self._generate_batch(
                prompts[start : start + size], budgets[start : start + size], generator, tokenizer
            )
            results.extend(batch_results)
            stats = stats.merge(batch_stats)
        return results, stats

    def _check_prompts(self, prompts: list[list[int]]) -> list[int]:
        """Validate prompts against the target; each row's token budget (clipped to the context)."""
        return prompt_budgets(prompts, self.actors.vocab_size, self.actors.max_context, self.config.max_new_tokens)

    def _generate_batch(
        self, prompts: list[list[int]], budgets: list[int], generator: torch.Generator, tokenizer
    ) -> tuple[list[GenerationResult], RunStats]:
        gamma_limit = self.config.gamma_limit
        num_rows = len(prompts)
        batch = _Batch(
            prompts=prompts,
            budgets=budgets,
            outputs=[[] for _ in range(num_rows)],
            finish_reasons=[None] * num_rows,
            row_stats=[RowStats() for _ in range(num_rows)],
            rows=list(range(num_rows)),
            gammas=[self.config.gamma] * num_rows,
        )
        stats = RunStats(
            gamma=gamma_limit,
            num_proposed_per_position=[0] * gamma_limit,
            num_accepted_per_position=[0] * gamma_limit,
        )
        start_time = time.perf_counter()
        while batch.rows:
            try:
                self.start()
                self._start(batch)
                self._decode(batch, stats, generator, tokenizer)
            except FAULT_ERRORS as error:
                self._restart(error)
        stats.total_s = time.perf_counter() - start_time
        stats.other_s = stats.total_s - stats.draft_s - stats.target_s - stats.verify_s
        for row in range(num_rows):
            batch.row_stats[row].num_tokens = len(batch.outputs[row])
        stats.num_tokens = sum(len(output) for output in batch.outputs)
        results = [
            GenerationResult(
                token_ids=batch.outputs[row],
                finish_reason=batch.finish_reasons[row],
                stats=batch.row_stats[row],
            )
            for row in range(num_rows)
        ]
        return results, stats

    def _restart(self, error: BaseException) -> None:
        """Tear the dead runtime down; the next loop turn launches a fresh one and resumes."""
        if self.actors is not None:
            actors, self.actors = self.actors, None
            teardown(actors)
        self.timings.num_restarts += 1
        if self.timings.num_restarts > self.runtime.max_restarts:
            raise GroupFailure(
                f"the runtime failed {self.timings.num_restarts} times (last: {error!r}); "
                "raise parallel.max_restarts or check the actors' logs"
            ) from error
        logger.warning(
            "runtime failed (%r); restarting it (%d/%d)",
            error,
            self.timings.num_restarts,
            self.runtime.max_restarts,
        )

    def _start(self, batch: _Batch) -> None:
        """Start every actor's batch with prompt + committed tokens of each active row (these go through
        the models with the first iteration's forwards; the committed tokens are there after a fault)."""
        sequences = [batch.prompts[row] + batch.outputs[row] for row in batch.rows]
        settings = decode_settings(self.config, self.runtime)
        refs = [shard.start.remote(sequences, settings) for shard in self.actors.shards]
        if self.actors.draft is not None:
            refs.append(self.actors.draft.start.remote(sequences, settings))
        self._wait(refs, self.runtime.load_timeout_s)

    def _decode(self, batch: _Batch, stats: RunStats, generator: torch.Generator, tokenizer) -> None:
        """Iterate until every row of the batch has finished (or the runtime fails)."""
        config, actors, timings = self.config, self.actors, self.timings
        keep_rows: torch.Tensor | None = None
        # The first iteration also runs the staged prompts through both models: it gets the load timeout.
        timeout_s = max(self.runtime.load_timeout_s, self.runtime.step_timeout_s)
        while batch.rows:
            iteration_start = time.perf_counter()
            num_rows = len(batch.rows)
            remaining = [batch.budgets[row] - len(batch.outputs[row]) for row in batch.rows]
            row_gammas = [batch.gammas[row] for row in batch.rows]
            step_gamma, num_draft_list = plan_step(row_gammas, remaining) if config.uses_draft else (0, [0] * num_rows)
            num_draft_tokens = torch.tensor(num_draft_list)
            # Same order of draws as the engine: draft uniforms, then the verifier's.
            draft_uniforms = torch.rand(num_rows, step_gamma, generator=generator, dtype=torch.float64)
            uniforms = draw_uniforms(num_rows, step_gamma, generator)
            request = StepRequest(
                keep_rows=keep_rows, num_draft_tokens=num_draft_tokens, eta=uniforms.eta, u=uniforms.u
            )
            if actors.draft is not None:
                block = actors.draft.propose.remote(keep_rows, step_gamma, draft_uniforms)
            else:
                block = DraftBlock(
                    draft_ids=torch.zeros(num_rows, 0, dtype=torch.long),
                    probs_values=None,
                    probs_ids=None,
                    vocab_size=actors.vocab_size,
                )
            result_refs = [shard.score_and_verify.remote(block, request) for shard in actors.shards]
            if actors.draft is not None:
                if self.runtime.overlap:
                    actors.draft.propose_ahead.remote(
                        _gamma_if_all_kept(row_gammas, remaining, num_draft_list, config)
                    )
                actors.draft.commit.remote(result_refs[0])
            submitted = time.perf_counter()
            result: StepResult = self._wait(result_refs, timeout_s)[0]
            timeout_s = self.runtime.step_timeout_s
            answered = time.perf_counter()

            if config.uses_draft and config.gamma_schedule == "adaptive":
                adapt_draft_lengths(
                    batch.gammas,
                    batch.rows,
                    result.accepted_counts.tolist(),
                    result.num_draft_tokens.tolist(),
                    config.max_gamma,
                )
            keep = self._record(batch, stats, result, tokenizer)
            keep_rows = torch.tensor(keep, dtype=torch.long) if len(keep) < num_rows else None
            batch.rows = [batch.rows[index] for index in keep]
            stats.num_row_iterations += num_rows
            stats.num_target_calls += 1
            stats.num_draft_calls = result.num_draft_calls
            iteration_end = time.perf_counter()
            self._time(
                stats,
                result,
                iteration_end - iteration_start,
                (submitted - iteration_start) + (iteration_end - answered),
            )
            if self.on_iteration is not None:
                self.on_iteration(timings.num_iterations)

    def _record(self, batch: _Batch, stats: RunStats, result: StepResult, tokenizer) -> list[int]:
        """Append each row's tokens, update the counters; return the indices of the rows that go on."""
        accepted_list = result.accepted_counts.tolist()
        next_list = result.next_tokens.tolist()
        draft_list = result.draft_ids.tolist()
        num_draft_list = result.num_draft_tokens.tolist()
        keep = []
        for index, row in enumerate(batch.rows):
            tau = accepted_list[index]
            for position in range(num_draft_list[index]):
                stats.num_proposed_per_position[position] += 1
                stats.num_accepted_per_position[position] += int(position < tau)
            batch.row_stats[row].num_iterations += 1
            batch.row_stats[row].num_accepted += tau
            batch.finish_reasons[row] = append_tokens(
                batch.outputs[row],
                draft_list[index][:tau] + [next_list[index]],
                batch.budgets[row],
                self.config,
                tokenizer,
            )
            if batch.finish_reasons[row] is None:
                keep.append(index)
        return keep

    def _time(self, stats: RunStats, result: StepResult, iteration_s: float, coordinator_s: float) -> None:
        timings = self.timings
        draft_s = 0.0 if result.from_overlap else result.draft_s
        unexplained = max(0.0, iteration_s - draft_s - result.target_s - result.verify_s - coordinator_s)
        discarded_s = min(result.discarded_ahead_s, unexplained)
        draft_s += discarded_s
        timings.draft_discarded_s += discarded_s
        timings.num_iterations += 1
        timings.iteration_s += iteration_s
        timings.draft_s += draft_s
        timings.draft_overlapped_s += result.draft_s if result.from_overlap else 0.0
        timings.num_overlap_hits += int(result.from_overlap)
        timings.target_s += result.target_s
        timings.verify_s += result.verify_s
        timings.coordinator_s += coordinator_s
        timings.transfer_s += max(
            0.0, iteration_s - draft_s - result.target_s - result.verify_s - coordinator_s
        )
        timings.num_wire_bytes += result.num_wire_bytes
        stats.draft_s += draft_s
        stats.target_s += result.target_s
        stats.verify_s += result.verify_s

    def _wait(self, refs: list[ray.ObjectRef], timeout_s: float) -> list:
        """ray.get on every ref, failing as soon as any actor is dead, or after `timeout_s`."""
        pending = list(refs)
        deadline = time.monotonic() + timeout_s
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise GroupFailure(
                    f"no answer from {len(pending)} actor call(s) within {timeout_s:.0f} s "
                    "(parallel.step_timeout_s / parallel.load_timeout_s)"
                )
            ready, pending = ray.wait(pending, num_returns=1, timeout=remaining)
            for ref in ready:
                # Host sync: raises RayActorError at once when this ref's actor died.
                ray.get(ref)
        return ray.get(refs)


def decode_settings(config: EngineConfig, runtime: RayRuntimeConfig) -> DecodeSettings:
    """The per-batch settings every actor receives when a batch starts."""
    # Greedy verification never reads q: nothing but the draft ids needs to travel.
    wire = WireFormat(
        dtype=runtime.wire_dtype, top_k=runtime.wire_top_k, send_probs=config.method != "greedy"
    )
    return DecodeSettings(
        method=config.method,
        sampling=config.sampling,
        wire=wire,
        draft_confidence_threshold=config.draft_confidence_threshold,
    )


def _gamma_if_all_kept(
    row_gammas: list[int], remaining: list[int], num_draft_tokens: list[int], config: EngineConfig
) -> int:
    """The next step's block length if every row keeps its whole block: the length to draft ahead.

    Rows the block brings to their budget are left out. It can still miss (an EOS ends a row, a
    confidence stop shortens the block); the draft worker then drops the block drafted ahead.
    """
    adaptive = config.gamma_schedule == "adaptive"
    next_gammas, next_remaining = [], []
    for gamma, budget, num_drafted in zip(row_gammas, remaining, num_draft_tokens):
        left = budget - num_drafted - 1
        if left >= 1:
            next_remaining.append(left)
            next_gammas.append(next_draft_length(gamma, num_drafted, num_drafted, config.max_gamma) if adaptive else gamma)
    return plan_step(next_gammas, next_remaining)[0] if next_gammas else max(row_gammas)
