"""Proposers (engine/proposers.py): n-gram and model+n-gram blocks decode exactly, and the draft's
cache stays in step with the rows whose blocks came from n-grams.

    .venv/bin/python -m pytest tests/engine/test_proposers.py -q
"""

from __future__ import annotations

import pytest
import torch

from distributed_spec.engine import EngineConfig, SpeculativeEngine
from distributed_spec.engine.config import SamplingConfig, SchedulingConfig, VerifierConfig
from distributed_spec.engine.proposers import combine_blocks, ngram_block, point_mass_probs
from distributed_spec.engine.runner import ModelRunner
from distributed_spec.verify import SamplingParams

GREEDY = SamplingParams(temperature=0.0)
MAX_NEW_TOKENS = 32
# Prompts with repeats, so the n-gram proposer has matches from the first step on.
PROMPTS = [[5, 6, 7, 5, 6], [8, 9, 8, 9, 8], [9, 10, 11, 12, 13, 14, 15], [30, 4], [1, 2, 3, 1]]


@pytest.fixture(scope="module")
def autoregressive_outputs(tiny_pair):
    target, _ = tiny_pair
    config = EngineConfig(
        verifier=VerifierConfig(method="autoregressive"),
        sampling=SamplingConfig(temperature=0.0, max_new_tokens=MAX_NEW_TOKENS),
    )
    return [result.token_ids for result in SpeculativeEngine(target, None, config).generate(PROMPTS)]


def test_point_mass_and_combined_blocks():
    ngram_ids = ngram_block([[3, 1], [], [2]])
    assert ngram_ids.tolist() == [[3, 1], [0, 0], [2, 0]]
    probs = point_mass_probs(ngram_ids, 4)
    assert probs.shape == (3, 2, 4) and probs.sum(-1).eq(1).all() and probs[0, 0, 3] == 1
    model_ids = torch.tensor([[7, 7, 7], [5, 6, 4], [7, 7, 7]])
    model_probs = torch.full((3, 3, 8), 1 / 8)
    from_ngram = torch.tensor([True, False, True])
    draft_ids, draft_probs = combine_blocks(ngram_ids, from_ngram, model_ids, model_probs, 8)
    assert draft_ids.tolist() == [[3, 1, 0], [5, 6, 4], [2, 0, 0]]
    assert torch.equal(draft_probs[1], model_probs[1])
    assert torch.equal(draft_probs[0], point_mass_probs(draft_ids[0:1], 8)[0])
    # Without the model: the n-gram block alone.
    alone_ids, alone_probs = combine_blocks(ngram_ids, from_ngram, None, None, 4)
    assert torch.equal(alone_ids, ngram_ids) and torch.equal(alone_probs, probs)


@pytest.mark.parametrize("draft_len_schedule", ["constant", "adaptive", "goodput"])
@pytest.mark.parametrize("method", ["block", "token", "greedy"])
@pytest.mark.parametrize("proposer", ["ngram", "model+ngram"])
def test_greedy_output_equals_greedy_autoregressive(
    tiny_pair, autoregressive_outputs, steady_steps, proposer, method, draft_len_schedule
):
    target, draft = tiny_pair
    config = EngineConfig(
        verifier=VerifierConfig(
            method=method,
            num_draft_tokens=3,
            draft_len_schedule=draft_len_schedule,
            max_draft_len=5,
            proposer=proposer,
        ),
        sampling=SamplingConfig(temperature=0.0, max_new_tokens=MAX_NEW_TOKENS),
        scheduling=SchedulingConfig(prefill_chunk_tokens=3),
        max_batch_size=3,
    )
    engine = SpeculativeEngine(target, draft if proposer == "model+ngram" else None, config)
    results, stats = engine.generate_with_stats(PROMPTS)
    assert [result.token_ids for result in results] == autoregressive_outputs
    extra = stats.extra
    # n-gram blocks were verified, kept in part and rejected in part.
    assert 0 < extra["proposer/accepted_ngram"] < extra["proposer/proposed_ngram"]
    assert (
        sum(value for name, value in extra.items() if name.startswith("proposer/rows_"))
        == stats.num_row_iterations
    )
    if proposer == "ngram":
        assert stats.num_draft_calls == 0 and "proposer/rows_model" not in extra
    else:
        assert extra["proposer/rows_model"] > 0 and 0 < extra["proposer/model_steps"] < stats.num_target_calls


class RecordingRunner(ModelRunner):
    """A ModelRunner that also tracks the token id in each cache slot ([B, L], beside slot_mask)."""

    def reset(self, batch_size: int) -> None:
        super().reset(batch_size)
        self.slot_ids = torch.zeros(batch_size, 0, dtype=torch.long)

    def add_rows(self, prompt_ids):
        num_slots = self.num_slots if self.cache is not None and self.batch_size else 0
        super().add_rows(prompt_ids)
        if self.slot_ids.shape[1] != self.num_slots:  # add_rows started a fresh cache
            self.slot_ids = torch.zeros(self.batch_size - len(prompt_ids), 0, dtype=torch.long)
        assert num_slots == self.num_slots or self.num_slots == 0
        self.slot_ids = torch.cat(
            [self.slot_ids, torch.zeros(len(prompt_ids), self.num_slots, dtype=torch.long)]
        )

    def forward_tokens(self, input_ids, input_mask=None, num_logits=None, max_staged=None):
        staged = [list(chunk) for chunk in self._staged]
        before = self.num_slots
        logits = super().forward_tokens(input_ids, input_mask, num_logits, max_staged)
        num_staged = self.num_slots - before - input_ids.shape[1]
        fed = torch.zeros(self.batch_size, num_staged, dtype=torch.long)
        for row, chunk in enumerate(staged):
            taken = chunk[: len(chunk) - len(self._staged[row])]
            if taken:
                fed[row, num_staged - len(taken) :] = torch.tensor(taken)
        self.slot_ids = torch.cat([self.slot_ids, fed, input_ids.cpu()], dim=1)
        return logits

    def _crop(self, new_len: int) -> None:
        super()._crop(new_len)
        self.slot_ids = self.slot_ids[:, : self.num_slots]

    def drop_rows(self, keep_rows):
        self.slot_ids = self.slot_ids[keep_rows.cpu()]
        super().drop_rows(keep_rows)

    def compact(self) -> None:
        if self.cache is None or self.batch_size == 0:
            return
        new_len = int(self.num_kept_tokens().max())
        order = torch.sort(self.slot_mask, dim=-1, stable=True).indices[:, self.num_slots - new_len :]
        self.slot_ids = torch.gather(self.slot_ids, 1, order.cpu())
        super().compact()

    def kept_tokens(self, row: int) -> list[int]:
        return self.slot_ids[row][self.slot_mask[row].bool().cpu()].tolist()


@pytest.mark.parametrize("draft_len_schedule", ["constant", "goodput"])
def test_draft_cache_holds_every_kept_token_with_ngram_rows(
    tiny_pair, steady_steps, scripted_goodput, monkeypatch, draft_len_schedule
):
    """After every step, per decoding row: the draft's kept slots + its pending input = prompt + output
    (the invariant of sides.py), with blocks from n-grams, from the model, and steps without the model.
    Under goodput the choices are scripted (g, whether the model drafts; every row with a proposal
    takes its n-gram block), so all three kinds of step occur whatever the tiny pair accepts."""
    if draft_len_schedule == "goodput":
        from distributed_spec.engine.goodput import GoodputPolicy

        scripted_goodput([(3, False, True), (0, False, False), (2, False, False), (3, False, True), (1, False, True)] * 200)
        monkeypatch.setattr(GoodputPolicy, "ngram_rows", lambda self, rows, g: [row.max_ngram > 0 for row in rows])
    target, draft = tiny_pair
    config = EngineConfig(
        verifier=VerifierConfig(
            method="block",
            num_draft_tokens=3,
            draft_len_schedule=draft_len_schedule,
            max_draft_len=4,
            proposer="model+ngram",
        ),
        sampling=SamplingConfig(temperature=0.3, max_new_tokens=MAX_NEW_TOKENS, seed=4),
        scheduling=SchedulingConfig(prefill_chunk_tokens=3, compact_fraction=0.3),
        max_batch_size=3,
    )
    engine = SpeculativeEngine(target, draft, config)
    runner = RecordingRunner(draft, config.scheduling.compact_fraction)
    engine.executor.draft.runner = runner
    engine.executor.draft.reset()
    scheduler = engine.scheduler()
    checked = []
    original_record = scheduler._record

    def record_and_check(rows, plan, outcome):
        finished = original_record(rows, plan, outcome)
        side = engine.executor.draft
        for index, request in enumerate(rows):
            if not plan.decoding[index] or runner._staged[index]:
                continue
            pending = side.pending_ids[index][side.pending_mask[index].bool()].tolist()
            assert runner.kept_tokens(index) + pending == request.prompt_ids + request.output
            # The last pending column is the row's Y: the draft's next logits are read there.
            assert side.pending_mask[index, -1] == 1
            from_ngram = bool(plan.from_ngram[index])
            checked.append(
                (from_ngram, from_ngram and plan.num_model_drafts > 0 and outcome.accepted_counts[index] > 0)
            )
        return finished

    scheduler._record = record_and_check
    from distributed_spec.engine.speculative import build_requests

    requests = build_requests(PROMPTS, config, engine.vocab_size, engine.max_context)
    list(scheduler.run(requests))
    # Rows of both kinds, and n-gram rows that kept drafts in a step the model drafted too.
    assert {from_ngram for from_ngram, _ in checked} == {False, True}
    assert any(kept_in_model_step for _, kept_in_model_step in checked)
    assert scheduler.stats.extra["proposer/model_steps"] < scheduler.stats.num_target_calls


def test_steps_of_ngram_blocks_alone_leave_the_draft_idle(
    tiny_pair, autoregressive_outputs, steady_steps, scripted_goodput, monkeypatch
):
    """Under goodput a step of n-gram blocks alone runs no draft forward, not even a catch-up for a
    next step (the schedule repeats its kind of step until it explores): it caught the whole batch up
    after each such step, for nothing while the next was one too. The draft catches up before the
    next model step, and greedy output is unchanged."""
    from distributed_spec.engine.goodput import GoodputPolicy

    # (g, measuring, model_drafts): n-gram steps, then the model drafts, then n-gram steps again.
    scripted_goodput([(2, False, False)] * 6 + [(2, False, True)] * 2 + [(3, False, False)] * 6 + [(2, False, True)] * 200)
    monkeypatch.setattr(GoodputPolicy, "ngram_rows", lambda self, rows, g: [row.max_ngram > 0 for row in rows])
    target, draft = tiny_pair
    config = EngineConfig(
        verifier=VerifierConfig(method="block", draft_len_schedule="goodput", max_draft_len=3, proposer="model+ngram"),
        sampling=SamplingConfig(temperature=0.0, max_new_tokens=MAX_NEW_TOKENS),
        max_batch_size=3,
    )
    engine = SpeculativeEngine(target, draft, config)
    steps = []
    execute = engine.executor.execute

    def recording_execute(plan):
        outcome = execute(plan)
        steps.append((plan, engine.executor.draft.runner.num_forward_calls))
        return outcome

    engine.executor.execute = recording_execute
    results = engine.generate(PROMPTS)
    assert [result.token_ids for result in results] == autoregressive_outputs
    calls = [count for _, count in steps]
    # Each run of n-gram steps verified blocks (a step with none is a g = 0 step) and ran no draft.
    assert any(plan.from_ngram.any() for plan, _ in steps[:6]) and any(plan.from_ngram.any() for plan, _ in steps[8:14])
    assert calls[:6] == [0] * 6 and calls[8:14] == [calls[7]] * 6
    # The model steps drafted (and caught up first).
    assert calls[6] > 0 and calls[14] > calls[13]


@pytest.mark.parametrize("proposer", ["ngram", "model+ngram"])
def test_goodput_sees_and_keeps_each_rows_ngram_limit(tiny_pair, steady_steps, proposer):
    """The goodput schedule is offered, per row, its two limits: the draft model's (its budget; none
    under "ngram") and its n-gram proposal's length; a row verifies no more than its proposal where
    its block is an n-gram one, and a row without a match under "ngram" verifies none."""
    from distributed_spec.engine.ngram import lookup
    from distributed_spec.engine.speculative import build_requests

    target, draft = tiny_pair
    config = EngineConfig(
        verifier=VerifierConfig(
            method="block", draft_len_schedule="goodput", max_draft_len=4, proposer=proposer
        ),
        sampling=SamplingConfig(temperature=0.0, max_new_tokens=MAX_NEW_TOKENS),
        max_batch_size=3,
    )
    engine = SpeculativeEngine(target, draft if proposer == "model+ngram" else None, config)
    scheduler = engine.scheduler()
    offered, planned = [], []
    choose_step = scheduler.goodput.choose_step
    original_plan = scheduler._plan

    def recording_choose(rows, num_rows, debt_per_token=0.0):
        offered.append([(row.max_drafts, row.max_ngram) for row in rows])
        return choose_step(rows, num_rows, debt_per_token)

    def recording_plan(rows, keep_rows, joining):
        plan = original_plan(rows, keep_rows, joining)
        proposals = [
            lookup(request.prompt_ids + request.output, min(request.remaining - 1, 4), 1, 3)
            for request in rows
        ]
        decoding = plan.decoding.tolist()
        limits = [
            (min(request.remaining - 1, 4) if proposer == "model+ngram" else 0, len(tokens))
            for tokens, request, on in zip(proposals, rows, decoding)
            if on
        ]
        if limits:
            assert [(min(model, 4), ngram) for model, ngram in offered[-1]] == limits
        from_ngram = plan.from_ngram.tolist()
        for n, tokens, on, ngram_row in zip(plan.num_draft_tokens.tolist(), proposals, decoding, from_ngram):
            if not on:
                assert n == 0
            elif ngram_row or proposer == "ngram":
                assert n <= len(tokens)
            else:
                assert n <= 4
        planned.append(plan.g)
        return plan

    scheduler.goodput.choose_step = recording_choose
    scheduler._plan = recording_plan
    results = {
        request.key: request.output
        for request in scheduler.run(build_requests(PROMPTS, config, engine.vocab_size, engine.max_context))
    }
    assert max(planned) > 1 and offered
    autoregressive = SpeculativeEngine(
        target,
        None,
        EngineConfig(
            verifier=VerifierConfig(method="autoregressive"),
            sampling=SamplingConfig(temperature=0.0, max_new_tokens=MAX_NEW_TOKENS),
        ),
    ).generate(PROMPTS)
    assert [results[index] for index in range(len(PROMPTS))] == [
        result.token_ids for result in autoregressive
    ]
