"""The iteration steps keep both caches equal to a fresh forward over the kept tokens.

    .venv/bin/python -m pytest tests/engine/test_steps.py -q

Drives propose -> score -> verify -> commit by hand for several iterations on a batch of 3 and, after
every commit, checks that the next logits of target and draft (fed Y, and X_g for rows that accepted
the whole block) equal those of a fresh forward over each row's kept sequence, to 1e-5. Both the
rejection path and the all-accepted path (X_g re-fed to the draft) must occur.
"""

from __future__ import annotations

import pytest
import torch

from distributed_spec.engine import ModelRunner, commit_draft, commit_target, propose, score
from distributed_spec.verify import SamplingParams, draw_uniforms, verify_logits

ATOL = 1e-5
GAMMA = 3


def _fresh_last_logits(model, token_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([token_ids])).logits[0, -1]


@pytest.mark.parametrize("confidence_threshold", [0.0, 0.1])
def test_commit_leaves_both_caches_at_the_kept_prefix(tiny_pair, confidence_threshold):
    """0.1: the draft's confidence stop ends some rows' blocks early (ragged n) and sometimes all of
    them (a block shorter than g)."""
    target_model, draft_model = tiny_pair
    target, draft = ModelRunner(target_model), ModelRunner(draft_model)
    sampling = SamplingParams(temperature=1.0)
    generator = torch.Generator().manual_seed(0)
    sequences = [[5, 6, 7], [8], [9, 10, 11, 12, 13]]
    target.prefill([sequence[:-1] for sequence in sequences])
    draft.prefill([sequence[:-1] for sequence in sequences])
    last_ids = torch.tensor([sequence[-1] for sequence in sequences])
    draft_input_ids, draft_input_mask = last_ids[:, None], torch.ones(3, 1, dtype=torch.long)
    seen_counts, seen_lengths, seen_widths = set(), set(), set()
    for _ in range(8):
        draft_uniforms = torch.rand(3, GAMMA, generator=generator, dtype=torch.float64)
        draft_ids, draft_probs, num_drafted = propose(
            draft, draft_input_ids, draft_input_mask, GAMMA, sampling, draft_uniforms,
            confidence_threshold=confidence_threshold,
        )
        width = draft_ids.shape[1]
        seen_lengths.update(num_drafted.tolist())
        seen_widths.add(width)
        assert int(num_drafted.max()) == width
        target_logits = score(target, last_ids, draft_ids)
        uniforms = draw_uniforms(3, width, generator)
        verified = verify_logits("token", draft_ids, draft_probs, target_logits, num_drafted, uniforms, sampling)
        commit_target(target, verified.accepted_counts, width)
        draft_input_ids, draft_input_mask = commit_draft(
            draft, draft_ids, verified.accepted_counts, verified.next_tokens
        )
        for row, tau in enumerate(verified.accepted_counts.tolist()):
            seen_counts.add(tau)
            sequences[row] += draft_ids[row, :tau].tolist() + [verified.next_tokens[row].item()]
        last_ids = verified.next_tokens
        # Probe both caches without committing the probe.
        target_logits = target.forward_tokens(last_ids[:, None])[:, 0]
        target.rollback(torch.zeros(3, dtype=torch.long), 1)
        draft_logits = draft.forward_tokens(draft_input_ids, draft_input_mask)[:, -1]
        draft.rollback(torch.zeros(3, dtype=torch.long), draft_input_ids.shape[1])
        for row, sequence in enumerate(sequences):
            torch.testing.assert_close(
                target_logits[row], _fresh_last_logits(target_model, sequence), atol=ATOL, rtol=0
            )
            torch.testing.assert_close(
                draft_logits[row], _fresh_last_logits(draft_model, sequence), atol=ATOL, rtol=0
            )
        assert target.num_kept_tokens().tolist() == [len(sequence) - 1 for sequence in sequences]
    if confidence_threshold == 0:
        assert 0 in seen_counts and GAMMA in seen_counts and seen_lengths == {GAMMA}
    else:
        assert len(seen_lengths) > 1 and min(seen_widths) < GAMMA and max(seen_counts) > 0
