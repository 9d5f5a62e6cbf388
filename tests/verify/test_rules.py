"""The batched torch verifiers against the exact oracle: decisions, distributions, numerics."""

import math
from collections import Counter

import pytest
import torch

from distributed_spec.verify import (
    SamplingParams,
    VerifyUniforms,
    block_acceptance_probs,
    block_accepted_counts,
    draw_uniforms,
    logits_to_probs,
    verify,
)
from distributed_spec.verify.rules import _on_path
from tests.verify import oracle
from tests.verify.batched import chi_square_p_value, dense_table, sample_block_inputs

# Each chi-square test fails by chance with probability 1e-4 (fixed seeds make reruns identical).
FALSE_ALARM_RATE = 1e-4


def _outcome_counts(output, draft_ids, num_draft_tokens) -> Counter:
    counts = Counter()
    # Host sync: the test tallies outcomes in Python.
    for n, tau, tokens, y in zip(
        num_draft_tokens.tolist(),
        output.accepted_counts.tolist(),
        draft_ids.tolist(),
        output.next_tokens.tolist(),
    ):
        counts[(n, tau, tuple(tokens[:tau]) + (y,))] += 1
    return counts


@pytest.mark.parametrize("method", ["block", "token"])
@pytest.mark.parametrize(("vocab_size", "g"), [(3, 2), (4, 3)])
def test_sampled_outcomes_match_oracle_with_ragged_rows(method, vocab_size, g):
    p = oracle.RandomTable(vocab_size, seed=7, concentration=0.8)
    q = oracle.RandomTable(vocab_size, seed=8, concentration=0.8)
    context = (1,)
    generator = torch.Generator().manual_seed(0)
    num_rows = 120_000
    draft_ids, draft_probs, target_probs = sample_block_inputs(
        dense_table(p, context, vocab_size, g),
        dense_table(q, context, vocab_size, g),
        num_rows,
        g,
        generator,
    )
    num_draft_tokens = torch.randint(0, g + 1, (num_rows,), generator=generator)
    uniforms = draw_uniforms(num_rows, g, generator)
    output = verify(method, draft_ids, draft_probs, target_probs, num_draft_tokens, uniforms)
    counts = _outcome_counts(output, draft_ids, num_draft_tokens)
    for n in range(g + 1):
        expected = (
            {(0, (y,)): prob for y, prob in enumerate(p(context))}
            if n == 0
            else oracle.iteration_outcomes(method, p, q, context, n)
        )
        observed = Counter({(tau, tokens): c for (row_n, tau, tokens), c in counts.items() if row_n == n})
        p_value = chi_square_p_value(observed, expected, sum(observed.values()))
        assert p_value > FALSE_ALARM_RATE, (method, n, p_value)


@pytest.mark.parametrize("method", ["block", "token"])
def test_sampling_detects_a_wrong_distribution(method):
    """Control: the same statistics reject outcomes checked against the other rule's oracle."""
    p = oracle.constant_table([0.2, 0.5, 0.3])
    q = oracle.constant_table([0.6, 0.1, 0.3])
    generator = torch.Generator().manual_seed(1)
    draft_ids, draft_probs, target_probs = sample_block_inputs(
        dense_table(p, (), 3, 3), dense_table(q, (), 3, 3), 100_000, 3, generator
    )
    n = torch.full((100_000,), 3)
    output = verify(method, draft_ids, draft_probs, target_probs, n, draw_uniforms(100_000, 3, generator))
    counts = Counter(
        {(tau, tokens): c for (_, tau, tokens), c in _outcome_counts(output, draft_ids, n).items()}
    )
    other = "token" if method == "block" else "block"
    assert chi_square_p_value(counts, oracle.iteration_outcomes(other, p, q, (), 3), 100_000) < 1e-6


@pytest.mark.parametrize("method", ["block", "token"])
def test_toy_case_by_sampling(method):
    """Sun et al. toy case sampled with the real verifier: E[tau] within 4 standard errors."""
    p, q = oracle.constant_table([1 / 3, 2 / 3]), oracle.constant_table([2 / 3, 1 / 3])
    generator = torch.Generator().manual_seed(2)
    num_rows = 400_000
    draft_ids, draft_probs, target_probs = sample_block_inputs(
        dense_table(p, (), 2, 2), dense_table(q, (), 2, 2), num_rows, 2, generator
    )
    output = verify(method, draft_ids, draft_probs, target_probs, None, draw_uniforms(num_rows, 2, generator))
    accepted = output.accepted_counts.double()
    expected = {"token": 10 / 9, "block": 11 / 9}[method]
    standard_error = accepted.std().item() / math.sqrt(num_rows)
    assert abs(accepted.mean().item() - expected) < 4 * standard_error


@pytest.mark.parametrize("draft", ["random", "point_mass"])
@pytest.mark.parametrize("method", ["block", "token"])
def test_decisions_match_oracle_for_identical_uniforms(method, draft):
    """Deterministic: tau and Y equal what the oracle's h (or acceptance) and residual dictate; also
    for point-mass q (the n-gram proposer's)."""
    generator = torch.Generator().manual_seed(3)
    vocab_size, g = 5, 4
    for seed in range(30):
        p = oracle.RandomTable(vocab_size, seed=300 + seed, concentration=0.6)
        q = oracle.RandomTable(vocab_size, seed=400 + seed, concentration=0.6)
        if draft == "point_mass":
            q = oracle.point_mass_table(vocab_size, lambda prefix, seed=seed: hash((seed, prefix)) % vocab_size)
        draft_ids, draft_probs, target_probs = sample_block_inputs(
            dense_table(p, (), vocab_size, g), dense_table(q, (), vocab_size, g), 64, g, generator
        )
        uniforms = draw_uniforms(64, g, generator)
        output = verify(method, draft_ids, draft_probs, target_probs, None, uniforms)
        for row in range(64):
            tau, y, margin = oracle.decide(
                method,
                p,
                q,
                tuple(draft_ids[row].tolist()),
                uniforms.eta[row].tolist(),
                uniforms.u[row].item(),
            )
            assert output.accepted_counts[row].item() == tau, (seed, row)
            # Only compare away from a CDF boundary, where float32 inputs could round either way.
            if margin > 1e-5:
                assert output.next_tokens[row].item() == y, (seed, row)


def test_block_scan_equals_the_full_residual_computation():
    """verify_block skips Z_i where eta_i >= r_i; tau must equal h from every Z_i (ragged rows, r = 1 rows)."""
    generator = torch.Generator().manual_seed(11)
    batch_size, g, vocab_size = 96, 8, 1000
    target_logits = torch.randn(batch_size, g + 1, vocab_size, generator=generator) * 2
    draft_logits = (
        target_logits[:, :g] + torch.randn(batch_size, g, vocab_size, generator=generator) * 0.5
    )
    draft_logits[: batch_size // 4] = target_logits[: batch_size // 4, :g]  # q = p: r = 1 throughout
    params = SamplingParams(temperature=1.0, top_k=50)  # zeros in p and q
    target_probs, draft_probs = logits_to_probs(target_logits, params), logits_to_probs(draft_logits, params)
    draft_ids = torch.multinomial(draft_probs.view(-1, vocab_size), 1, generator=generator).view(
        batch_size, g
    )
    num_draft_tokens = torch.randint(0, g + 1, (batch_size,), generator=generator)
    for _ in range(5):
        uniforms = draw_uniforms(batch_size, g, generator)
        output = verify("block", draft_ids, draft_probs, target_probs, num_draft_tokens, uniforms)
        r = block_acceptance_probs(_on_path(target_probs, draft_ids), _on_path(draft_probs, draft_ids))
        all_masses = (
            (target_probs[:, 1:-1] * r[:, :-1, None].float() - draft_probs[:, 1:]).clamp(min=0).sum(-1)
        )
        expected = block_accepted_counts(r, all_masses, num_draft_tokens, uniforms.eta)
        assert torch.equal(output.accepted_counts, expected)
        assert (output.accepted_counts <= num_draft_tokens).all()


@pytest.mark.parametrize("method", ["block", "token", "greedy"])
def test_one_hot_inputs_reduce_to_greedy(method):
    generator = torch.Generator().manual_seed(4)
    batch_size, g, vocab_size = 256, 5, 7
    target_ids = torch.randint(0, vocab_size, (batch_size, g + 1), generator=generator)
    draft_ids = torch.where(
        torch.rand(batch_size, g, generator=generator) < 0.7,
        target_ids[:, :g],
        torch.randint(0, vocab_size, (batch_size, g), generator=generator),
    )
    target_probs = torch.nn.functional.one_hot(target_ids, vocab_size).float()
    draft_probs = torch.nn.functional.one_hot(draft_ids, vocab_size).float()
    num_draft_tokens = torch.randint(0, g + 1, (batch_size,), generator=generator)
    output = verify(
        method,
        draft_ids,
        draft_probs,
        target_probs,
        num_draft_tokens,
        draw_uniforms(batch_size, g, generator),
    )
    expected_tau = []
    for row in range(batch_size):
        tau = 0
        while tau < num_draft_tokens[row] and draft_ids[row, tau] == target_ids[row, tau]:
            tau += 1
        expected_tau.append(tau)
    assert output.accepted_counts.tolist() == expected_tau
    assert torch.equal(output.next_tokens, target_ids[torch.arange(batch_size), output.accepted_counts])
    assert torch.equal(output.accepted_mask.sum(1), output.accepted_counts)


@pytest.mark.parametrize("method", ["block", "token"])
def test_warped_distributions_match_oracle(method):
    """top-k / top-p / temperature applied to both models, then verified: outcomes follow the oracle on
    the warped tables."""
    vocab_size, g = 6, 2
    params = SamplingParams(temperature=0.8, top_k=4, top_p=0.9)
    logits_p = oracle.RandomTable(vocab_size, seed=11)
    logits_q = oracle.RandomTable(vocab_size, seed=12)

    def warped(table):
        return lambda prefix: (
            logits_to_probs(torch.tensor(table(prefix)).log() * 3.0, params).double().tolist()
        )

    p, q = warped(logits_p), warped(logits_q)
    assert sum(x == 0.0 for x in p(())) >= 2  # top-k removed tokens
    generator = torch.Generator().manual_seed(5)
    num_rows = 100_000
    draft_ids, draft_probs, target_probs = sample_block_inputs(
        dense_table(p, (), vocab_size, g),
        dense_table(q, (), vocab_size, g),
        num_rows,
        g,
        generator,
    )
    output = verify(
        method, draft_ids, draft_probs, target_probs, None, draw_uniforms(num_rows, g, generator)
    )
    counts = Counter(
        {
            (tau, tokens): c
            for (_, tau, tokens), c in _outcome_counts(
                output, draft_ids, torch.full((num_rows,), g)
            ).items()
        }
    )
    assert (
        chi_square_p_value(counts, oracle.iteration_outcomes(method, p, q, (), g), num_rows)
        > FALSE_ALARM_RATE
    )


def test_logits_to_probs_matches_reference_warp():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    probs = logits_to_probs(logits, SamplingParams(temperature=0.5, top_k=3))
    reference = torch.softmax(torch.tensor([4.0, 2.0, 1.0]), 0)
    assert torch.allclose(probs[0, :3], reference) and torch.all(probs[0, 3:] == 0)
    # top_p: softmax(logits) = [.58, .21, .13, .05, .02, .00]: 0.75 keeps the two largest.
    probs = logits_to_probs(logits, SamplingParams(top_p=0.75))
    assert torch.all(probs[0, 2:] == 0) and torch.allclose(probs[0, :2], torch.softmax(logits[0, :2], 0))
    # temperature 0 is greedy.
    assert logits_to_probs(logits, SamplingParams(temperature=0.0)).tolist() == [[1.0, 0, 0, 0, 0, 0]]
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1.0)


@pytest.mark.parametrize("method", ["block", "token", "greedy"])
@pytest.mark.parametrize("bad_value", [float("nan"), float("inf")])
def test_non_finite_inputs_raise(method, bad_value):
    generator = torch.Generator().manual_seed(6)
    draft_probs = torch.rand(2, 3, 5, generator=generator).softmax(-1)
    target_probs = torch.rand(2, 4, 5, generator=generator).softmax(-1)
    target_probs[1, 2, 3] = bad_value
    with pytest.raises(ValueError, match="NaN or inf"):
        verify(
            method,
            torch.zeros(2, 3, dtype=torch.long),
            draft_probs,
            target_probs,
            None,
            draw_uniforms(2, 3, generator),
        )


def test_zero_draft_probability_and_zero_residual_give_valid_tokens():
    # q(X_1) = 0 < p(X_1): r_1 = 1. p == q at later positions: residual mass zero, h = 1.
    target_probs = torch.tensor([[[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [0.2, 0.3, 0.5]]])
    draft_probs = torch.tensor([[[1.0, 0.0, 0.0], [0.2, 0.3, 0.5]]])
    draft_ids = torch.tensor([[1, 2]])
    for eta in ([0.99, 0.99], [0.0, 0.0], [0.5, 0.999]):
        uniforms = VerifyUniforms(
            eta=torch.tensor([eta], dtype=torch.float64), u=torch.tensor([0.999999], dtype=torch.float64)
        )
        for method in ("block", "token"):
            output = verify(method, draft_ids, draft_probs, target_probs, None, uniforms)
            assert output.accepted_counts.item() == 2
            assert 0 <= output.next_tokens.item() < 3


def test_no_draft_tokens_samples_from_the_target():
    target_probs = torch.tensor([[[0.0, 1.0, 0.0], [0.3, 0.3, 0.4]]])
    output = verify(
        "block",
        torch.tensor([[2]]),
        torch.tensor([[[0.0, 0.0, 1.0]]]),
        target_probs,
        torch.tensor([0]),
        draw_uniforms(1, 1, torch.Generator().manual_seed(0)),
    )
    assert output.accepted_counts.item() == 0 and output.next_tokens.item() == 1


def test_bad_shapes_and_methods_raise():
    uniforms = draw_uniforms(1, 2)
    with pytest.raises(ValueError, match="verifier.method"):
        verify(
            "typical",
            torch.zeros(1, 2, dtype=torch.long),
            torch.ones(1, 2, 4) / 4,
            torch.ones(1, 3, 4) / 4,
            None,
            uniforms,
        )
    with pytest.raises(ValueError, match="target_probs must be"):
        verify(
            "block",
            torch.zeros(1, 2, dtype=torch.long),
            torch.ones(1, 2, 4) / 4,
            torch.ones(1, 2, 4) / 4,
            None,
            uniforms,
        )
    with pytest.raises(ValueError, match="num_draft_tokens"):
        verify(
            "block",
            torch.zeros(1, 2, dtype=torch.long),
            torch.ones(1, 2, 4) / 4,
            torch.ones(1, 3, 4) / 4,
            torch.tensor([3]),
            uniforms,
        )
    with pytest.raises(ValueError, match="draft_ids"):
        verify(
            "token", torch.full((1, 2), 9), torch.ones(1, 2, 4) / 4, torch.ones(1, 3, 4) / 4, None, uniforms
        )


def test_seeded_uniforms_are_reproducible():
    a = draw_uniforms(4, 3, torch.Generator().manual_seed(9))
    b = draw_uniforms(4, 3, torch.Generator().manual_seed(9))
    assert torch.equal(a.eta, b.eta) and torch.equal(a.u, b.u)
