"""The goodput schedule's parts: the step-cost model and the acceptance estimate it chooses from.

.venv/bin/python -m pytest tests/engine/test_goodput.py -q
"""

from __future__ import annotations

import random

from distributed_spec.engine.goodput import AcceptanceEstimate, GoodputPolicy, RowAcceptance, StepCostModel

# Seconds per step at B = 1 by g, as measured on 2 CPU cores for the default pair (bf16).
STEP_SECONDS = {0: 0.0435, 1: 0.054, 2: 0.057}
# Per-position acceptance of the default pair at T = 1 (docs/RESULTS.md): g = 2 pays ~1.1x.
TRUE_RATES = (0.35, 0.2)


def _simulate(optimism: float, num_steps: int = 300) -> list[int]:
    """A B = 1 run: the first six drafted positions are all rejected (bad luck), then verdicts
    follow TRUE_RATES. Returns the steps per g."""
    policy = GoodputPolicy(max_draft_len=2, optimism=optimism)
    rng = random.Random(0)
    record = RowAcceptance()
    steps = [0, 0, 0]
    num_unlucky = 6
    for _ in range(num_steps):
        g = policy.choose_step([(8, record)], 1)
        steps[g] += 1
        accepted = 0
        while accepted < g and num_unlucky == 0 and rng.random() < TRUE_RATES[accepted]:
            accepted += 1
        num_unlucky = max(num_unlucky - g, 0)
        record.observe(accepted, policy.predicted_accepted(g))
        policy.observe_acceptance([g], [accepted])
        policy.observe_step(1, g, STEP_SECONDS[g])
    return steps


def _steps_per_g(
    num_rows: int, step_seconds: dict[int, float], keep_rate: float, debt_per_token: float = 0.0
) -> list[int]:
    """A 200-step run at B = num_rows, max_draft_len 1: each drafted row keeps its token with
    keep_rate. With a debt, each drafting step's probe rows catch up 4 rows x 60 tokens at 0.5 ms."""
    policy = GoodputPolicy(max_draft_len=1)
    rng = random.Random(0)
    records = [RowAcceptance() for _ in range(num_rows)]
    steps = [0, 0]
    for _ in range(200):
        g = policy.choose_step([(8, record) for record in records], num_rows, debt_per_token)
        steps[g] += 1
        accepted = [int(g > 0 and rng.random() < keep_rate) for _ in records]
        for record, kept in zip(records, accepted):
            record.observe(kept, policy.predicted_accepted(g))
        policy.observe_acceptance([g] * num_rows, accepted)
        policy.observe_step(num_rows, g, step_seconds[g])
        if g > 0 and debt_per_token > 0:
            policy.observe_catch_up(0.12, 240)
    return steps


def test_early_rejections_do_not_stop_drafting_for_good():
    """With the mean alone, six unlucky rejections at start-up keep the policy at g = 0 (seen in a
    B = 1 job run); the optimistic prior (the default's extra kept verdicts) brings it back to
    drafting, where the goodput is."""
    greedy = _simulate(optimism=0.0)
    assert greedy[0] > 0.8 * sum(greedy)
    optimistic = _simulate(optimism=GoodputPolicy(max_draft_len=2).optimism)
    assert optimistic[1] + optimistic[2] > 0.6 * sum(optimistic)


def test_cells_learn_from_steps_that_feed_prompts():
    """Where rows join at most steps, the cells still follow the cost: the prompt slots' share is
    estimated against the cell and taken off."""
    model = StepCostModel()
    model.observe(16, 1, 0.100, step=0)
    rng = random.Random(0)
    for step in range(1, 60):
        # The (16, 1) step got slower (0.100 -> 0.150); nine steps in ten also feed 10-80 prompt
        # slots at 1 ms each.
        num_prompt_slots = 0 if step % 10 == 0 else rng.randint(10, 80)
        model.observe(16, 1, 0.150 + num_prompt_slots * 0.001, step=step, num_prompt_slots=num_prompt_slots)
    assert abs(model.predict(16, 1) - 0.150) < 0.01
    assert abs(model.seconds_per_prompt_slot - 0.001) < 0.0003


# Seconds per step at B = 16 by g (2 CPU cores, default pair, bf16: docs/RESULTS.md): a g = 1 step
# costs ~1.48x a g = 0 step while the pair keeps ~0.44 of first draft tokens, so drafting loses.
STEP_SECONDS_B16 = {0: 0.063, 1: 0.093, 2: 0.121, 3: 0.150, 4: 0.178}


def test_the_probe_stops_climbing_once_goodput_falls():
    """At B = 16 g = 1 loses to g = 0 (and g = 2 to g = 1) once measured, so the dearer g = 3 and 4
    steps are never probed; the policy settles on g = 0, re-measuring its neighbour g = 1 now and then."""
    policy = GoodputPolicy(max_draft_len=4)
    rng = random.Random(0)
    records = [RowAcceptance() for _ in range(16)]
    steps = [0] * 5
    for _ in range(200):
        g = policy.choose_step([(8, record) for record in records], 16)
        steps[g] += 1
        accepted = [0] * 16
        for row in range(16):
            while accepted[row] < g and rng.random() < (0.44, 0.3, 0.25, 0.2)[accepted[row]]:
                accepted[row] += 1
            records[row].observe(accepted[row], policy.predicted_accepted(g))
        policy.observe_acceptance([g] * 16, accepted)
        policy.observe_step(16, g, STEP_SECONDS_B16[g])
    assert steps[3] == steps[4] == 0
    assert steps[0] > 0.85 * sum(steps)


def test_a_stale_cell_follows_the_drift_of_the_exploited_one():
    """Steps slow down as contexts grow, whatever g: a g = 1 cell measured at the start and a g = 0
    cell exploited since, twice as slow by now, still compare at their true ratio 1.5 (without the
    shared drift the stale cell read 0.75x the fresh one, and g = 1 looked like a bargain)."""
    model = StepCostModel()
    for step in range(4):
        model.observe(16, step % 2, (0.060, 0.090)[step % 2], step=step)
    for step in range(4, 104):
        model.observe(16, 0, 0.060 * (1.0 + (step - 4) / 100), step=step)
    assert abs(model.predict(16, 1) / model.predict(16, 0) - 1.5) < 0.1
    assert abs(model.predict(16, 0) - 0.119) < 0.01


def test_the_drafts_debt_is_priced_per_token_the_rows_have_left():
    """At B = 4 where g = 1 pays (T(4, 1) / T(4, 0) = 1.2 against ~1.45 tokens per row), a draft that
    owes each row its 200-token prompt is worth catching up for rows with 400 tokens to go, not for
    rows with 2 left: the debt's share of a step is c_catch x sum_r D_r E_r / R_r."""
    policy = GoodputPolicy(max_draft_len=1, optimism=0.0)
    for _ in range(4):
        policy.observe_step(4, 0, 0.050)
        policy.observe_step(4, 1, 0.060)
    policy.observe_acceptance([1] * 40, [1] * 18 + [0] * 22)
    # Measured catch-ups: 2000 draft tokens in 0.1 s (50 us each).
    policy.observe_catch_up(0.1, 2000)
    assert abs(policy.catch_up.seconds_per_token - 5e-5) < 1e-12
    rows = [(8, RowAcceptance()) for _ in range(4)]
    assert policy.choose_step(rows, 4) == 1
    assert policy.choose_step(rows, 4, debt_per_token=4 * 200 / 400) == 1
    assert policy.choose_step(rows, 4, debt_per_token=4 * 200 / 2) == 0


def test_a_neighbour_that_clearly_loses_is_not_re_measured():
    """At B = 16 with T(16, 1) / T(16, 0) = 1.6 (2 cores, docs/RESULTS.md) and 0.44 of first drafts
    kept, g = 1 loses by ~10%: once measured confident_samples times (the probe's two steps, then
    re-measurements every 24 steps) it is not re-measured again (each such step cost a step's worth
    of tokens); at B = 4, where g = 0 and 1 are close, the neighbours still are."""

    assert _steps_per_g(16, {0: 0.063, 1: 0.100}, 0.44)[1] == GoodputPolicy(max_draft_len=1).confident_samples
    at_b4 = _steps_per_g(4, {0: 0.050, 1: 0.070}, 0.44)
    assert at_b4[0] > 2 and at_b4[1] > 2


def test_measurement_steps_are_flagged_for_the_scheduler():
    """`measuring` marks the probe's steps and the re-measurements of a neighbour (the scheduler lets
    only probe_rows rows draft in them), never a step that exploits the best g."""
    policy = GoodputPolicy(max_draft_len=1, explore_every=10, explore_margin=1.0)
    rows = [(8, RowAcceptance()) for _ in range(16)]
    flags = []
    for _ in range(30):
        g = policy.choose_step(rows, 16)
        flags.append((g, policy.measuring))
        policy.observe_acceptance([g] * 16, [0] * 16)
        policy.observe_step(16, g, STEP_SECONDS_B16[g])
    assert flags[:4] == [(0, True), (0, True), (1, True), (1, True)]
    assert [(step, g) for step, (g, measuring) in enumerate(flags, start=1) if measuring][4:] == [(10, 1), (20, 1), (30, 1)]
    assert all(g == 0 for g, measuring in flags[4:] if not measuring)


def test_a_near_tie_is_not_tipped_towards_drafting():
    """Ray at B = 4 (2 cores, docs/RESULTS.md): T(4, 1) / T(4, 0) = 1.39, and 49 of 140 first drafts
    kept (0.35), so g = 1 loses by 3%. The optimistic prior lifts that rate to 0.36 and the policy
    stays at g = 0; the standard-error bound it replaced read 0.39 and drafted."""
    policy = GoodputPolicy(max_draft_len=1)
    for _ in range(2):
        policy.observe_step(4, 0, 0.0717)
        policy.observe_step(4, 1, 0.0994)
    policy.observe_acceptance([1] * 140, [1] * 49 + [0] * 91)
    assert policy.choose_step([(8, RowAcceptance()) for _ in range(4)], 4) == 0


def test_an_optimistic_prior_lifts_few_verdicts_not_many():
    """Four rejections leave a first-position rate drafting can come back from; 400 verdicts at 0.35
    move by under 0.01."""
    estimate = AcceptanceEstimate(max_draft_len=1, decay=1.0)
    estimate.observe([1] * 4, [0] * 4)
    assert estimate.rates()[0] < 0.11 and estimate.rates(optimism=2.0)[0] > 0.35
    estimate.observe([1] * 400, [1] * 140 + [0] * 260)
    assert 0.0 < estimate.rates(optimism=2.0)[0] - estimate.rates()[0] < 0.01


def test_a_longer_block_never_costs_less_than_a_shorter_one():
    """At B = 1 a g = 3 cell read low by noise (40 ms) beside g = 2 (47 ms): g = 3 is predicted at no
    less than g = 2, so it does not win on the noise; cells below stay their own."""
    model = StepCostModel()
    for step, (g, seconds) in enumerate([(0, 0.034), (0, 0.034), (2, 0.047), (2, 0.047), (3, 0.040), (3, 0.040)]):
        model.observe(1, g, seconds, step=step)
    assert abs(model.predict(1, 3) - 0.047) < 1e-9
    assert abs(model.predict(1, 2) - 0.047) < 1e-9
    assert abs(model.predict(1, 0) - 0.034) < 1e-9


def test_a_cell_mispriced_at_start_up_is_corrected():
    """Ray at B = 4: g = 0 truly costs 71.7 ms and g = 1 99.4 ms for 1.34 tokens per row (g = 0 wins by
    3.5%), but both start-up g = 0 steps read 88 ms (noise). The mispriced cell is re-measured until
    measured confident_samples times, and each re-measurement's surprise goes to the cell (not to the
    drift, which the exploited cell's next steps would move back): the policy returns to g = 0. Before
    both, it stayed at g = 1 for good."""
    policy = GoodputPolicy(max_draft_len=1, optimism=0.0)
    rng = random.Random(0)
    records = [RowAcceptance() for _ in range(4)]
    steps = [0, 0]
    for step in range(400):
        g = policy.choose_step([(8, record) for record in records], 4)
        steps[g] += 1
        accepted = [int(g > 0 and rng.random() < 0.34) for _ in records]
        for record, kept in zip(records, accepted):
            record.observe(kept, policy.predicted_accepted(g))
        policy.observe_acceptance([g] * 4, accepted)
        policy.observe_step(4, g, 0.088 if step < 2 else (0.0717, 0.0994)[g])
    assert steps[0] > 0.6 * sum(steps)
    assert abs(policy.cost.predict(4, 0) / policy.cost.predict(4, 1) - 0.0717 / 0.0994) < 0.03


def test_a_draining_batch_does_not_re_measure_at_every_new_size():
    """A draining batch meets a new B at every finish. A g never measured at that B is judged on its
    prediction (from the nearest B): at B = 15, g = 1 predicted to lose ~8% is not re-measured."""
    policy = GoodputPolicy(max_draft_len=1, explore_every=1)
    for _ in range(policy.confident_samples):
        policy.observe_step(16, 0, STEP_SECONDS_B16[0])
        policy.observe_step(16, 1, STEP_SECONDS_B16[1])
    policy.observe_acceptance([1] * 400, [1] * 140 + [0] * 260)
    rows = [(8, RowAcceptance()) for _ in range(15)]
    assert policy.choose_step(rows, 15) == 0 and not policy.measuring


def test_a_block_that_cannot_win_at_any_cost_is_not_measured_again():
    """B = 32 on 2 cores: T(32, 1) / T(32, 0) = 1.8, and the draft owes every row its ~60-token
    prompt with ~30 tokens to go. Once the first g = 1 step has priced the catch-up, g = 1 cannot win
    even at g = 0's cost, so neither the probe's second step nor the re-measurements of a
    seldom-measured neighbour are run. Without the debt it is measured confident_samples times."""
    step_seconds = {0: 0.065, 1: 0.117}
    assert _steps_per_g(32, step_seconds, 0.5)[1] == GoodputPolicy(max_draft_len=1).confident_samples
    assert _steps_per_g(32, step_seconds, 0.5, debt_per_token=32 * 60 / 30)[1] == 1


def test_one_slow_step_does_not_capture_a_cell():
    """The host now and then takes 3x a step's time (a prompt joining, a slow spell). Among a cell's
    first steps (the median of its first robust_samples) such a step changes nothing; after them, it
    moves the cell as a step clip_ratio x its prediction would, not 3x. A plain mean of the first six
    read 1.33x the cost, enough to keep a g out of reach for good."""
    model = StepCostModel()
    for step, seconds in enumerate([0.050, 0.150, 0.050, 0.050, 0.050, 0.050]):
        model.observe(4, 0, seconds, step=step)
    assert abs(model.predict(4, 0) - 0.050) < 0.001
    # After them: the slow step also moves the shared drift (by at most max_drift_step x drift_rate),
    # so the cell's own mean, net of the drift, is what to look at.
    cell = model.measured(4, 0)
    before = cell.mean_seconds
    model.observe(4, 0, 0.150, step=6)
    rate = 1.0 / (model.robust_samples + 1)
    assert before < cell.mean_seconds <= before * (1.0 + rate * (model.clip_ratio - 1.0)) + 1e-12


def test_a_slow_step_that_fed_prompts_is_not_clipped():
    """Clipping compares a step with what its cell predicts at that step's prompt load: a step that
    costs 3x because rows joined is no outlier, and the cell's T(B, g) stays where it is."""
    model = StepCostModel()
    for step in range(40):
        num_prompt_slots = 100 if step % 4 == 3 else 0
        model.observe(4, 0, 0.050 + 0.001 * num_prompt_slots, step=step, num_prompt_slots=num_prompt_slots)
    assert abs(model.seconds_per_prompt_slot - 0.001) < 0.00005
    assert abs(model.predict(4, 0) - 0.050) < 0.001


def test_exploration_re_measures_a_seldom_measured_g_that_is_no_neighbour():
    """Ray, B = 4: both start-up g = 0 steps read 30% high, so the probe climbed to g = 3 and the
    policy exploited it; exploration then re-measured only g = 2, the best's neighbour, and g = 0,
    truly the best, was never measured again (a seed of docs/RESULTS.md's grid held g = 3 for 140 of
    177 steps). A g measured fewer than confident_samples times is re-measured too, neighbour or not:
    the oldest first."""
    policy = GoodputPolicy(max_draft_len=3, explore_every=1)
    for _ in range(2):
        policy.observe_step(4, 0, 0.065)
    for g, seconds in ((1, 0.069), (2, 0.075), (3, 0.080)):
        for _ in range(policy.confident_samples):
            policy.observe_step(4, g, seconds)
    policy.observe_acceptance([3] * 400, [3] * 130 + [2] * 40 + [1] * 60 + [0] * 170)
    rows = [(8, RowAcceptance()) for _ in range(4)]
    assert policy.choose_step(rows, 4) == 0 and policy.measuring
    assert policy.best == 3


def test_the_optimistic_prior_lifts_only_the_first_positions():
    """The default pair keeps little deep in a block (at B = 1, T = 0: 0.32, 0.14 and 0.02 of rows at
    positions 1, 2, 3). Position 3 is verified only in g = 3 steps, so it has few verdicts, and two
    optimistic ones there lifted its rate from ~0.01 to ~0.14: g = 3 then looked worth 0.13 tokens
    more than g = 2 and won its near-ties (the simulation's B = 1 runs: 1.66-1.72 expected tokens
    at g = 3 against a true 1.48). The first two positions, which decide whether drafting pays at
    all, keep the lift."""
    policy = GoodputPolicy(max_draft_len=3, acceptance=AcceptanceEstimate(3, decay=1.0))
    # 100 rows that drafted 2 (32 kept the first token, 14 both), 12 that drafted 3 (none kept all 3).
    policy.observe_acceptance([2] * 100, [2] * 14 + [1] * 18 + [0] * 68)
    policy.observe_acceptance([3] * 12, [2] * 2 + [1] * 2 + [0] * 8)
    rows = [(8, RowAcceptance())]
    third = policy.expected_tokens(rows, 3) - policy.expected_tokens(rows, 2)
    assert 0.0 < third < 0.02
    everywhere = GoodputPolicy(max_draft_len=3, optimistic_positions=None, acceptance=policy.acceptance)
    assert everywhere.expected_tokens(rows, 3) - everywhere.expected_tokens(rows, 2) > 0.1
    lifted, plain = policy.acceptance.rates(policy.optimism, 2), policy.acceptance.rates()
    # The third moves only through its weak prior (half the lifted second rate), not by a lift of its own.
    assert lifted[0] > plain[0] and lifted[1] > plain[1] and abs(lifted[2] - plain[2]) < 0.001


def test_ngram_only_steps_are_priced_in_cells_of_their_own():
    """A step of n-gram blocks alone skips the draft's forwards: its (B, g) cell is not the model's,
    g = 0 is one cell for both, and an unmeasured B is predicted from the same kind of cell."""
    model = StepCostModel()
    for step in range(4):
        model.observe(1, 0, 0.040, step=3 * step)
        model.observe(1, 2, 0.060, step=3 * step + 1)
        model.observe(1, 2, 0.046, step=3 * step + 2, model=False)
    assert abs(model.predict(1, 2) - 0.060) < 1e-6
    assert abs(model.predict(1, 2, model=False) - 0.046) < 1e-6
    assert model.predict(1, 0, model=True) == model.predict(1, 0, model=False)
    assert model.predict(1, 1, model=False) is None
    model.observe(4, 0, 0.080, step=20)
    # Twice the plain step at B = 4: the n-gram cell scales with it.
    assert abs(model.predict(4, 2, model=False) - 0.092) < 1e-6


def test_an_unmeasured_ngram_step_is_the_models_step_without_the_drafts_share():
    """Never measured at any B, an n-gram step of width g costs the model's step of that g less the
    share the draft's forwards took of it (the target's [B, g + 1] forward is in both); once measured,
    its own cell."""
    model = StepCostModel()
    for step in range(4):
        model.observe(16, 0, 0.040, step=2 * step)
        model.observe(16, 1, 0.070, step=2 * step + 1, draft_seconds=0.007)
    assert abs(model.predict(16, 1, model=False) - 0.063) < 1e-6
    # From the nearest B that measured the model's g (scaled by the plain steps), with its share.
    model.observe(32, 0, 0.080, step=10)
    assert abs(model.predict(32, 1, model=False) - 0.126) < 1e-6
    # No share reported (or no model cell of that g): unknown, so the probe measures it.
    assert model.predict(16, 2, model=False) is None
    for step in range(2):
        model.observe(16, 1, 0.050, step=20 + step, model=False)
    assert abs(model.predict(16, 1, model=False) - 0.050) < 1e-6


def _batch_steps(num_steps, verify_seconds):
    """goodput over B = 16 rows, half with a 3-token n-gram proposal each step. A step costs 40 ms
    at g = 0, verify_seconds more per draft token, and the model's blocks 7 ms per token on top; n-gram
    blocks keep half their first token, the model's a third. Returns (g, model_drafts) per step."""
    policy = GoodputPolicy(max_draft_len=3)
    rng = random.Random(3)
    records = [RowAcceptance() for _ in range(16)]
    steps = []
    for _ in range(num_steps):
        rows = [(8, record, 3 * (index % 2)) for index, record in enumerate(records)]
        g = policy.choose_step(rows, 16)
        model = policy.model_drafts
        steps.append((g, model))
        use_ngram = policy.ngram_rows(rows, g)
        drafts = [min(g, 3) if ngram else (min(g, 8) if model else 0) for ngram in use_ngram]
        kept = [int(n > 0 and rng.random() < (0.5 if ngram else 0.33)) for n, ngram in zip(drafts, use_ngram)]
        policy.observe_acceptance(drafts, kept, use_ngram)
        seconds = 0.040 + verify_seconds * g
        if model and g > 0:
            policy.observe_step(16, g, seconds + 0.007 * g, draft_seconds=0.007 * g)
        else:
            policy.observe_step(16, g, seconds, model=False)
    return steps


def test_no_ngram_probe_where_the_models_step_shows_it_cannot_pay():
    """At a large batch the model's g = 1 step already prices the n-gram one (less the draft's share):
    where that cannot pay, no step measures it (the probe took two such steps per g, each dearer than
    the rows it served: B = 16 and 32 in docs/RESULTS.md). Where it pays, goodput takes it."""
    steps = _batch_steps(120, verify_seconds=0.023)
    assert not any(g > 0 and not model for g, model in steps)
    # Verification at 4 ms a token: an n-gram step (44 ms for 16 + 8 x 0.5 tokens) beats a plain one.
    steps = _batch_steps(120, verify_seconds=0.004)
    assert sum(g > 0 and not model for g, model in steps) > 100


def test_acceptance_is_kept_per_proposer():
    """Verdicts of n-gram blocks and of the model's blocks go to their own rates."""
    policy = GoodputPolicy(max_draft_len=2)
    policy.observe_acceptance([2] * 20, [2] * 18 + [0] * 2, [True] * 20)
    policy.observe_acceptance([2] * 20, [0] * 18 + [1] * 2, [False] * 20)
    assert policy.predicted_accepted(2, ngram=True) > 1.5
    assert policy.predicted_accepted(2) < 0.3


def test_a_row_takes_the_block_expected_to_keep_more():
    """In a step the model drafts, a row with an n-gram proposal takes it where it is expected to keep
    more than the model's block, the model's block otherwise; if no row would take the model's block,
    every row does (such a step must run the model: it is measured and priced as one)."""
    policy = GoodputPolicy(max_draft_len=3)
    policy.observe_acceptance([3] * 40, [3] * 36 + [0] * 4, [True] * 40)
    policy.observe_acceptance([3] * 40, [1] * 10 + [0] * 30, [False] * 40)
    rows = [(8, RowAcceptance(), 3), (8, RowAcceptance(), 0), (8, RowAcceptance(), 1)]
    policy.model_drafts = True
    # The n-gram proposals keep more: its rows take them (a one-token proposal as well, at g = 3).
    assert policy.ngram_rows(rows, 3) == [True, False, True]
    policy.model_drafts = False
    assert policy.ngram_rows(rows, 3) == [True, False, True]
    assert policy.expected_tokens(rows, 3, model=False) < policy.expected_tokens(rows, 3, model=True)
    # Every row with a proposal: a model step would give every one the model's block.
    policy.model_drafts = True
    assert policy.ngram_rows(rows[:1], 3) == [False]
    worse = GoodputPolicy(max_draft_len=3)
    worse.observe_acceptance([3] * 40, [0] * 40, [True] * 40)
    worse.observe_acceptance([3] * 40, [3] * 20 + [0] * 20, [False] * 40)
    worse.model_drafts = True
    assert worse.ngram_rows(rows, 3) == [False, False, False]


def _simulate_proposers(ngram_rates, model_rates, policy_kind, num_steps=800):
    """A B = 1 run with the n-gram proposer beside the draft: the row has a 3-token proposal in half
    of its steps. A step costs 40 ms + 3 ms per verified position + 6 ms per draft token the model
    drafts. policy_kind: "goodput", ("ngram-first", g) (n-gram block whenever there is one, the
    model's g otherwise: model+ngram at fixed g) or ("model", g) (the draft alone).
    Returns (tokens per second, n-gram-only steps among steps with a proposal)."""
    policy = GoodputPolicy(max_draft_len=3)
    rng = random.Random(1)
    record = RowAcceptance()
    tokens = seconds = 0.0
    ngram_steps = match_steps = 0
    for _ in range(num_steps):
        proposal = 3 if rng.random() < 0.5 else 0
        if policy_kind == "goodput":
            g = policy.choose_step([(8, record, proposal)], 1)
            use_ngram = policy.ngram_rows([(8, record, proposal)], g)[0]
            model_drafts = policy.model_drafts and not use_ngram
        else:
            kind, g = policy_kind
            use_ngram = kind == "ngram-first" and proposal > 0
            model_drafts = not use_ngram
        num_drafts = min(g, proposal) if use_ngram else (g if model_drafts else 0)
        rates = ngram_rates if use_ngram else model_rates
        accepted = 0
        while accepted < num_drafts and rng.random() < rates[accepted]:
            accepted += 1
        step_s = 0.040 + 0.003 * num_drafts + (0.006 * num_drafts if model_drafts else 0.0)
        tokens += 1 + accepted
        seconds += step_s
        match_steps += proposal > 0
        ngram_steps += proposal > 0 and use_ngram and not model_drafts
        record.observe(accepted, policy.predicted_accepted(num_drafts, ngram=use_ngram))
        policy.observe_acceptance([num_drafts], [accepted], [use_ngram])
        policy.observe_step(1, num_drafts, step_s, model=model_drafts and num_drafts > 0)
    return tokens / seconds, ngram_steps / max(match_steps, 1)


def test_goodput_prices_ngram_blocks_apart_from_the_models():
    """Where n-gram blocks keep well and cost no draft forward (code, repeats), goodput serves rows
    with a proposal by n-gram steps; where they keep little (sampling at T = 1), by the model's block.
    Either way it is within 3% of the best fixed policy, with or without the n-gram proposer."""
    fixed = [("ngram-first", g) for g in (1, 2, 3)] + [("model", g) for g in (0, 1, 2, 3)]
    for ngram_rates, model_rates, ngram_share in (
        ((0.8, 0.7, 0.6), (0.35, 0.2, 0.1), (0.9, 1.0)),
        ((0.1, 0.05, 0.05), (0.5, 0.4, 0.3), (0.0, 0.1)),
    ):
        best = max(_simulate_proposers(ngram_rates, model_rates, kind)[0] for kind in fixed)
        rate, share = _simulate_proposers(ngram_rates, model_rates, "goodput")
        assert rate >= 0.97 * best
        assert ngram_share[0] <= share <= ngram_share[1]
