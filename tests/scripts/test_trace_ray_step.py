"""scripts/trace_ray_step.py: Ray timeline events into per-method phase medians and hand-off gaps."""

import pytest

from scripts.trace_ray_step import critical_gaps, task_phases


def _event(cat: str, tid: str, ts: float, dur: float) -> dict:
    return {"cat": cat, "name": cat, "tid": tid, "ts": ts, "dur": dur, "ph": "X"}


def _step(tid: str, method: str, start: float, load: float, run: float, store: float) -> list[dict]:
    """One actor task as Ray's timeline shows it: the method's event around its three phases (us)."""
    return [
        _event(f"task::{method}", tid, start, load + run + store),
        _event("task:deserialize_arguments", tid, start, load),
        _event("task:execute", tid, start + load, run),
        _event("task:store_outputs", tid, start + load + run, store),
    ]


def test_phases_go_to_the_method_around_them_and_gaps_follow_the_critical_path():
    # Two iterations: the draft's commit (old runtime), its step, then the shard; times in us.
    events = []
    for start in (1_000_000, 2_000_000):
        events += _step("draft", "DraftWorker.commit", start - 50_000, 100, 200, 50)
        events += _step("draft", "DraftWorker.step", start, 500, 5_000, 600)
        events += _step("shard", "TargetShard.score_and_verify", start + 6_100 + 1_500, 400, 60_000, 300)
    events.append(_event("submit_task", "driver", 1_000_000, 700))
    events.append(_event("submit_task", "driver", 10, 9_000))  # before the measured run: left out

    phases = task_phases(events, since_us=900_000)
    assert phases["DraftWorker.step"] == {"deserialize_arguments": 0.5, "execute": 5.0, "store_outputs": 0.6}
    assert phases["DraftWorker.commit"]["execute"] == 0.2
    assert phases["TargetShard.score_and_verify"]["execute"] == 60.0
    assert phases["driver"] == {"submit_task": 0.7}

    gaps = critical_gaps(events, since_us=900_000)
    assert gaps["DraftWorker.step -> TargetShard.score_and_verify"] == 1.5
    # The shard ends at start + 68.3 ms; the next step starts at start + 1 s (the commit between
    # them is no step method: it is inside the gap).
    assert gaps["TargetShard.score_and_verify -> DraftWorker.step"] == pytest.approx(1_000 - 68.3)


def test_pickle_cost_times_both_encodings_of_one_request():
    from scripts.trace_ray_step import pickle_cost

    costs = pickle_cost(batch_size=3, g=2, repeats=2)
    assert set(costs) == {"numpy", "torch"} and all(cost > 0 for cost in costs.values())
