"""The n-gram (prompt lookup) proposer against a plain-Python reference and hand-made cases."""

from __future__ import annotations

import random

import pytest
import torch

from distributed_spec.engine.ngram import NgramProposer, lookup, match_lengths


def reference_lookup(tokens: list[int], max_tokens: int, min_n: int, max_n: int) -> list[int]:
    """The rule of engine/ngram.py written out loop by loop."""
    length = len(tokens)
    if max_tokens <= 0:
        return []
    for n in range(max_n, min_n - 1, -1):
        if n >= length:
            continue
        suffix = tokens[length - n :]
        # Windows tokens[e-n+1..e] with e < length - 1 (the suffix itself is not a match).
        ends = [e for e in range(n - 1, length - 1) if tokens[e - n + 1 : e + 1] == suffix]
        if not ends:
            continue
        full = [e for e in ends if length - 1 - e >= max_tokens]
        end = full[-1] if full else ends[0]
        return tokens[end + 1 : end + 1 + max_tokens]
    return []


@pytest.mark.parametrize(
    ("tokens", "max_tokens", "expected"),
    [
        ([7, 1, 2, 3, 9, 4, 1, 2, 3], 2, [9, 4]),
        # The 3-gram [5, 1, 2] matches at the start; the 1-gram [2] more recently: the longer n wins.
        ([5, 1, 2, 8, 6, 2, 0, 5, 1, 2], 3, [8, 6, 2]),
        # Period 2 (a b a b a b): the most recent match with 3 tokens after it, not the last match.
        ([1, 2, 1, 2, 1, 2, 1, 2], 3, [1, 2, 1]),
        # Only short continuations exist: the earliest match (the longest one).
        ([4, 4, 4], 5, [4]),
        # Nothing repeats.
        ([1, 2, 3, 4], 3, []),
        ([3], 2, []),
        ([3, 3], 0, []),
    ],
)
def test_lookup_cases(tokens, max_tokens, expected):
    assert lookup(tokens, max_tokens, min_n=1, max_n=3) == expected


def test_min_n_rules_out_short_matches():
    # Only a 1-gram ([2]) repeats.
    assert lookup([2, 9, 5, 2], 2, min_n=1, max_n=3) == [9, 5]
    assert lookup([2, 9, 5, 2], 2, min_n=2, max_n=3) == []


def test_match_lengths_are_capped_at_max_n():
    tokens = torch.tensor([1, 1, 1, 1, 1])
    assert match_lengths(tokens, 3).tolist() == [1, 2, 3, 3]
    assert match_lengths(tokens, 9).tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize(("min_n", "max_n"), [(1, 1), (1, 3), (2, 4)])
def test_lookup_equals_the_reference_on_random_contexts(min_n, max_n):
    rng = random.Random(min_n * 10 + max_n)
    for _ in range(400):
        vocab_size = rng.choice([2, 3, 5, 20])
        tokens = [rng.randrange(vocab_size) for _ in range(rng.randrange(1, 30))]
        max_tokens = rng.randrange(0, 6)
        assert lookup(tokens, max_tokens, min_n, max_n) == reference_lookup(tokens, max_tokens, min_n, max_n), tokens


def test_proposer_handles_each_row_with_its_own_limit():
    proposer = NgramProposer(min_n=1, max_n=2)
    contexts = [[1, 2, 3, 1, 2], [1, 2, 3, 1, 2], [9, 8]]
    assert proposer.propose(contexts, [2, 0, 4]) == [[3, 1], [], []]


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="min_n"):
        NgramProposer(min_n=3, max_n=2)
