"""The target's LM head sharded by vocabulary, for `parallel.verify=vocab_parallel`.

AutoTP cuts the output head along the hidden dimension (`LmHeadLinearAllreduce`: rank j holds
W[:, h_j] and all-reduces the partial logits), so every rank ends up with the full [B, g+1, V]
logits. Vocabulary-parallel verification needs rank k's ids only: logits[..., v_k] = hidden @
W[v_k, :]^T, the full hidden states (every rank has them after the last all-reduce) times the
rows v_k of the whole weight. `vocab_slice_head` assembles those rows once, from every rank's
hidden slice (one all-gather per rank of [V/tp, H/tp] pieces; no rank ever holds the whole
weight), and `use_head` swaps it in as the model's output embedding for a batch, so the runner and
the model's own forward (logits_to_keep included) run unchanged and return [B, n, V/tp].
The hidden-sharded head stays: `gather` batches and a tied input embedding use it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from distributed_spec.verify_parallel.shards import VocabShard, vocab_shard_range


class VocabSliceHead(nn.Module):
    """The LM head's rows for this rank's ids [vocab_start, vocab_end)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, vocab_start: int, vocab_end: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)  # [V/tp, H]
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)  # [V/tp]
        self.vocab_start, self.vocab_end = vocab_start, vocab_end

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] (whole, the same on every rank) -> logits [..., V/tp] of this rank's ids."""
        return F.linear(hidden, self.weight, self.bias)


def head_vocab_size(head: nn.Module) -> int:
    """V: the output head's rows (AutoTP cuts its columns, never its rows)."""
    return int(head.weight.shape[0])


def vocab_slice_head(head: nn.Module, shard: VocabShard) -> VocabSliceHead:
    """This rank's vocabulary slice of the output head; every rank of the group must call it.

    Args:
        head: the model's output embedding: DeepSpeed's LmHeadLinearAllreduce (weight [V, H/tp],
            hidden-sharded) or a whole nn.Linear (weight [V, H]: not cut, e.g. TP = 1).
    """
    from deepspeed.module_inject.layers import LmHeadLinearAllreduce  # noqa: PLC0415 - DeepSpeed is heavy

    bias = head.bias[shard.vocab_start : shard.vocab_end].clone() if head.bias is not None else None
    if isinstance(head, LmHeadLinearAllreduce) and shard.world_size > 1:
        weight = _gather_vocab_rows(head.weight, list(head._partition_sizes), shard)
    elif isinstance(head, (nn.Linear, LmHeadLinearAllreduce)):
        weight = head.weight[shard.vocab_start : shard.vocab_end].clone()
    else:
        raise ValueError(
            f"parallel.verify=vocab_parallel needs a linear output head; the target's is {type(head).__name__} "
            "(use parallel.verify=gather)"
        )
    return VocabSliceHead(weight, bias, shard.vocab_start, shard.vocab_end)


def _gather_vocab_rows(weight: torch.Tensor, hidden_sizes: list[int], shard: VocabShard) -> torch.Tensor:
    """W[v_rank, :] [V/tp, H] from every rank's W[:, h_j] [V, H/tp].

    One round per destination rank k: every rank contributes W[v_k, h_j] (padded to one shape, as
    all-gather needs), and rank k concatenates the pieces along the hidden dimension in rank order,
    which is the order AutoTP cut them in.
    """
    vocab_size, tp = weight.shape[0], shard.world_size
    max_rows, max_cols = -(-vocab_size // tp), max(hidden_sizes)
    mine = None
    for rank in range(tp):
        start, end = vocab_shard_range(vocab_size, tp, rank)
        piece = weight.new_zeros(max_rows, max_cols)
        piece[: end - start, : weight.shape[1]] = weight[start:end]
        gathered = shard.all_gather(piece)  # [tp, V/tp, H/tp]
        if rank == shard.rank:
            mine = torch.cat([gathered[j, : end - start, : hidden_sizes[j]] for j in range(tp)], dim=1)
    shard.bytes_received = 0  # a load-time cost, not verification's
    return mine


def use_head(model: nn.Module, head: nn.Module) -> None:
    """Make `head` the model's output embedding (swapped per batch: one model, two heads)."""
    if model.get_output_embeddings() is not head:
        model.set_output_embeddings(head)
