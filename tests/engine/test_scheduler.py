"""The scheduling loop: admission (continuous and static), chunked prefill, budgets, per-row randomness.

.venv/bin/python -m pytest tests/engine/test_scheduler.py -q
"""

from __future__ import annotations

import pytest
import torch

from distributed_spec.engine import EngineConfig, SpeculativeEngine
from distributed_spec.engine.config import SamplingConfig, SchedulingConfig, VerifierConfig
from distributed_spec.engine.executor import DecodeOptions, StepOutcome, StepPlan
from distributed_spec.engine.scheduler import Request, Scheduler, request_seed
from distributed_spec.engine.speculative import build_requests
from tests.configs import engine_replace

FILLER_TOKEN = 7


class RecordingExecutor:
    """Keeps every plan; every row keeps all its drafts (draft ids 5) and emits FILLER_TOKEN."""

    vocab_size = 64
    max_context = None

    def __init__(self) -> None:
        self.plans: list[StepPlan] = []
        self.rows: list[int] = []

    def begin(self, options: DecodeOptions) -> None:
        self.rows = []

    def execute(self, plan: StepPlan) -> StepOutcome:
        self.plans.append(plan)
        num_rows = plan.num_rows
        return StepOutcome(
            accepted_counts=plan.num_draft_tokens.clone(),
            next_tokens=torch.full((num_rows,), FILLER_TOKEN),
            draft_ids=torch.full((num_rows, plan.g), 5),
            num_draft_tokens=plan.num_draft_tokens.clone(),
        )


def _requests(budgets: list[int], prompt_len: int = 3) -> list[Request]:
    return [
        Request(key=index, prompt_ids=list(range(1, prompt_len + 1)), budget=budget, seed=index)
        for index, budget in enumerate(budgets)
    ]


def test_rows_never_verify_past_their_budget():
    executor = RecordingExecutor()
    config = EngineConfig(verifier=VerifierConfig(method="block", num_draft_tokens=4), max_batch_size=2)
    finished = list(Scheduler(config, executor).run(_requests([3, 11])))
    first = executor.plans[0]
    # A row with 3 tokens left verifies 2 drafts (+1 correction/bonus); the step drafts the longest.
    assert first.num_draft_tokens.tolist() == [2, 4] and first.g == 4
    assert sorted(len(request.output) for request in finished) == [3, 11]
    # Row 1: 5 + 5 tokens, then one token left: nothing to verify, a plain decoding step.
    assert [plan.g for plan in executor.plans] == [4, 4, 0]


def test_continuous_batching_admits_a_record_when_a_row_finishes():
    executor = RecordingExecutor()
    config = EngineConfig(verifier=VerifierConfig(method="block", num_draft_tokens=1), max_batch_size=2)
    finished = list(Scheduler(config, executor).run(_requests([2, 10, 4])))
    # Step 1 admits rows 0 and 1; row 0 (2 tokens, 2 per step) finishes; step 2 keeps row 1 and admits row 2.
    assert len(executor.plans[0].new_prompts) == 2
    assert executor.plans[1].keep_rows.tolist() == [1] and len(executor.plans[1].new_prompts) == 1
    assert [request.key for request in finished] == [0, 2, 1]


def test_static_batching_waits_for_the_whole_batch():
    executor = RecordingExecutor()
    config = EngineConfig(
        verifier=VerifierConfig(method="block", num_draft_tokens=1),
        scheduling=SchedulingConfig(continuous_batching=False),
        max_batch_size=2,
    )
    list(Scheduler(config, executor).run(_requests([2, 10, 4])))
    joined_at = [step for step, plan in enumerate(executor.plans) if plan.new_prompts]
    # Row 1 needs 5 steps (2 tokens each): row 2 joins only after it, alone.
    assert joined_at == [0, 5]


def test_long_prompts_go_in_by_chunks():
    executor = RecordingExecutor()
    config = EngineConfig(
        verifier=VerifierConfig(method="block", num_draft_tokens=2),
        scheduling=SchedulingConfig(prefill_chunk_tokens=4),
        max_batch_size=2,
    )
    requests = [
        Request(key="long", prompt_ids=list(range(1, 11)), budget=3, seed=0),
        Request(key="short", prompt_ids=[1, 2], budget=3, seed=1),
    ]
    list(Scheduler(config, executor).run(requests))
    # 9 staged tokens of the long prompt: 4, 4, then the last 1 with its first block (the short row
    # decodes from the first step and is done after it: 2 drafts + 1).
    assert [plan.decoding.tolist() for plan in executor.plans[:3]] == [[False, True], [False], [True]]
    assert executor.plans[0].num_draft_tokens.tolist() == [0, 2]


def test_the_prompts_cost_is_counted_in_padded_slots():
    """A prompt chunk pads every row of the shared forward to its length: a step's prompt slots are
    rows x the longest chunk fed (what goodput prices per slot), or, when the joining rows' first
    chunks went through a forward of their own, rows x the longest chunk of the other rows."""
    executor = RecordingExecutor()
    config = EngineConfig(
        verifier=VerifierConfig(method="block", num_draft_tokens=1),
        scheduling=SchedulingConfig(prefill_chunk_tokens=4),
        max_batch_size=3,
    )
    requests = [
        Request(key="long", prompt_ids=list(range(1, 11)), budget=6, seed=0),
        Request(key="short", prompt_ids=[1, 2], budget=2, seed=1),
        Request(key="late", prompt_ids=[1, 2, 3, 4, 5, 6], budget=2, seed=2),
    ]
    list(Scheduler(config, executor).run(requests))
    plans = executor.plans
    # Step 1: 3 rows; chunks of 4 (long), 1 (short), 4 (late): 3 x 4 slots, all rows joining.
    assert (plans[0].num_prompt_slots, plans[0].num_prompt_slots_apart) == (12, 0)
    # Step 2: short finished; long feeds its second chunk of 4, late its last token.
    assert (plans[1].num_prompt_slots, plans[1].num_prompt_slots_apart) == (8, 8)
    # Once every prompt is in, no slots.
    assert plans[-1].num_prompt_slots == 0


def test_goodput_is_told_the_slots_of_the_shared_forward():
    """Where the executor fed joining rows apart (num_prefill_apart_tokens > 0: timed and taken off
    the step), goodput is told the other rows' slots; otherwise every row's."""

    class ApartExecutor(RecordingExecutor):
        def execute(self, plan: StepPlan) -> StepOutcome:
            outcome = super().execute(plan)
            # The third step's joining row went through a forward of its own.
            outcome.num_prefill_apart_tokens = 4 if len(self.plans) == 3 else 0
            return outcome

    executor = ApartExecutor()
    config = EngineConfig(
        verifier=VerifierConfig(method="block", draft_len_schedule="goodput", max_draft_len=1),
        scheduling=SchedulingConfig(prefill_chunk_tokens=4),
        max_batch_size=2,
    )
    scheduler = Scheduler(config, executor)
    told = []
    scheduler.goodput.observe_step = lambda num_rows, g, seconds, num_prompt_slots=0, model=True, draft_seconds=None: told.append(
        num_prompt_slots
    )
    requests = [
        Request(key="long", prompt_ids=list(range(1, 11)), budget=4, seed=0),
        Request(key="short", prompt_ids=[1, 2], budget=2, seed=1),
        Request(key="late", prompt_ids=list(range(1, 7)), budget=1, seed=2),
    ]
    list(scheduler.run(requests))
    plans = executor.plans
    # Steps 1-2 (the probe's g = 0 steps): long feeds chunks of 4 beside short, which then finishes.
    assert told[:2] == [8, 8]
    # Step 3: long feeds its last prompt token, late joins with a chunk of 4, fed apart: 2 rows x 1.
    assert len(plans[2].new_prompts) == 1
    assert (plans[2].num_prompt_slots, plans[2].num_prompt_slots_apart) == (8, 2)
    assert told[2] == 2


def test_request_seeds_depend_on_seed_and_key_only():
    assert request_seed(0, "a") == request_seed(0, "a") != request_seed(0, "b")
    assert request_seed(0, "a") != request_seed(1, "a")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("draft_len_schedule", ["constant", "adaptive"])
def test_a_prompt_decodes_the_same_alone_or_in_any_batch(tiny_pair, temperature, draft_len_schedule):
    """Per-row generators: a prompt's tokens do not depend on which rows share its batch, on
    continuous vs static batches, or on prompt chunking."""
    target, draft = tiny_pair
    prompts = [[(5 * index + offset) % 60 + 2 for offset in range(1 + index % 7)] for index in range(16)]
    budgets = [6 + (index * 5) % 17 for index in range(16)]
    config = EngineConfig(
        verifier=VerifierConfig(
            method="block", num_draft_tokens=3, draft_len_schedule=draft_len_schedule, max_draft_len=5
        ),
        sampling=SamplingConfig(temperature=temperature, max_new_tokens=24, seed=3),
    )

    def decode(batch_size: int, **overrides) -> list[list[int]]:
        engine = SpeculativeEngine(target, draft, engine_replace(config, max_batch_size=batch_size, **overrides))
        requests = [
            Request(
                key=index, prompt_ids=prompt, budget=budget, seed=request_seed(config.sampling.seed, index)
            )
            for index, (prompt, budget) in enumerate(zip(prompts, budgets))
        ]
        finished = {request.key: request.output for request in engine.stream(requests)}
        return [finished[index] for index in range(len(prompts))]

    alone = decode(1)
    assert decode(16) == alone
    assert decode(3) == alone
    assert decode(5, continuous_batching=False) == alone
    assert decode(4, prefill_chunk_tokens=2) == alone
    assert len({len(output) for output in alone}) > 3  # the set is length-skewed


def test_goodput_stops_drafting_where_drafts_are_never_kept(tiny_pair):
    """A draft that is never right (an unrelated model): once measured, the schedule decodes without it."""
    target, _ = tiny_pair
    from distributed_spec.models.tiny import tiny_llama

    unrelated = tiny_llama(vocab_size=64, num_layers=2, hidden=32, seed=9, logit_scale=8.0)
    config = EngineConfig(
        verifier=VerifierConfig(method="block", draft_len_schedule="goodput", max_draft_len=3),
        sampling=SamplingConfig(temperature=0.0, max_new_tokens=60),
        max_batch_size=1,
    )
    engine = SpeculativeEngine(target, unrelated, config)
    scheduler = engine.scheduler()
    # Step costs from a model of this host (a draft token costs 0.3 of a step), not the wall clock,
    # which a loaded machine makes noisy.
    clock = {"now": 0.0}
    execute = engine.executor.execute

    def timed_execute(plan):
        clock["now"] += 1.0 + 0.3 * plan.g
        return execute(plan)

    engine.executor.execute = timed_execute
    scheduler.clock = lambda: clock["now"]
    list(
        scheduler.run(
            build_requests([[5, 6, 7]], config, engine.target_runner.vocab_size, engine.max_context)
        )
    )
    stats = scheduler.stats
    steps = stats.num_steps_per_draft_len
    assert sum(steps) == stats.num_target_calls and len(steps) == 4
    # The probe tries every g; after it, g = 0 dominates (exploration aside).
    assert steps[0] > sum(steps[1:])


class OutOfMemoryExecutor(RecordingExecutor):
    """Runs out of memory on steps over `max_rows` rows (as torch does on a device)."""

    def __init__(self, max_rows: int) -> None:
        super().__init__()
        self.max_rows = max_rows

    def execute(self, plan: StepPlan) -> StepOutcome:
        if plan.num_rows > self.max_rows:
            raise torch.OutOfMemoryError(f"CUDA out of memory ({plan.num_rows} rows)")
        return super().execute(plan)


def test_out_of_memory_is_retried_once_at_half_the_rows():
    config = EngineConfig(verifier=VerifierConfig(method="block", num_draft_tokens=2), max_batch_size=4)
    finished = list(Scheduler(config, OutOfMemoryExecutor(max_rows=2)).run(_requests([5] * 6)))
    assert sorted(request.key for request in finished) == list(range(6))
    assert all(request.output == [5, 5, FILLER_TOKEN, 5, FILLER_TOKEN] for request in finished)
    with pytest.raises(torch.OutOfMemoryError):  # half the rows do not fit either: the caller's error
        list(Scheduler(config, OutOfMemoryExecutor(max_rows=1)).run(_requests([5] * 4)))
