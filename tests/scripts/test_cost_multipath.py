"""scripts/cost_multipath.py: its step pieces leave the runners as they found them, and its report's arithmetic.

.venv/bin/python -m pytest tests/scripts/test_cost_multipath.py -q
"""

from __future__ import annotations

import json
from types import SimpleNamespace

from distributed_spec.engine.runner import ModelRunner
from distributed_spec.models.tiny import perturbed_copy, tiny_llama
from scripts import cost_multipath


def test_step_pieces_run_for_every_cell_and_restore_the_batch(monkeypatch):
    """Every (K, g) piece forks to B*K rows and back: one that left B*K rows behind would make the next
    piece's forward fail (ModelRunner checks its rows), one that left slots would grow the context."""
    target = SimpleNamespace(model=tiny_llama(vocab_size=1100, hidden=16))
    draft = SimpleNamespace(model=perturbed_copy(target.model))
    slots = []
    forward = ModelRunner.forward_tokens

    def watched(runner, input_ids, *args, **kwargs):
        slots.append((runner.batch_size, runner.num_slots))
        return forward(runner, input_ids, *args, **kwargs)

    monkeypatch.setattr(ModelRunner, "forward_tokens", watched)
    costs = cost_multipath.step_costs(target, draft, batch_size=2, context_tokens=12, repeats=2)
    assert set(costs["target"]) == set(costs["draft"]) == set(costs["verify"]) == {
        (k, g) for k in cost_multipath.PATH_COUNTS for g in cost_multipath.DRAFT_LENS
    }
    assert costs["autoregressive"] > 0 and all(s > 0 for s in costs["verify"].values())
    # No piece leaves slots behind: over 3 rounds of 25 pieces a leak would grow the context far past
    # the deepest piece's own slots (the draft's g - 1 forwards after feeding one token).
    assert slots[0] == (2, 0) and max(num_slots for _, num_slots in slots) <= 12 + max(cost_multipath.DRAFT_LENS)


def test_report_bounds_the_speedup_by_block_efficiency_over_cost(tmp_path):
    grid = tmp_path / "results.json"
    rows = [
        {"task": "all", "proposer": "model", "num_paths": k, "g": 2, "temperature": 1.0, "batch_size": 1,
         "block_efficiency": be, "speedup": speedup}
        for k, be, speedup in ((1, 1.5, 1.1), (8, 1.8, 0.8))
    ]  # fmt: skip
    grid.write_text(json.dumps({"rows": rows, "measurements": []}))
    cells = cost_multipath.grid_rows(grid, 1.0, 1)
    costs = {
        "autoregressive": 0.040,
        "target": {(1, 2): 0.044, (8, 2): 0.060},
        "draft": {(1, 2): 0.006, (8, 2): 0.010},
        "verify": {(1, 2): 0.002, (8, 2): 0.010},
    }
    text = cost_multipath.report(costs, cells)
    # K = 1: c = 52 / 40 = 1.30, bound 1.5 / 1.3 = 1.15. K = 8: c = 80 / 40 = 2.00, bound 1.8 / 2 = 0.90,
    # and it would need 1.5 x 2.0 / 1.3 = 2.308 to match K = 1.
    assert "| 1 | 2 | 1.10 | 0.15 | 0.05 | 1.30 | 1.500 | 1.15 | 1.10 | 1.500 |" in text
    assert "| 8 | 2 | 1.50 | 0.25 | 0.25 | 2.00 | 1.800 | 0.90 | 0.80 | 2.308 |" in text
