"""Builders that turn oracle tables into batched verifier inputs (many rows, one context)."""

from __future__ import annotations

import itertools
from collections import Counter

import torch
from scipy import stats

from tests.verify import oracle


def dense_table(table: oracle.Table, context: tuple[int, ...], vocab_size: int, g: int) -> torch.Tensor:
    """All prefixes of length 0..g after `context`, in base-V order -> [num_prefixes, V] float64."""
    rows = []
    for length in range(g + 1):
        for prefix in itertools.product(range(vocab_size), repeat=length):
            rows.append(table(context + prefix))
    return torch.tensor(rows, dtype=torch.float64)


def prefix_index(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """tokens [N, k] -> row of the prefix in dense_table [N]."""
    length = tokens.shape[1]
    offset = sum(vocab_size**i for i in range(length))
    index = torch.zeros(tokens.shape[0], dtype=torch.long)
    for i in range(length):
        index = index * vocab_size + tokens[:, i]
    return index + offset


def sample_block_inputs(
    p_dense: torch.Tensor, q_dense: torch.Tensor, num_rows: int, g: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Draft blocks sampled from q, with their q and p.

    Returns:
        draft_ids [N, g] long, draft_probs [N, g, V] float32, target_probs [N, g+1, V] float32
    """
    vocab_size = p_dense.shape[1]
    draft_ids = torch.zeros(num_rows, g, dtype=torch.long)
    draft_probs = torch.zeros(num_rows, g, vocab_size)
    target_probs = torch.zeros(num_rows, g + 1, vocab_size)
    for i in range(g + 1):
        index = prefix_index(draft_ids[:, :i], vocab_size)
        target_probs[:, i] = p_dense[index].float()
        if i < g:
            q_i = q_dense[index]
            draft_probs[:, i] = q_i.float()
            draft_ids[:, i] = torch.multinomial(q_i, 1, generator=generator).squeeze(1)
    return draft_ids, draft_probs, target_probs


def chi_square_p_value(observed: Counter, expected_probs: dict, num_samples: int) -> float:
    """Goodness of fit of observed outcome counts to exact probabilities; rare outcomes pooled."""
    keys = sorted(expected_probs, key=lambda k: -expected_probs[k])
    observed_counts, expected_counts = [], []
    pooled_observed, pooled_expected = 0.0, 0.0
    for key in keys:
        expected = expected_probs[key] * num_samples
        if expected >= 5:
            observed_counts.append(observed.get(key, 0))
            expected_counts.append(expected)
        else:
            pooled_observed += observed.get(key, 0)
            pooled_expected += expected
    if any(key not in expected_probs for key in observed):
        return 0.0  # an outcome of probability zero: no fit at all
    if pooled_expected > 0:
        observed_counts.append(pooled_observed)
        expected_counts.append(pooled_expected)
    scale = sum(observed_counts) / sum(expected_counts)
    return stats.chisquare(observed_counts, [e * scale for e in expected_counts]).pvalue
