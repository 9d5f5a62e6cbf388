"""The draft-length schedules: the adaptive rule and its settings (the step plan: test_scheduler.py).

.venv/bin/python -m pytest tests/engine/test_draft_length.py -q
"""

from __future__ import annotations

import pytest

from distributed_spec import config as job_config
from distributed_spec.engine import EngineConfig, SpeculativeEngine
from distributed_spec.engine.config import SamplingConfig, VerifierConfig
from distributed_spec.engine.draft_length import next_draft_length


@pytest.mark.parametrize(
    ("g", "num_accepted", "num_drafted", "expected"),
    [
        (4, 4, 4, 6),  # whole block kept: +2
        (7, 7, 7, 8),  # ... up to max_draft_len
        (8, 8, 8, 8),
        (4, 3, 4, 3),  # a rejection: -1
        (1, 0, 1, 1),  # ... down to 1
        (2, 2, 6, 4),  # a longer row set the step's length: its own 2 drafts were kept
        (2, 1, 6, 1),
        (4, 2, 2, 6),  # its budget clipped the block to 2 drafts, both kept
    ],
)
def test_adaptive_rule(g, num_accepted, num_drafted, expected):
    assert next_draft_length(g, num_accepted, num_drafted, max_draft_len=8) == expected


def test_bad_schedule_settings_fail_with_the_field_name():
    with pytest.raises(ValueError, match="verifier.draft_len_schedule"):
        EngineConfig(verifier=VerifierConfig(draft_len_schedule="heuristic"))
    with pytest.raises(ValueError, match="verifier.max_draft_len"):
        EngineConfig(
            verifier=VerifierConfig(num_draft_tokens=6, draft_len_schedule="adaptive", max_draft_len=4)
        )
    with pytest.raises(ValueError, match="verifier.draft_len_schedule"):
        job_config.VerifierConfig(draft_len_schedule="heuristic")
    with pytest.raises(ValueError, match="verifier.max_draft_len"):
        job_config.VerifierConfig(num_draft_tokens=6, draft_len_schedule="adaptive", max_draft_len=4)


def test_adaptive_blocks_grow_while_the_draft_is_right(tiny_pair):
    """Draft = target at temperature 0: every block is kept, so g climbs 1, 3, 5, 7, 8, 8, ..."""
    target, _ = tiny_pair
    config = EngineConfig(
        verifier=VerifierConfig(
            method="block", num_draft_tokens=1, draft_len_schedule="adaptive", max_draft_len=8
        ),
        sampling=SamplingConfig(temperature=0.0, max_new_tokens=40),
    )
    results, stats = SpeculativeEngine(target, target, config).generate_with_stats([[5, 6, 7]])
    # Tokens per iteration: 2, 4, 6, 8, 9, 9 (= 38), then the last 2 (g clipped by the budget).
    assert [len(results[0].token_ids), stats.num_target_calls] == [40, 7]
    # Drafts at position i: iterations with g > i (g = 1, 3, 5, 7, 8, 8, then 1).
    assert stats.num_proposed_per_position == [7, 5, 5, 4, 4, 3, 3, 2]
    assert stats.num_accepted_per_position == stats.num_proposed_per_position
