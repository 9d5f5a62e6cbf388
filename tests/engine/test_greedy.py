"""At temperature 0, speculative decoding emits exactly the target's greedy tokens.

.venv/bin/python -m pytest tests/engine/test_greedy.py -q
"""

from __future__ import annotations

import pytest

from distributed_spec.engine import EngineConfig, SpeculativeEngine
from distributed_spec.engine.config import SamplingConfig, SchedulingConfig, VerifierConfig
from distributed_spec.verify import VERIFY_METHODS, SamplingParams

GREEDY = SamplingParams(temperature=0.0)
MAX_NEW_TOKENS = 24
PROMPTS = {1: [[5, 6, 7]], 4: [[5, 6, 7], [8], [9, 10, 11, 12, 13, 14, 15], [30, 4]]}


@pytest.fixture(scope="module")
def autoregressive_outputs(tiny_pair):
    target, _ = tiny_pair
    engine = SpeculativeEngine(
        target,
        None,
        EngineConfig(
            verifier=VerifierConfig(method="autoregressive"),
            sampling=SamplingConfig(temperature=0.0, max_new_tokens=MAX_NEW_TOKENS),
        ),
    )
    return {batch_size: engine.generate(prompts) for batch_size, prompts in PROMPTS.items()}


@pytest.mark.parametrize("draft_len_schedule", ["constant", "adaptive", "goodput"])
@pytest.mark.parametrize("batch_size", [1, 4])
@pytest.mark.parametrize("g", [1, 3, 5])
@pytest.mark.parametrize("method", VERIFY_METHODS)
def test_greedy_speculative_equals_greedy_autoregressive(
    tiny_pair, autoregressive_outputs, steady_steps, method, g, batch_size, draft_len_schedule
):
    target, draft = tiny_pair
    config = EngineConfig(
        verifier=VerifierConfig(
            method=method, num_draft_tokens=g, draft_len_schedule=draft_len_schedule, max_draft_len=6
        ),
        sampling=SamplingConfig(temperature=0.0, max_new_tokens=MAX_NEW_TOKENS),
    )
    results, stats = SpeculativeEngine(target, draft, config).generate_with_stats(PROMPTS[batch_size])
    expected = autoregressive_outputs[batch_size]
    assert [result.token_ids for result in results] == [result.token_ids for result in expected]
    assert all(
        len(result.token_ids) == MAX_NEW_TOKENS and result.finish_reason == "length" for result in results
    )
    # The draft agrees sometimes, but not always: both accept and reject paths were exercised.
    assert 1.0 < stats.block_efficiency < config.verifier.max_num_draft_tokens + 1
    assert 0 < sum(stats.num_accepted_per_position) < sum(stats.num_proposed_per_position)
    assert stats.num_tokens == batch_size * MAX_NEW_TOKENS


@pytest.mark.parametrize("draft_len_schedule", ["constant", "adaptive"])
@pytest.mark.parametrize("method", VERIFY_METHODS)
def test_greedy_with_the_confidence_stop_equals_greedy_autoregressive(
    tiny_pair, autoregressive_outputs, method, draft_len_schedule
):
    """Blocks the draft ends early (its probability of its own token < 0.1) still give the target's tokens."""
    target, draft = tiny_pair
    config = EngineConfig(
        verifier=VerifierConfig(
            method=method,
            num_draft_tokens=5,
            draft_len_schedule=draft_len_schedule,
            draft_confidence_threshold=0.1,
        ),
        sampling=SamplingConfig(temperature=0.0, max_new_tokens=MAX_NEW_TOKENS),
    )
    results, stats = SpeculativeEngine(target, draft, config).generate_with_stats(PROMPTS[4])
    assert [result.token_ids for result in results] == [
        result.token_ids for result in autoregressive_outputs[4]
    ]
    _, full_blocks = SpeculativeEngine(
        target,
        draft,
        EngineConfig(
            verifier=VerifierConfig(method=method, num_draft_tokens=5, draft_len_schedule=draft_len_schedule),
            sampling=SamplingConfig(temperature=0.0, max_new_tokens=MAX_NEW_TOKENS),
        ),
    ).generate_with_stats(PROMPTS[4])
    # The stop ended some blocks early, not all: fewer drafts verified, fewer draft forwards run.
    assert 0 < stats.num_proposed_per_position[1] < stats.num_proposed_per_position[0]
    if draft_len_schedule == "constant":
        # (The other schedules choose later blocks' lengths from what was kept: not comparable.)
        assert sum(stats.num_proposed_per_position) < sum(full_blocks.num_proposed_per_position)
        assert stats.num_draft_calls < full_blocks.num_draft_calls


def test_autoregressive_stats_count_one_target_call_per_token(tiny_pair, autoregressive_outputs):
    target, _ = tiny_pair
    engine = SpeculativeEngine(
        target,
        None,
        EngineConfig(
            verifier=VerifierConfig(method="autoregressive"),
            sampling=SamplingConfig(temperature=0.0, max_new_tokens=MAX_NEW_TOKENS),
        ),
    )
    _, stats = engine.generate_with_stats(PROMPTS[4])
    assert stats.num_target_calls == MAX_NEW_TOKENS
    assert stats.num_draft_calls == 0
    assert stats.block_efficiency == 1.0


@pytest.mark.parametrize("compact_fraction", [0.05, 1.0])
def test_cache_compaction_policy_does_not_change_tokens(tiny_pair, autoregressive_outputs, compact_fraction):
    """0.05: the caches compact after almost every iteration; 1.0: never (holes accumulate)."""
    target, draft = tiny_pair
    config = EngineConfig(
        verifier=VerifierConfig(method="block", num_draft_tokens=4),
        sampling=SamplingConfig(temperature=0.0, max_new_tokens=MAX_NEW_TOKENS),
        scheduling=SchedulingConfig(compact_fraction=compact_fraction),
    )
    engine = SpeculativeEngine(target, draft, config)
    compactions = []
    original_compact = engine.target_runner.compact

    def counting_compact():
        compactions.append(engine.target_runner.num_slots)
        original_compact()

    engine.target_runner.compact = counting_compact
    results = engine.generate(PROMPTS[4])
    assert [result.token_ids for result in results] == [
        result.token_ids for result in autoregressive_outputs[4]
    ]
    assert (len(compactions) > 3) == (compact_fraction < 1.0)


def test_single_token_prompts_decode_like_the_baseline(tiny_pair):
    target, draft = tiny_pair
    prompts = [[5], [9], [30]]
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=10)
    expected = SpeculativeEngine(
        target, None, EngineConfig(VerifierConfig(method="autoregressive"), sampling)
    ).generate(prompts)
    results, stats = SpeculativeEngine(
        target, draft, EngineConfig(VerifierConfig(method="token", num_draft_tokens=2), sampling)
    ).generate_with_stats(prompts)
    assert [result.token_ids for result in results] == [result.token_ids for result in expected]
    assert stats.num_tokens == 30


def _record_steps(engine, read):
    """Wrap the engine's executor: returns the list each step's (plan, read(engine)) goes to."""
    steps = []
    execute = engine.executor.execute

    def recording_execute(plan):
        outcome = execute(plan)
        steps.append((plan, read(engine)))
        return outcome

    engine.executor.execute = recording_execute
    return steps


def test_the_draft_idles_through_autoregressive_steps_and_catches_up_exactly(
    tiny_pair, autoregressive_outputs, scripted_goodput
):
    """goodput at g = 0 leaves the draft idle (no forward); when a later step drafts, the draft first
    feeds what it missed (rows that joined meanwhile included) and greedy output is unchanged."""
    # Steps 1-8 and 13-20 autoregressive, the others g = 3: long debts, rows joining in between.
    debts = scripted_goodput([(g, False) for g in [0] * 8 + [3] * 4 + [0] * 8 + [3] * 100])
    target, draft = tiny_pair
    config = EngineConfig(
        verifier=VerifierConfig(method="block", draft_len_schedule="goodput", max_draft_len=3),
        sampling=SamplingConfig(temperature=0.0, max_new_tokens=MAX_NEW_TOKENS),
        max_batch_size=2,
    )
    engine = SpeculativeEngine(target, draft, config)
    draft_calls = _record_steps(engine, lambda engine: engine.executor.draft.runner.num_forward_calls)
    results = engine.generate(PROMPTS[4])
    assert [result.token_ids for result in results] == [result.token_ids for result in autoregressive_outputs[4]]
    # No draft forward in the autoregressive steps; catch-up forwards ran and were timed apart.
    calls = [count for _, count in draft_calls]
    assert calls[:8] == [0] * 8 and calls[12:20] == [calls[11]] * 8
    assert engine.executor.draft.catch_up_s > 0
    # The debt goodput is offered: the prompts at first, one more token per row and step without the
    # draft (and one fewer token left), nothing once the draft has drafted (no row has joined since).
    assert debts[0] > 0 and all(later > earlier for earlier, later in zip(debts[:8], debts[1:8]))
    assert debts[9] == 0


@pytest.mark.parametrize("proposer", ["model", "model+ngram"])
@pytest.mark.parametrize("prefill_chunk_tokens", [None, 2])
def test_a_probe_drafts_for_a_few_rows_and_the_draft_catches_up_those_alone(
    tiny_pair, autoregressive_outputs, scripted_goodput, proposer, prefill_chunk_tokens
):
    """goodput's measurement steps (the probe, exploration) draft for probe_rows rows; the other rows
    verify no draft and the draft neither feeds nor catches them up until a step drafts for them.
    Greedy output is unchanged, rows still taking in their prompt included."""
    # (g, measuring) per step: probes at g = 2 and 3 between autoregressive steps, then g = 1 for all.
    pattern = [(0, True)] * 3 + [(2, True)] * 3 + [(0, False)] * 2 + [(3, True)] * 2 + [(1, False)] * 100
    scripted_goodput(pattern, probe_rows=1)
    target, draft = tiny_pair
    config = EngineConfig(
        verifier=VerifierConfig(method="block", draft_len_schedule="goodput", max_draft_len=3, proposer=proposer),
        sampling=SamplingConfig(temperature=0.0, max_new_tokens=MAX_NEW_TOKENS),
        scheduling=SchedulingConfig(prefill_chunk_tokens=prefill_chunk_tokens),
        max_batch_size=4,
    )
    engine = SpeculativeEngine(target, draft, config)
    steps = _record_steps(engine, lambda engine: engine.executor.draft.runner.num_kept_tokens().tolist())
    results = engine.generate(PROMPTS[4])
    assert [result.token_ids for result in results] == [result.token_ids for result in autoregressive_outputs[4]]
    probes = [(plan, kept) for plan, kept in steps if plan.draft_rows is not None]
    assert probes, "no step drafted for a subset of rows"
    for plan, _ in probes:
        model_rows = plan.decoding & (plan.num_draft_tokens > 0)
        if plan.from_ngram is not None:
            model_rows &= ~plan.from_ngram
        # One model row drafts; the rows outside verify nothing the model drafted.
        assert int(plan.draft_rows.sum()) == 1 and bool((model_rows & ~plan.draft_rows).sum() == 0)
    # The draft idled through the first steps; the first probe fed its drafting row alone.
    first_plan, kept = probes[0]
    assert all((count > 0) == on for count, on in zip(kept, first_plan.draft_rows.tolist()))
