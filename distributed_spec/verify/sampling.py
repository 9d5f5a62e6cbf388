"""Logits to probabilities, and sampling with explicit uniforms.

The same warping (temperature, top-k, top-p) is applied to draft and target logits, so the
losslessness guarantee holds with respect to the warped target distribution (docs/design.md section 1).
Sampling is by inverse CDF from explicit uniforms: the same uniforms give the same token on every
tensor-parallel rank and in every implementation of the verifier.

Settings are per row: `RowSampling` gives each row of a batch its own `SamplingParams` (records of a
job may ask for their own temperature and top-p). Rows that share settings are warped together by
the one-setting warp, so a row's probabilities are exactly the ones it gets in a batch of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How logits become probabilities; shared by the draft and the target."""

    # Softmax temperature; 0 means greedy (one-hot on the argmax).
    temperature: float = 1.0
    # Keep only the k most likely tokens; 0 disables.
    top_k: int = 0
    # Keep the smallest set of most likely tokens whose mass reaches top_p; 1.0 disables.
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise ValueError(f"sampling.temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"sampling.top_k must be >= 0 (0 disables), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"sampling.top_p must be in (0, 1], got {self.top_p}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class RowSampling:
    """Each row's own sampling settings: row b of a batch is warped with `rows[b]`."""

    rows: tuple[SamplingParams, ...]

    @classmethod
    def uniform(cls, params: SamplingParams, batch_size: int) -> RowSampling:
        return cls((params,) * batch_size)

    @property
    def batch_size(self) -> int:
        return len(self.rows)

    def shared(self) -> SamplingParams | None:
        """The settings every row has, or None when rows differ (or there are none)."""
        first = self.rows[0] if self.rows else None
        return first if all(params == first for params in self.rows) else None

    def groups(self) -> list[tuple[SamplingParams, list[int]]]:
        """(settings, the rows that have them), in order of first appearance."""
        rows_of: dict[SamplingParams, list[int]] = {}
        for row, params in enumerate(self.rows):
            rows_of.setdefault(params, []).append(row)
        return list(rows_of.items())

    def greedy_rows(self) -> list[bool]:
        return [params.is_greedy for params in self.rows]

    def select(self, rows: Sequence[int]) -> RowSampling:
        return RowSampling(tuple(self.rows[row] for row in rows))


# What the warping functions accept: one setting for every row, or each row's own.
Sampling = SamplingParams | RowSampling


def by_row_groups(
    sampling: RowSampling, tensors: Sequence[torch.Tensor], fn: Callable[..., torch.Tensor]
) -> torch.Tensor:
    """fn(*tensors[rows], params) per group of rows sharing settings, gathered back into row order.

    tensors: each [B, ...] with B = sampling.batch_size; fn returns [b, ...] for a group of b rows.
    """
    shared = sampling.shared()
    if shared is not None:
        return fn(*tensors, shared)
    output = None
    for params, rows in sampling.groups():
        index = torch.tensor(rows, dtype=torch.long, device=tensors[0].device)
        group_output = fn(*(tensor.index_select(0, index) for tensor in tensors), params)
        if output is None:
            output = group_output.new_empty((sampling.batch_size, *group_output.shape[1:]))
        output.index_copy_(0, index, group_output)
    assert output is not None, "RowSampling with no rows"
    return output


def logits_to_probs(logits: torch.Tensor, params: Sampling) -> torch.Tensor:
    """Warp logits and normalise.

    Args:
        logits: [..., V] any float dtype; [B, ..., V] when params is a RowSampling of B rows.
    Returns:
        probs: [..., V] float32; one-hot on the argmax where the temperature is 0.
    """
    if isinstance(params, RowSampling):
        return by_row_groups(params, [logits], logits_to_probs)
    logits = logits.float()
    if params.is_greedy:
        argmax_ids = logits.argmax(dim=-1, keepdim=True)
        return torch.zeros_like(logits).scatter_(-1, argmax_ids, 1.0)
    logits = logits / params.temperature
    vocab_size = logits.shape[-1]
    if 0 < params.top_k < vocab_size:
        kth_largest = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, sorted_ids = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        # Mass strictly before each token: a token is kept while that mass is below top_p, so the
        # most likely token is always kept and the kept set is the smallest reaching top_p.
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        sorted_logits = sorted_logits.masked_fill(mass_before >= params.top_p, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter_(-1, sorted_ids, sorted_logits)
    return logits.softmax(dim=-1)


def sample_from_probs(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling of one token per row from unnormalised non-negative weights.

    Args:
        probs: [B, V] non-negative weights (need not sum to 1); every row must have positive mass.
        u: [B] uniforms in [0, 1).
    Returns:
        token ids [B] long: the first id whose cumulative weight exceeds u * total. Ids of zero
        weight are never returned.
    """
    cdf = probs.double().cumsum(dim=-1)  # float64: no drift over 10^5-token vocabularies
    total = cdf[:, -1]
    # Strictly below the total, so the search lands on an id whose weight is positive even when
    # u * total rounds up to the total.
    threshold = torch.minimum(u.double() * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, threshold.unsqueeze(-1), right=True).squeeze(-1)
