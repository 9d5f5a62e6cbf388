"""At temperature 1, speculative decoding samples the target's distribution, and block >= token;
a row at its own temperature in a mixed batch samples the target's distribution at that temperature.

    .venv/bin/python -m pytest tests/engine/test_distribution.py -q

The exact distribution of the first 3 generated tokens is computed by enumerating the tiny target's
probabilities of all V^3 continuations (V = 8). Samples come from one batched run over many copies of
the same prompt. Goodness of fit: Pearson chi-square over the V^3 cells, cells with expected count
< 5 merged; each test fails at p < 1e-3 (false-alarm rate 0.1% per test; the seeds are fixed, so
the outcome is deterministic). The same statistic against the draft's own distribution must reject,
which shows the test has power.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from distributed_spec.engine import EngineConfig, SpeculativeEngine
from distributed_spec.engine.config import SamplingConfig, VerifierConfig
from distributed_spec.engine.speculative import make_request
from distributed_spec.models.tiny import tiny_llama
from distributed_spec.verify import SamplingParams, logits_to_probs

VOCAB_SIZE = 8
NUM_TOKENS = 3
NUM_SAMPLES = 20_000
PROMPT = [3, 1, 4]
P_VALUE_FLOOR = 1e-3


@pytest.fixture(scope="module")
def small_vocab_pair():
    target = tiny_llama(vocab_size=VOCAB_SIZE, seed=10, logit_scale=3.0)
    draft = tiny_llama(vocab_size=VOCAB_SIZE, seed=11, logit_scale=3.0)
    return target, draft


SAMPLE_AT_ONE = SamplingParams(temperature=1.0)


def exact_continuation_probs(model, prompt: list[int], params: SamplingParams = SAMPLE_AT_ONE) -> np.ndarray:
    """[V^3] probability of every 3-token continuation (row-major over (x1, x2, x3)) under `params`."""
    prefixes = list(itertools.product(range(VOCAB_SIZE), repeat=NUM_TOKENS - 1))
    input_ids = torch.tensor([prompt + list(prefix) for prefix in prefixes])  # [V^2, len + 2]
    with torch.no_grad():
        logits = model(input_ids).logits[:, -NUM_TOKENS:]  # [V^2, 3, V]
    probs = logits_to_probs(logits, params).double()
    joint = np.zeros([VOCAB_SIZE] * NUM_TOKENS)
    for index, (x1, x2) in enumerate(prefixes):
        joint[x1, x2, :] = (probs[index, 0, x1] * probs[index, 1, x2] * probs[index, 2]).numpy()
    return joint.reshape(-1)


def chi_square_p_value(samples: list[list[int]], probs: np.ndarray) -> float:
    """Pearson chi-square p-value of the samples' 3-token cells against `probs`, small cells merged."""
    cells = np.array([np.ravel_multi_index(tuple(sample), [VOCAB_SIZE] * NUM_TOKENS) for sample in samples])
    observed = np.bincount(cells, minlength=probs.size).astype(float)
    expected = probs * len(samples)
    large = expected >= 5
    if not large.all():
        small_observed, small_expected = observed[~large].sum(), expected[~large].sum()
        observed, expected = observed[large], expected[large]
        if small_expected > 0:
            observed, expected = np.append(observed, small_observed), np.append(expected, small_expected)
        elif small_observed > 0:
            return 0.0  # samples where the target has no mass (e.g. outside its top-p set)
    return float(chisquare(observed, expected * observed.sum() / expected.sum()).pvalue)


def sample_first_tokens(
    target, draft, method: str, num_draft_tokens: int, seed: int, batch_size: int = NUM_SAMPLES, **verifier
) -> list[list[int]]:
    config = EngineConfig(
        VerifierConfig(method=method, num_draft_tokens=num_draft_tokens, **verifier),
        SamplingConfig(max_new_tokens=NUM_TOKENS, seed=seed),
        max_batch_size=batch_size,
    )
    results = SpeculativeEngine(target, draft, config).generate([PROMPT] * NUM_SAMPLES)
    return [result.token_ids for result in results]


def test_exact_probs_sum_to_one(small_vocab_pair):
    target, _ = small_vocab_pair
    assert math.isclose(exact_continuation_probs(target, PROMPT).sum(), 1.0, rel_tol=1e-6)


@pytest.mark.parametrize(
    ("method", "g"), [("block", 2), ("block", 3), ("token", 3), ("autoregressive", 0)]
)
def test_first_tokens_follow_the_target_distribution(small_vocab_pair, method, g):
    target, draft = small_vocab_pair
    samples = sample_first_tokens(target, draft, method, max(g, 1), seed=1000)
    assert all(len(sample) == NUM_TOKENS for sample in samples)
    target_probs = exact_continuation_probs(target, PROMPT)
    assert chi_square_p_value(samples, target_probs) > P_VALUE_FLOOR
    if method != "autoregressive":
        # Power check: the draft's own distribution is clearly rejected by the same test.
        assert chi_square_p_value(samples, exact_continuation_probs(draft, PROMPT)) < 1e-6


@pytest.mark.parametrize("method", ["block", "token"])
def test_adaptive_draft_length_keeps_the_target_distribution(small_vocab_pair, method):
    """g starts at 1 and becomes 3 after a kept draft, 1 after a rejection: the second block's length
    depends on the first block's outcome. Batches of 32 rows, so the rows' histories set each step's g."""
    target, draft = small_vocab_pair
    samples = sample_first_tokens(
        target, draft, method, 1, seed=2000, batch_size=32, draft_len_schedule="adaptive"
    )
    assert chi_square_p_value(samples, exact_continuation_probs(target, PROMPT)) > P_VALUE_FLOOR
    assert chi_square_p_value(samples, exact_continuation_probs(draft, PROMPT)) < 1e-6


@pytest.mark.parametrize("method", ["block", "token"])
def test_confidence_stop_keeps_the_target_distribution(small_vocab_pair, method):
    """g = 3; a row's block ends after any draft token with q_i(X_i) < 0.15: about half the first blocks."""
    target, draft = small_vocab_pair
    config = EngineConfig(
        verifier=VerifierConfig(method=method, num_draft_tokens=3, draft_confidence_threshold=0.15),
        sampling=SamplingConfig(max_new_tokens=NUM_TOKENS, seed=3000),
        max_batch_size=NUM_SAMPLES,
    )
    results, stats = SpeculativeEngine(target, draft, config).generate_with_stats([PROMPT] * NUM_SAMPLES)
    samples = [result.token_ids for result in results]
    assert chi_square_p_value(samples, exact_continuation_probs(target, PROMPT)) > P_VALUE_FLOOR
    assert chi_square_p_value(samples, exact_continuation_probs(draft, PROMPT)) < 1e-6
    # Both kinds of first block occurred: ended after X_1, and run on to X_2 (the budget's limit).
    first_blocks, second_drafts = stats.num_proposed_per_position[0], stats.num_proposed_per_position[1]
    assert 0.2 * NUM_SAMPLES < second_drafts < 0.8 * NUM_SAMPLES < first_blocks


def test_block_efficiency_of_block_at_least_token(small_vocab_pair):
    """Mean tokens per target call: block >= token, one-sided at 3 standard errors (false alarm 0.13%)."""
    target, draft = small_vocab_pair
    means, variances = {}, {}
    for method in ("block", "token"):
        config = EngineConfig(
            verifier=VerifierConfig(method=method, num_draft_tokens=4),
            sampling=SamplingConfig(max_new_tokens=24, seed=7),
            max_batch_size=2_000,
        )
        results = SpeculativeEngine(target, draft, config).generate([PROMPT] * 2_000)
        efficiencies = np.array([result.stats.block_efficiency for result in results])
        means[method] = efficiencies.mean()
        variances[method] = efficiencies.var(ddof=1) / len(efficiencies)
    standard_error = math.sqrt(variances["block"] + variances["token"])
    assert means["block"] >= means["token"] - 3 * standard_error, (means, standard_error)
    assert 1.0 < means["token"] < 5.0


@pytest.mark.parametrize("method", ["block", "token"])
def test_goodput_schedule_keeps_the_target_distribution(small_vocab_pair, steady_steps, method):
    """g in {0, ..., 3} chosen each step from timings and acceptance so far (0: no draft); steps of
    equal cost (steady_steps) so that the drafting path is the one taken."""
    target, draft = small_vocab_pair
    samples = sample_first_tokens(
        target, draft, method, 1, seed=3000, batch_size=32, draft_len_schedule="goodput", max_draft_len=3
    )
    assert chi_square_p_value(samples, exact_continuation_probs(target, PROMPT)) > P_VALUE_FLOOR
    assert chi_square_p_value(samples, exact_continuation_probs(draft, PROMPT)) < 1e-6


# "3 1" occurs earlier, so the first block is the n-gram proposal [4, 1] (q a point mass on it).
NGRAM_PROMPT = [3, 1, 4, 1, 3, 1]


@pytest.mark.parametrize(
    ("method", "proposer"), [("block", "ngram"), ("token", "ngram"), ("block", "model+ngram")]
)
def test_ngram_proposers_keep_the_target_distribution(small_vocab_pair, method, proposer):
    target, draft = small_vocab_pair
    config = EngineConfig(
        verifier=VerifierConfig(method=method, num_draft_tokens=3, proposer=proposer),
        sampling=SamplingConfig(max_new_tokens=NUM_TOKENS, seed=4000),
        max_batch_size=NUM_SAMPLES,
    )
    engine = SpeculativeEngine(target, draft if proposer == "model+ngram" else None, config)
    results, stats = engine.generate_with_stats([NGRAM_PROMPT] * NUM_SAMPLES)
    samples = [result.token_ids for result in results]
    assert chi_square_p_value(samples, exact_continuation_probs(target, NGRAM_PROMPT)) > P_VALUE_FLOOR
    # Every row's first block came from n-grams; its point masses were kept in part, rejected in part.
    assert stats.extra["proposer/rows_ngram"] >= NUM_SAMPLES
    assert 0.05 < stats.extra["proposer/accepted_ngram"] / stats.extra["proposer/proposed_ngram"] < 0.95
    if proposer == "model+ngram":
        # Rows without a match later on were drafted by the model.
        assert stats.extra["proposer/rows_model"] > 0


def test_a_row_at_its_own_temperature_in_a_mixed_batch_follows_the_target_at_it(small_vocab_pair):
    """Rows at temperature 0.5 share every batch with rows at temperature 1 (top-p 0.8) and greedy
    rows; each group's first tokens follow the target warped with that group's own settings."""
    target, draft = small_vocab_pair
    cool, hot = SamplingParams(temperature=0.5), SamplingParams(temperature=1.0, top_p=0.8)
    settings = [
        (cool, hot, cool, SamplingParams(temperature=0.0))[index % 4] for index in range(2 * NUM_SAMPLES)
    ]
    config = EngineConfig(
        verifier=VerifierConfig(method="block", num_draft_tokens=2),
        sampling=SamplingConfig(max_new_tokens=NUM_TOKENS, seed=4000),
        max_batch_size=1024,
    )
    engine = SpeculativeEngine(target, draft, config)
    requests = [
        make_request(PROMPT, config, VOCAB_SIZE, None, key=index, seed_key=index, sampling=params)
        for index, params in enumerate(settings)
    ]
    samples = {cool: [], hot: []}
    greedy_samples = set()
    for request in engine.stream(requests):
        params = settings[request.key]
        if params.is_greedy:
            greedy_samples.add(tuple(request.output))
        else:
            samples[params].append(request.output)
    assert len(samples[cool]) == NUM_SAMPLES
    assert chi_square_p_value(samples[cool], exact_continuation_probs(target, PROMPT, cool)) > P_VALUE_FLOOR
    assert chi_square_p_value(samples[hot], exact_continuation_probs(target, PROMPT, hot)) > P_VALUE_FLOOR
    # Power: the neighbours' settings, and the draft at the row's own, are clearly rejected.
    assert chi_square_p_value(samples[cool], exact_continuation_probs(target, PROMPT, hot)) < 1e-6
    assert chi_square_p_value(samples[cool], exact_continuation_probs(draft, PROMPT, cool)) < 1e-6
    # Greedy rows all decode the one argmax continuation.
    assert len(greedy_samples) == 1


@pytest.mark.parametrize(("num_paths", "g"), [(2, 2), (4, 1)])
def test_multipath_keeps_the_target_distribution(small_vocab_pair, num_paths, g):
    """K i.i.d. draft paths per row, scored in one target forward, one kept (engine.num_paths)."""
    target, draft = small_vocab_pair
    samples = sample_first_tokens(target, draft, "block", g, seed=4000, num_paths=num_paths)
    assert chi_square_p_value(samples, exact_continuation_probs(target, PROMPT)) > P_VALUE_FLOOR
    assert chi_square_p_value(samples, exact_continuation_probs(draft, PROMPT)) < 1e-6
