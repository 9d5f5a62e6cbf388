"""The algorithms themselves, checked exactly by enumeration (tests/verify/oracle.py)."""

import itertools
from fractions import Fraction

import pytest

from tests.verify import oracle

TOY_TARGET = [1 / 3, 2 / 3]
TOY_DRAFT = [2 / 3, 1 / 3]


@pytest.mark.parametrize("method", ["token", "block"])
@pytest.mark.parametrize(
    ("vocab_size", "g", "length"),
    [(2, 1, 4), (3, 1, 3), (3, 2, 4), (3, 3, 4), (4, 2, 3), (3, 4, 5), (5, 2, 3)],
)
def test_lossless_sequence_distribution(method, vocab_size, g, length):
    """Theorem 1: repeated iterations produce exactly the target's sequence distribution."""
    for seed in range(3):
        p = oracle.RandomTable(vocab_size, seed=100 + seed, concentration=0.7)
        q = oracle.RandomTable(vocab_size, seed=200 + seed, concentration=0.7)
        context = (seed % vocab_size,)
        speculative = oracle.speculative_sequence_distribution(method, p, q, context, g, length)
        target = oracle.target_sequence_distribution(p, context, length)
        assert abs(sum(speculative.values()) - 1.0) < 1e-9
        assert oracle.total_variation(speculative, target) < 1e-9


@pytest.mark.parametrize("method", ["token", "block"])
@pytest.mark.parametrize("rule", ["confidence", "last_token", "context_hash"])
def test_lossless_with_draft_side_stops(method, rule):
    """Blocks that end early on a rule of the drafted prefix, as the engine's confidence stop does
    (q_i(X_i) < threshold), are still lossless for both verifiers."""
    for seed in range(3):
        p = oracle.RandomTable(4, seed=300 + seed, concentration=0.5)
        q = oracle.RandomTable(4, seed=400 + seed, concentration=0.5)
        stop = {
            "confidence": lambda prefix, q=q: q(prefix[:-1])[prefix[-1]] < 0.5,
            "last_token": lambda prefix: prefix[-1] == 1,
            "context_hash": lambda prefix: hash(prefix) % 3 == 0,
        }[rule]
        target = oracle.target_sequence_distribution(p, (0,), 3)
        for g in (2, 3, 4):
            speculative = oracle.speculative_sequence_distribution(method, p, q, (0,), g, 3, stop)
            assert oracle.total_variation(speculative, target) < 1e-9
        # The rule does end some blocks early (else this test would only repeat the one above).
        ends = [stop((0,) + prefix) for n in (1, 2) for prefix in itertools.product(range(4), repeat=n)]
        assert 0 < sum(ends) < len(ends)


@pytest.mark.parametrize("method", ["token", "block"])
def test_lossless_with_a_history_dependent_block_length(method):
    """g chosen per iteration from what was generated before it (the adaptive schedule's kind of rule)."""
    p = oracle.RandomTable(3, seed=500, concentration=0.7)
    q = oracle.RandomTable(3, seed=600, concentration=0.7)
    speculative = oracle.speculative_sequence_distribution(method, p, q, (0,), lambda ctx: 1 + sum(ctx) % 3, 4)
    assert oracle.total_variation(speculative, oracle.target_sequence_distribution(p, (0,), 4)) < 1e-9


@pytest.mark.parametrize("method", ["token", "block"])
def test_lossless_with_the_goodput_schedule(method):
    """The goodput schedule's g (0 included) from its learned acceptance rates and a measured cost
    model, replayed from each path's history: still exactly the target's sequence distribution."""
    from distributed_spec.engine.goodput import GoodputPolicy, RowAcceptance

    # A cost model where a longer block costs more, so the choice really depends on the verdicts
    # (steep enough that two rejections outweigh the optimistic prior of a short history).
    seconds = {0: 1.0, 1: 1.6, 2: 2.1, 3: 2.5}

    def policy(ctx, history):
        goodput = GoodputPolicy(max_draft_len=3, explore_every=0, min_samples=1)
        for g in seconds:
            goodput.observe_step(1, g, seconds[g])
        record = RowAcceptance()
        for g, tau in history:
            goodput.observe_acceptance([g], [tau])
            record.num_accepted += tau
            record.num_predicted += goodput.predicted_accepted(g)
        return goodput.choose_step([(3, record)], 1)

    p = oracle.RandomTable(3, seed=700, concentration=0.7)
    q = oracle.RandomTable(3, seed=800, concentration=0.7)
    choices = {policy((0,), history) for history in [(), ((3, 0),), ((3, 3), (3, 3)), ((1, 0), (2, 0), (3, 0))]}
    assert len(choices) > 1, "the policy must react to the history for this test to mean anything"
    speculative = oracle.policy_sequence_distribution(method, p, q, (0,), policy, 4)
    assert oracle.total_variation(speculative, oracle.target_sequence_distribution(p, (0,), 4)) < 1e-9


@pytest.mark.parametrize("method", ["token", "block"])
def test_lossless_with_goodput_choosing_between_ngram_and_model_blocks(method):
    """The goodput schedule with the n-gram proposer beside the draft: each iteration's g, whether the
    model drafts, and which block serves the row come from the history (verdicts per proposer, a
    measured cost model with n-gram-only cells) and the context's n-gram proposal, never from the
    current block's verdict: still exactly the target's sequence distribution."""
    from distributed_spec.engine.goodput import GoodputPolicy, GoodputRow, RowAcceptance
    from distributed_spec.engine.ngram import lookup

    model_seconds = {0: 1.0, 1: 1.6, 2: 2.1, 3: 2.5}
    ngram_seconds = {1: 1.2, 2: 1.4, 3: 1.6}
    p = oracle.RandomTable(3, seed=1700, concentration=0.5)
    q = oracle.RandomTable(3, seed=1800, concentration=0.5)
    context = (0, 1, 2, 0, 1)

    def policy(ctx, history):
        goodput = GoodputPolicy(max_draft_len=3, explore_every=0, min_samples=1)
        for g, seconds in model_seconds.items():
            goodput.observe_step(1, g, seconds)
        for g, seconds in ngram_seconds.items():
            goodput.observe_step(1, g, seconds, model=False)
        record = RowAcceptance()
        for g, tau, source in history:
            goodput.observe_acceptance([g], [tau], [source == "ngram"])
            record.observe(tau, goodput.predicted_accepted(g, ngram=source == "ngram"))
        # Bigrams only, so some contexts have no proposal.
        proposal = tuple(lookup(list(ctx), 3, 2, 2))
        row = GoodputRow(3, record, len(proposal))
        g = goodput.choose_step([row], 1)
        if g > 0 and goodput.ngram_rows([row], g)[0]:
            block = proposal[: min(g, len(proposal))]
            return len(block), "ngram", oracle.block_table(3, ctx, block)
        return (g if goodput.model_drafts else 0), "model", q

    choices = {
        policy(context + tail, history)[:2]
        for tail in [(), (2,), (1, 1)]
        for history in [(), ((2, 0, "ngram"),) * 3 + ((3, 3, "model"),) * 2, ((2, 2, "ngram"), (1, 0, "model"))]
    }
    sources = {source for g, source in choices if g > 0}
    assert sources == {"model", "ngram"} and len(choices) > 2, "the choice must depend on history and context"
    speculative = oracle.sourced_policy_sequence_distribution(method, p, context, policy, 4)
    assert oracle.total_variation(speculative, oracle.target_sequence_distribution(p, context, 4)) < 1e-9


@pytest.mark.parametrize("method", ["token", "block"])
@pytest.mark.parametrize(("vocab_size", "g"), [(2, 2), (3, 3), (4, 2)])
def test_lossless_with_point_mass_drafts(method, vocab_size, g):
    """q a point mass at a token chosen from the prefix (a draft that names its tokens): still exact."""
    for seed in range(3):
        p = oracle.RandomTable(vocab_size, seed=900 + seed, concentration=0.7)
        q = oracle.point_mass_table(vocab_size, lambda prefix, seed=seed: hash((seed, prefix)) % vocab_size)
        speculative = oracle.speculative_sequence_distribution(method, p, q, (0,), g, 4)
        assert oracle.total_variation(speculative, oracle.target_sequence_distribution(p, (0,), 4)) < 1e-9
        # Both verdicts occur: the point mass is kept sometimes and rejected sometimes.
        taus = {tau for tau, _ in oracle.iteration_outcomes(method, p, q, (0,), g)}
        assert 0 in taus and len(taus) > 1


@pytest.mark.parametrize("method", ["token", "block"])
@pytest.mark.parametrize(("min_n", "max_n", "g"), [(1, 2, 2), (1, 3, 3), (2, 3, 3)])
def test_lossless_with_ngram_blocks(method, min_n, max_n, g):
    """The engine's n-gram proposer (engine/ngram.py) names each block from the context so far,
    empty when nothing matches: the sequence distribution is still exactly the target's."""
    from distributed_spec.engine.ngram import lookup

    p = oracle.RandomTable(3, seed=950 + g, concentration=0.5)
    context = (0, 1, 2, 0, 1)

    def propose(ctx):
        return tuple(lookup(list(ctx), g, min_n, max_n))

    speculative = oracle.proposer_sequence_distribution(method, p, context, propose, 4)
    assert abs(sum(speculative.values()) - 1.0) < 1e-9
    assert oracle.total_variation(speculative, oracle.target_sequence_distribution(p, context, 4)) < 1e-9
    # Blocks of several lengths, none included, were proposed along the way.
    lengths = {len(propose(context + tail)) for tail in itertools.product(range(3), repeat=2)}
    assert len(lengths) > 1 and (0 in lengths or min_n == 1)


def test_oracle_detects_a_lossy_verifier():
    """Control: the same check flags a verifier that draws the correction from p, so it can fail."""
    p = oracle.RandomTable(3, seed=1)
    q = oracle.RandomTable(3, seed=2)
    speculative = oracle.speculative_sequence_distribution("lossy", p, q, (0,), 2, 3)
    assert oracle.total_variation(speculative, oracle.target_sequence_distribution(p, (0,), 3)) > 1e-3


def test_toy_case_expected_accepted_tokens():
    """Sun et al. toy case: 10/9 accepted draft tokens with token verification, 11/9 with block."""
    p, q = oracle.constant_table(TOY_TARGET), oracle.constant_table(TOY_DRAFT)
    token = oracle.expected_accepted("token", p, q, (), 2)
    block = oracle.expected_accepted("block", p, q, (), 2)
    assert abs(token - float(Fraction(10, 9))) < 1e-12
    assert abs(block - float(Fraction(11, 9))) < 1e-12


def test_block_never_worse_than_token():
    """Theorem 2 on 120 random instances: E[tau] of block >= token, strictly on most."""
    strictly_better = 0
    instances = 0
    for seed in range(40):
        for vocab_size, g in [(3, 2), (4, 3), (3, 4)]:
            p = oracle.RandomTable(vocab_size, seed=1000 + seed, concentration=0.5)
            q = oracle.RandomTable(vocab_size, seed=2000 + seed, concentration=0.5)
            token = oracle.expected_accepted("token", p, q, (0,), g)
            block = oracle.expected_accepted("block", p, q, (0,), g)
            assert block >= token - 1e-12, (seed, vocab_size, g, block, token)
            strictly_better += block > token + 1e-9
            instances += 1
    assert instances >= 100
    assert strictly_better > 0.8 * instances


# Multi-path verification (docs/design.md section 7): K independent paths, recursive block verification.


def point_mass_table(vocab_size: int, seed: int) -> oracle.Table:
    """A deterministic proposer (an n-gram lookup's kind): q is one-hot on a token fixed by the prefix."""
    return lambda prefix: [float(x == hash((seed, prefix)) % vocab_size) for x in range(vocab_size)]


@pytest.mark.parametrize(
    ("vocab_size", "g", "num_paths", "length"),
    [(3, 1, 2, 3), (3, 1, 3, 3), (3, 2, 2, 3), (3, 2, 3, 3), (2, 3, 2, 4), (2, 1, 4, 4)],
)
def test_multipath_lossless_sequence_distribution(vocab_size, g, num_paths, length):
    """K i.i.d. draft paths: repeated iterations produce exactly the target's sequence distribution."""
    for seed in range(2):
        p = oracle.RandomTable(vocab_size, seed=900 + seed, concentration=0.7)
        q = oracle.RandomTable(vocab_size, seed=950 + seed, concentration=0.7)
        context = (seed % vocab_size,)
        speculative = oracle.multipath_sequence_distribution(p, [q] * num_paths, context, g, length)
        assert abs(sum(speculative.values()) - 1.0) < 1e-9
        assert oracle.total_variation(speculative, oracle.target_sequence_distribution(p, context, length)) < 1e-9


def test_multipath_with_one_path_is_block_verification():
    for seed in range(3):
        p = oracle.RandomTable(3, seed=10 + seed, concentration=0.6)
        q = oracle.RandomTable(3, seed=20 + seed, concentration=0.6)
        for g in (0, 1, 2, 3):
            block = oracle.iteration_outcomes("block", p, q, (1,), g)
            assert oracle.total_variation(oracle.multipath_outcomes(p, [q], (1,), g), block) < 1e-12


@pytest.mark.parametrize("num_paths", [1, 2, 3])
def test_multipath_lossless_with_point_mass_drafts(num_paths):
    """q one-hot (an n-gram proposer): every path the same point mass, then one point-mass path beside
    model paths (paths from different proposers, still independent)."""
    p = oracle.RandomTable(3, seed=31, concentration=0.7)
    model = oracle.RandomTable(3, seed=32, concentration=0.7)
    target = oracle.target_sequence_distribution(p, (0,), 3)
    for g in (1, 2):
        point_mass = point_mass_table(3, seed=g)
        for qs in ([point_mass] * num_paths, [model] * (num_paths - 1) + [point_mass], [point_mass] + [model] * (num_paths - 1)):
            speculative = oracle.multipath_sequence_distribution(p, qs, (0,), g, 3)
            assert oracle.total_variation(speculative, target) < 1e-9, (g, num_paths)


def test_multipath_oracle_detects_a_lossy_rule():
    """Control: verifying the next path against p instead of the residual is not lossless."""
    p = oracle.RandomTable(3, seed=41, concentration=0.7)
    q = oracle.RandomTable(3, seed=42, concentration=0.7)
    speculative = oracle.multipath_sequence_distribution(p, [q, q], (0,), 2, 3, lossy=True)
    assert oracle.total_variation(speculative, oracle.target_sequence_distribution(p, (0,), 3)) > 1e-3


def test_more_paths_raise_block_efficiency():
    """E[tau + 1] grows with K (never falls: a path is used only where one token would be drawn)."""
    strictly_better = 0
    for seed in range(12):
        p = oracle.RandomTable(3, seed=1100 + seed, concentration=0.5)
        q = oracle.RandomTable(3, seed=1200 + seed, concentration=0.5)
        efficiencies = [oracle.multipath_block_efficiency(p, [q] * k, (0,), 2) for k in (1, 2, 3)]
        assert efficiencies[0] <= efficiencies[1] + 1e-12 <= efficiencies[2] + 2e-12, (seed, efficiencies)
        strictly_better += efficiencies[1] > efficiencies[0] + 1e-6
    assert strictly_better >= 10
