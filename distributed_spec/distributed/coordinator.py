"""RayCoordinator: the Ray runtime as an executor of the engine's scheduler.

    from distributed_spec.distributed import ParallelConfig, RayCoordinator
    with RayCoordinator(target_factory, draft_factory, EngineConfig(VerifierConfig(method="block", num_draft_tokens=4)),
                        ParallelConfig(runtime="ray", tp_size=2)) as coordinator:
        results, stats = coordinator.generate_with_stats([[1, 2, 3], [4, 5]])

`target_factory` / `draft_factory` are picklable zero-argument callables that describe the models
(each actor calls its factory; a shard reads only its own slice of the target's weights, see
docs/distributed.md, Loading).

The loop is the engine's (engine/scheduler.py: admission, draft lengths, uniforms, finishing,
statistics); this class only runs each planned step on the actors (docs/design.md, the data flow):
1. draft actor: `step(DraftRequest, verdict)` applies rank 0's verdict of its previous step (the
   StepResult the coordinator received; it rides on this call, so a drafting step is two Ray calls,
   not three) and the row changes, and proposes the block (nothing in a step without a draft) -> a
   DraftBlock in Ray's object store, twice: with q for shard rank 0 (the verifier), without q for
   the other shards;
2. every shard: `score_and_verify(block, StepRequest)`; the block goes from the draft straight to
   the shards (an ObjectRef; the coordinator never fetches it); rank 0 answers a StepResult, kept
   for the draft's next step.
A step that neither runs the draft model (g = 0, as goodput runs most steps at a large batch) nor
catches it up makes no call 1: the coordinator holds that step's request and verdict back and sends
the held steps with the draft's next `step` (its `held`), which replays them in order first, as
their own calls would have (the draft is idle in such steps and owes nothing until it drafts).
With parallel.draft_in_shard there is no draft actor: 1 and 2 are one call per shard,
`draft_and_verify(DraftRequest to rank 0 only, block, StepRequest, held)`; rank 0's draft keeps its
verdicts in the process and rank 0 broadcasts the drafted ids to the other ranks. Steps without the
draft model are held back there too (every one: a catch-up cannot run beside the shard's forward,
so it waits for the next drafting step, which times it as the draft's debt), and rank 0 gets them
with the next DraftRequest it is sent. Without the hold a plain step ran the draft's row changes,
and any catch-up, in series before the target's forward (Ray, B = 32: goodput 0.92x
autoregressive). At most MAX_HELD_DRAFT_STEPS steps are held (a job that decodes plainly for hours
holds no more): the next step then goes to the draft, which replays them.
With parallel.overlap the draft also runs `propose_ahead` after 1, i.e. while the shards work.
With verifier.num_paths = K > 1 the same three calls carry K paths per row: the draft's block is
[B, K, g] (its side stays forked to B*K rows until the verdict), the shards fork, score and keep
the verified path (engine/multipath_step.py's halves), and rank 0's StepResult names the kept path
(path_indices), which the draft keeps at its next `step`; nothing is drafted ahead.
n-gram blocks (engine/proposers.py) come from the scheduler: with verifier.proposer=ngram, or in a
step where every proposing row has a match, the coordinator builds the block itself (step 1 only
applies the verdict and the row changes); with model+ngram the draft actor lays its own rows over
them. No block is drafted ahead over n-gram rows.

Faults: every wait covers all shards and the draft (`ray.wait`, so a dead actor surfaces at once
as RayActorError; a hung group after parallel.step_timeout_s, as a StepTimeout). The coordinator
then tears the whole runtime down, launches a new one (new placement group, new port) and raises
BatchLost: the scheduler re-admits every unfinished row with prompt + the tokens it already has,
its random stream rewound, so the output is unchanged; at most parallel.max_restarts times. An
ordinary error inside an actor (a bad number, out of memory) is not a machine fault: once the step's
other calls have ended it is raised as itself, without reloading any model (the job makes it the
record's error; the scheduler first retries out-of-memory at half the rows). Only if a rank is
still inside the step after parallel.step_timeout_s (stuck in a collective a failed peer left) is
the group relaunched before the error is raised.
Shutdown: `close()` (also from the context manager, Ctrl-C, SIGTERM and interpreter exit) kills
every actor and removes the placement group. SIGTERM is turned into SystemExit from the first
`start()` on (not only under `with`) until `close()`.
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

from distributed_spec.distributed.config import ParallelConfig
from distributed_spec.distributed.group import LoadTimeoutError, ModelFactory, RuntimeActors, launch, teardown
from distributed_spec.distributed.messages import DecodeSettings, DraftRequest, StepRequest, StepResult
from distributed_spec.distributed.placement import local_num_cpus
from distributed_spec.distributed.wire import (
    DraftBlock,
    WireFormat,
    num_block_outputs,
    point_mass_block,
    resolve_wire_dtype,
)
from distributed_spec.engine.config import EngineConfig, GenerationResult, RunStats
from distributed_spec.engine.executor import DecodeOptions, StepOutcome, StepPlan
from distributed_spec.engine.scheduler import BatchLost, Scheduler
from distributed_spec.engine.speculative import build_requests, to_result

logger = logging.getLogger(__name__)

class GroupFailure(RuntimeError):
    """The runtime kept failing: more faults than parallel.max_restarts."""


class StepTimeout(TimeoutError):
    """No answer within parallel.step_timeout_s (or load_timeout_s): the group is taken as hung."""


# Steps held back from the draft at most (module docstring): bounds what the coordinator keeps and
# what one replay costs, in a job that decodes plainly for hours.
MAX_HELD_DRAFT_STEPS = 64

# What a dead or hung actor looks like from the coordinator (RayTaskError, an exception raised by
# the actor's own code, is not among them: it is the step's error, not the machine's).
FAULT_ERRORS = (
    ray.exceptions.RayActorError,
    ray.exceptions.ObjectLostError,
    ray.exceptions.NodeDiedError,
    TimeoutError,
)


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
    # Everything else: serialisation, object store, Ray scheduling.
    transfer_s: float = 0.0
    # Bytes of draft blocks sent to the shard group.
    num_wire_bytes: int = 0
    # Blocks drafted ahead that were used / drafted in all.
    num_overlap_hits: int = 0
    num_restarts: int = 0
    # Steps without the draft whose row changes and verdict reached it later, with its next step.
    num_draft_steps_held: int = 0

    def fractions(self) -> dict[str, float]:
        """Share of the iteration time per part (draft, transfer, target, verify, coordinator)."""
        total = max(self.iteration_s, 1e-12)
        parts = ("draft_s", "transfer_s", "target_s", "verify_s", "coordinator_s")
        return {part[:-2]: getattr(self, part) / total for part in parts}

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


class RayCoordinator:
    """Owns the batch and drives the draft actor and the target shard group."""

    def __init__(
        self,
        target_factory: ModelFactory,
        draft_factory: ModelFactory | None,
        config: EngineConfig,
        runtime: ParallelConfig,
        tokenizer=None,
        max_context_len: int | None = None,
    ) -> None:
        """max_context_len: model.max_context_len, a cap under the models' max_position_embeddings."""
        if config.verifier.uses_draft_model and draft_factory is None:
            raise ValueError(
                f"verifier.method={config.verifier.method!r} with verifier.proposer={config.verifier.proposer!r} needs a draft "
                "model; set verifier.proposer=ngram (no draft model) or verifier.method=autoregressive"
            )
        runtime.require_paths_supported(config.verifier.num_paths)
        self.config = config
        self.runtime = runtime
        self.tokenizer = tokenizer
        self.target_factory = target_factory
        self.draft_factory = draft_factory
        self.max_context_len = max_context_len
        self.actors: RuntimeActors | None = None
        self.timings = RuntimeTimings()
        self._relaunched = False
        self._unreported_restarts = 0
        self._first_step = True
        self._started_ray = False
        self._closed = False
        self._previous_handlers: dict[int, object] = {}
        self._num_launches = 0
        # The calls of the step in progress (a failed step's others are waited for).
        self._step_refs: list[ray.ObjectRef] = []
        # Rank 0's verdict of the draft's last step (its reference: Ray sends the bytes it holds
        # rather than pickle it again), sent with the draft's next step.
        self._draft_verdict: ray.ObjectRef | None = None
        # Steps run without the draft since, not sent to it yet: (its DraftRequest, rank 0's StepResult).
        self._held_draft_steps: list[tuple[DraftRequest, StepResult]] = []
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
        # From the first start on, whoever started it (a `with` block or the job's RayGenerator):
        # after ray.init, which installs its own SIGTERM handler.
        self._install_signal_handlers()
        if self.actors is None:
            self.actors = launch(
                self.runtime,
                self.config,
                self.target_factory,
                self.draft_factory,
                draft_seed=self.config.sampling.seed + 7919 * (self._num_launches + 1),
                max_context_len=self.max_context_len,
            )
            self._num_launches += 1
        return self

    def close(self) -> None:
        """Kill every actor and release the placement group; idempotent."""
        self._draft_verdict, self._held_draft_steps = None, []
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
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _install_signal_handlers(self) -> None:
        """SIGTERM becomes SystemExit(143), so every `finally` and `with` up the stack runs (outputs
        are flushed) and close() kills the actors; SIGINT already raises KeyboardInterrupt."""
        if threading.current_thread() is not threading.main_thread() or self._previous_handlers:
            return

        def _terminate(signum, frame) -> None:
            # A second SIGTERM (schedulers repeat theirs) must not cut the teardown short: SIGKILL will.
            signal.signal(signum, signal.SIG_IGN)
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
        self, prompts_token_ids: Sequence[Sequence[int]], tokenizer=None, keys: Sequence | None = None
    ) -> tuple[list[GenerationResult], RunStats]:
        """Like the engine's: results and RunStats; `self.timings` holds the runtime's time split."""
        self.start()
        requests = build_requests(
            prompts_token_ids, self.config, self.actors.vocab_size, self.actors.max_context, keys
        )
        scheduler = self.scheduler(tokenizer)
        finished = {id(request): request for request in scheduler.run(requests)}
        return [to_result(finished[id(request)]) for request in requests], scheduler.stats

    def scheduler(self, tokenizer=None) -> Scheduler:
        """The engine's scheduler with this runtime as its executor (`run` streams requests)."""
        # (a job may have reconfigured them)
        self.runtime.require_paths_supported(self.config.verifier.num_paths)
        self.start()
        scheduler = Scheduler(self.config, self, tokenizer or self.tokenizer)
        scheduler.on_step = self._on_step
        return scheduler

    def stream(self, requests, tokenizer=None):
        """Decode a stream of requests with continuous batching; yields each as it finishes."""
        return self.scheduler(tokenizer).run(requests)

    def _on_step(self, step: int) -> None:
        if self.on_iteration is not None:
            self.on_iteration(self.timings.num_iterations)

    # ---- the executor interface (engine/executor.py) -----------------------------------------

    @property
    def vocab_size(self) -> int:
        return self.start().actors.vocab_size

    @property
    def max_context(self) -> int | None:
        return self.start().actors.max_context

    def begin(self, options: DecodeOptions) -> None:
        """Start a run with an empty batch on every actor (relaunching a dead runtime first)."""
        if not self._relaunched:
            # A new run (not the same run going on after a relaunch): its own counters.
            self.timings = RuntimeTimings()
        self._relaunched = False
        while True:
            try:
                self.start()
                settings = decode_settings(self.config, self.runtime, self.actors.device)
                self._wire = settings.wire
                refs = [shard.begin.remote(settings) for shard in self.actors.shards]
                if self.actors.draft is not None:
                    refs.append(self.actors.draft.begin.remote(settings))
                self._wait(refs, self.runtime.load_timeout_s)
                self._first_step = True
                self._draft_verdict, self._held_draft_steps = None, []
                return
            except LoadTimeoutError:
                raise  # a configuration matter (parallel.load_timeout_s), not a fault to retry
            except FAULT_ERRORS as error:
                self._restart(error)

    def execute(self, plan: StepPlan) -> StepOutcome:
        """Run one step on the actors; on a fault relaunch the runtime and raise BatchLost; an actor's
        own exception is raised as itself (the scheduler retries out-of-memory at half the rows)."""
        self._step_refs = []
        try:
            return self._execute(plan)
        except ray.exceptions.RayTaskError as error:
            if not isinstance(getattr(error, "cause", None), FAULT_ERRORS):
                # The actor's own exception (bad numbers, out of memory): the step's error, not a fault,
                # so the models stay loaded, unless a rank is left stuck in the step (a collective
                # its peer never joined): then the group is relaunched first.
                if not self._settle(self._step_refs):
                    self._restart(error)
                logger.warning("a step failed inside an actor: %s", error)  # the remote traceback
                # The actor's exception as it was raised there (its record's error reads "ValueError: ...").
                raise (error.cause if isinstance(error.cause, Exception) else error.as_instanceof_cause()) from None
            # A task whose input came from a dead actor: a fault.
            fault: BaseException = error
        except FAULT_ERRORS as error:
            fault = error
        self._restart(fault)
        raise BatchLost(f"the runtime was relaunched after {fault!r}") from fault

    def _settle(self, refs: list[ray.ObjectRef]) -> bool:
        """Wait up to parallel.step_timeout_s for the failed step's other calls; False if one hangs."""
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=self.runtime.step_timeout_s)
        return not pending

    def _execute(self, plan: StepPlan) -> StepOutcome:
        actors = self.actors
        iteration_start = time.perf_counter()
        request = StepRequest(
            keep_rows=plan.keep_rows,
            new_prompts=plan.new_prompts,
            decoding=plan.decoding,
            num_draft_tokens=plan.num_draft_tokens,
            eta=plan.eta,
            u=plan.u,
            sampling=plan.sampling,
            prefill_chunk_tokens=plan.prefill_chunk_tokens,
        )
        # A launched draft sits idle while no draft model is used (the autoregressive baseline, n-grams).
        uses_draft = self.config.verifier.uses_draft_model
        draft = actors.draft if uses_draft else None
        in_shard = uses_draft and actors.draft_in_shard
        model_g = plan.num_model_drafts if draft is not None or in_shard else 0
        if draft is not None or in_shard:
            draft_request = DraftRequest(
                keep_rows=plan.keep_rows,
                new_prompts=plan.new_prompts,
                decoding=plan.decoding,
                g=model_g,
                draft_uniforms=plan.draft_uniforms[..., :model_g],  # [B, g] or [B, K, g]
                sampling=plan.sampling,
                ngram_ids=plan.ngram_ids,
                from_ngram=plan.from_ngram,
                # Inside the shard a catch-up before the next drafting step cannot run beside the
                # target's forward: it waits for that step, which times it apart (the draft's debt).
                catch_up=plan.next_g_guess > 0 and not in_shard,
                num_paths=plan.num_paths,
                draft_rows=plan.draft_rows,
            )
        # A step the draft sits out is held back and replayed before its next step (module docstring),
        # also inside the shard: the row changes of g = 0 steps then run in one replay, not each step
        # in series before the target's forward. At most MAX_HELD_DRAFT_STEPS of them wait.
        hold = (
            (draft is not None or in_shard)
            and model_g == 0
            and not draft_request.catch_up
            and len(self._held_draft_steps) < MAX_HELD_DRAFT_STEPS
        )
        if draft is not None and not hold:
            blocks = draft.step.options(num_returns=num_block_outputs(self._wire)).remote(
                draft_request, self._draft_verdict, self._held_draft_steps
            )
            self._draft_verdict, self._held_draft_steps = None, []
        if model_g == 0:
            blocks = self._blocks_without_draft(plan)
        if in_shard:
            # parallel.draft_in_shard: the whole step is one call per shard (TargetShard.draft_and_verify);
            # a drafted block reaches the other ranks from rank 0, inside the group.
            # A held step reaches rank 0 without its DraftRequest; the next step it gets one carries the
            # held steps along.
            result_refs = [
                shard.draft_and_verify.remote(
                    draft_request if rank == 0 and not hold else None,
                    shard_block(blocks, rank, self._wire) if model_g == 0 else None,
                    request,
                    self._held_draft_steps if rank == 0 and not hold else (),
                )
                for rank, shard in enumerate(actors.shards)
            ]
            if not hold:
                self._held_draft_steps = []
        else:
            result_refs = [
                shard.score_and_verify.remote(shard_block(blocks, rank, self._wire), request)
                for rank, shard in enumerate(actors.shards)
            ]
        if draft is not None and not hold:
            same_rows = not plan.new_prompts and bool(plan.decoding.all())
            # Drafting ahead assumes the draft drafted every row's block (no n-gram rows), one path per
            # row (it continues the block being verified; a K-path step keeps its path only then).
            model_only = plan.from_ngram is None or not bool(plan.from_ngram.any())
            # Nor after a probe step that drafted for a few rows (StepPlan.draft_rows).
            every_row = plan.draft_rows is None
            ahead = (
                model_g > 0 and plan.next_g_guess > 0 and same_rows and model_only and every_row and plan.num_paths == 1
            )
            if self.runtime.overlap and ahead:
                draft.propose_ahead.remote(plan.next_g_guess)
        self._step_refs = result_refs
        submitted = time.perf_counter()
        # The first step also runs the staged prompts through both models: it gets the load timeout.
        timeout_s = self.runtime.load_timeout_s if self._first_step else self.runtime.step_timeout_s
        result: StepResult = self._wait(result_refs, timeout_s)[0]
        self._first_step = False
        if hold:
            self._held_draft_steps.append((draft_request, result))
            self.timings.num_draft_steps_held += 1
        elif draft is not None:
            self._draft_verdict = result_refs[0]
        answered = time.perf_counter()
        outcome = StepOutcome(
            accepted_counts=result.accepted_counts,
            next_tokens=result.next_tokens,
            draft_ids=result.draft_ids,
            num_draft_tokens=result.num_draft_tokens,
            target_s=result.target_s,
            verify_s=result.verify_s,
            draft_own_s=result.draft_own_s,
            prefill_s=result.prefill_s,
            num_prefill_apart_tokens=result.num_prefill_apart_tokens,
            catch_up_s=result.catch_up_s,
            num_catch_up_tokens=result.num_catch_up_tokens,
            num_draft_calls=result.num_draft_calls,
            num_target_calls=result.num_target_calls,
        )
        coordinator_s = (submitted - iteration_start) + (time.perf_counter() - answered)
        self._time(outcome, result, time.perf_counter() - iteration_start, coordinator_s)
        return outcome

    def _blocks_without_draft(self, plan: StepPlan) -> list[DraftBlock]:
        """A step without the draft model: the n-gram blocks (built here: they are token ids only), or
        none (a plain step), for rank 0 and the other ranks (as the draft's outputs, num_block_outputs)."""
        ngram_ids = plan.ngram_ids if plan.ngram_ids is not None and plan.g > 0 else None
        if ngram_ids is None:
            ngram_ids = torch.zeros(plan.num_rows, 0, dtype=torch.long)
        verifier_block = point_mass_block(ngram_ids, self.actors.vocab_size, self._wire)
        # Point masses are (value, id) pairs: every shard of a vocabulary-parallel group gets them whole.
        return [verifier_block] + [verifier_block.without_probs()] * (self._wire.vocab_shards == 0)

    def _time(self, outcome: StepOutcome, result: StepResult, iteration_s: float, coordinator_s: float) -> None:
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
        transfer_s = max(0.0, iteration_s - draft_s - result.target_s - result.verify_s - coordinator_s)
        timings.transfer_s += transfer_s
        timings.num_wire_bytes += result.num_wire_bytes
        outcome.draft_s = draft_s
        outcome.extra = {
            "transfer_s": transfer_s,
            "coordinator_s": coordinator_s,
            "draft_overlapped_s": result.draft_s if result.from_overlap else 0.0,
            "num_wire_bytes": float(result.num_wire_bytes),
            "num_overlap_hits": float(result.from_overlap),
            "num_restarts": float(self._unreported_restarts),
        }
        self._unreported_restarts = 0

    def _restart(self, error: BaseException) -> None:
        """Tear the dead runtime down; the next start() launches a fresh one."""
        self._draft_verdict, self._held_draft_steps = None, []
        if self.actors is not None:
            actors, self.actors = self.actors, None
            teardown(actors)
        self.timings.num_restarts += 1
        self._unreported_restarts += 1
        self._relaunched = True
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
        self.start()

    def _wait(self, refs: list[ray.ObjectRef], timeout_s: float) -> list:
        """ray.get on every ref, failing as soon as any actor is dead, or after `timeout_s`."""
        pending = list(refs)
        deadline = time.monotonic() + timeout_s
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise StepTimeout(
                    f"no answer from {len(pending)} actor call(s) within {timeout_s:.0f} s "
                    "(parallel.step_timeout_s / parallel.load_timeout_s)"
                )
            ready, pending = ray.wait(pending, num_returns=1, timeout=remaining)
            for ref in ready:
                # Host sync: raises RayActorError at once when this ref's actor died.
                ray.get(ref)
        return ray.get(refs)


def shard_block(blocks: list, rank: int, wire: WireFormat):
    """The block (or its reference) shard `rank` receives from the draft's outputs (num_block_outputs):
    its vocabulary slice, or the whole block (rank 0) / the ids alone (the others)."""
    if wire.vocab_shards > 1:
        return blocks[rank] if len(blocks) > 1 else blocks[0]
    return blocks[0] if rank == 0 else blocks[1]


def decode_settings(config: EngineConfig, runtime: ParallelConfig, device: str) -> DecodeSettings:
    """The per-batch settings every actor receives when a batch starts (`device`: the shards')."""
    # Greedy verification never reads q: nothing but the draft ids needs to travel.
    vocab_parallel = runtime.verify == "vocab_parallel" and runtime.tp_size > 1
    wire = WireFormat(
        dtype=resolve_wire_dtype(runtime.wire_dtype, device),
        top_k=runtime.wire_top_k,
        send_probs=config.verifier.method != "greedy",
        vocab_shards=runtime.tp_size if vocab_parallel else 0,
    )
    return DecodeSettings(
        method=config.verifier.method,
        wire=wire,
        draft_confidence_threshold=config.verifier.draft_confidence_threshold,
        verify=runtime.verify,
    )
