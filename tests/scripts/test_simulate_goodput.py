"""scripts/simulate_goodput.py: goodput against synthetic truths, and what it believed when it chose.

.venv/bin/python -m pytest tests/scripts/test_simulate_goodput.py -q
"""

from __future__ import annotations

import pytest

from scripts import simulate_goodput


def test_choices_record_what_goodput_saw_when_it_exploited():
    choices: list = []
    _, steps = simulate_goodput.run("ray1 B4 T1", 0, {}, choices=choices)
    assert choices and len(choices) <= sum(steps)  # the probe's and exploration's steps are left out
    for g, ratios, tokens in choices:
        assert 0 <= g <= 3 and ratios[0] == 1.0 and tokens[0] == 1.0 and ratios[g] is not None
        # A longer block never costs less (StepCostModel.predict) nor keeps fewer tokens.
        known = [ratio for ratio in ratios if ratio is not None]
        assert known == sorted(known) and tokens == sorted(tokens)
    fixed: list = []
    simulate_goodput.run("ray1 B4 T1", 0, {}, fixed=0, choices=fixed)
    assert fixed == []  # a fixed policy chooses nothing


def test_diagnose_prints_beliefs_beside_the_truth(capsys):
    simulate_goodput.main(["--seeds", "2", "--diagnose"])
    out = capsys.readouterr().out
    assert "true cost ratios [1.0, 1.38, 1.511, 1.579]" in out
    assert "exploiting steps: predicted cost ratios 1.000" in out


def test_outliers_multiply_the_seconds_of_their_steps():
    # Every step an outlier: twice the seconds at the same draws, so half the tokens per second.
    same, _ = simulate_goodput.run("local B4 T0", 3, {}, fixed=1, outliers=(1.0, 1.0))
    doubled, _ = simulate_goodput.run("local B4 T0", 3, {}, fixed=1, outliers=(1.0, 2.0))
    assert doubled == pytest.approx(same / 2.0, rel=1e-12)


def test_the_report_shows_the_lowest_run_and_its_steps(capsys):
    simulate_goodput.main(["--seeds", "3", "--outliers", "0.03", "3"])
    out = capsys.readouterr().out
    assert "(10th percentile 0." in out and "lowest 0." in out and "with steps per g [" in out


def test_optimistic_positions_reach_the_policy(monkeypatch):
    seen = []
    original = simulate_goodput.GoodputPolicy.__init__

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("optimistic_positions", "default"))
        original(self, *args, **kwargs)

    monkeypatch.setattr(simulate_goodput.GoodputPolicy, "__init__", spy)
    simulate_goodput.main(["--seeds", "1", "--optimistic-positions", "0"])
    assert seen and set(seen) == {None}  # 0: the prior at every position
    seen.clear()
    simulate_goodput.main(["--seeds", "1"])
    assert set(seen) == {"default"}


def test_row_settings_reach_every_row_and_change_nothing_else(monkeypatch):
    seen = []
    original = simulate_goodput.RowAcceptance

    def spy(**kwargs):
        seen.append(kwargs)
        return original(**kwargs)

    monkeypatch.setattr(simulate_goodput, "RowAcceptance", spy)
    simulate_goodput.main(["--seeds", "1", "--row-shrinkage", "1e9", "--row-decay", "0.97"])
    assert seen and all(kwargs == {"shrinkage": 1e9, "decay": 0.97} for kwargs in seen)
    seen.clear()
    simulate_goodput.main(["--seeds", "1"])
    assert seen and all(kwargs == {} for kwargs in seen)  # the shipped defaults
    # A row factor held at 1 (infinite shrinkage) chooses as the global rates alone would.
    record = original(shrinkage=1e9)
    record.observe(0, 3.0)
    assert record.factor() == pytest.approx(1.0, abs=1e-8)


def test_the_ray1_b1_t1_cell_is_a_scenario_whose_best_fixed_g_is_2():
    assert simulate_goodput.best_fixed("ray1 B1 T1") == pytest.approx(1.414 / 1.266)
