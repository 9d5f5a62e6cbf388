"""Prompt lookup: a draft-free proposer that copies what followed the row's last n tokens before.

    from distributed_spec.engine.ngram import NgramProposer
    proposer = NgramProposer(min_n=1, max_n=3)
    proposer.propose([[7, 1, 2, 3, 9, 4, 1, 2, 3]], [2])      # [[9, 4]]

For each row, the context is its prompt + output (the last token is Y, the one the next block
continues). The last n tokens are looked up at earlier positions of the same context, for n from
max_n down to min_n (the longest n that matches anywhere wins: a longer match predicts better); the
proposal is the up-to-k tokens that followed the match. Among the matches of that n, the most recent
one with k tokens after it is taken (in text that repeats with a period shorter than k, the most
recent match of all has fewer than k tokens after it); when none has k, the earliest (the longest
continuation). No match: an empty proposal.

Peers: Hugging Face's prompt lookup decoding (`prompt_lookup_num_tokens`, `max_matching_ngram_size`)
and vLLM's n-gram speculator (`prompt_lookup_min/max`). The proposal is a function of the row's
tokens so far, and its q is a point mass at each proposed token, so every verifier stays exact
(tests/verify/test_oracle.py enumerates it).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def match_lengths(tokens: torch.Tensor, max_n: int) -> torch.Tensor:
    """How many of the context's last tokens each earlier position ends a copy of.

    Args:
        tokens: [L] long, the context.
        max_n: the longest match counted.
    Returns:
        [L-1] long: entry e = the largest m <= max_n with tokens[e-m+1..e] == tokens[L-m..L-1]
        (e < L-1: the context's own end is not a match of itself).
    """
    length = tokens.shape[0]
    # equal[j, e]: the j-th token back from e equals the j-th token back from the end.
    equal = torch.zeros(max_n, max(length - 1, 0), dtype=torch.bool)
    for back in range(min(max_n, length - 1)):
        equal[back, back:] = tokens[: length - 1 - back] == tokens[length - 1 - back]
    # A match of length m needs all of its first m comparisons: a running product down the rows.
    return equal.long().cumprod(dim=0).sum(dim=0)


def lookup(tokens: Sequence[int], max_tokens: int, min_n: int, max_n: int) -> list[int]:
    """The up-to-max_tokens continuation of the context's best earlier n-gram match (module docstring);
    [] when no n in [min_n, max_n] matches or max_tokens is 0."""
    length = len(tokens)
    if max_tokens <= 0 or length < min_n + 1:
        return []
    context = torch.tensor(tokens, dtype=torch.long)
    lengths = match_lengths(context, max_n)  # [L-1]
    best_n = int(lengths.max())
    if best_n < min_n:
        return []
    ends = (lengths >= best_n).nonzero()[:, 0]  # [matches] ascending
    # Tokens after a match ending at e: the context's positions e+1..L-1.
    full = ends[length - 1 - ends >= max_tokens]
    end = int(full[-1]) if full.numel() else int(ends[0])
    return list(tokens[end + 1 : end + 1 + max_tokens])


class NgramProposer:
    """Prompt lookup over each row's own tokens; n from max_n down to min_n (module docstring)."""

    def __init__(self, min_n: int = 1, max_n: int = 3) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.min_n = min_n
        self.max_n = max_n

    def propose(self, contexts: Sequence[Sequence[int]], max_tokens: Sequence[int]) -> list[list[int]]:
        """Per row: its proposal of at most max_tokens[b] tokens ([] when nothing matches).

        Args:
            contexts: B token-id lists (prompt + output so far, last token = Y).
            max_tokens: B limits (0: the row wants no proposal).
        """
        return [
            lookup(context, limit, self.min_n, self.max_n) if limit > 0 else []
            for context, limit in zip(contexts, max_tokens)
        ]
