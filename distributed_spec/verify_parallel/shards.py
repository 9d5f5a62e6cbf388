"""A rank's slice of the vocabulary, and the collectives of vocabulary-parallel verification.

`VocabShard` wraps the tensor-parallel process group: every collective goes through it, so it can
count the bytes this rank receives (ring all-reduce: 2 (tp-1)/tp of the tensor; all-gather:
(tp-1) chunks) for the benchmark, without a second code path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


def vocab_shard_range(vocab_size: int, tp_size: int, rank: int) -> tuple[int, int]:
    """[start, end) of rank's ids: contiguous slices of ceil(V / tp) ids, the last one shorter.

    This is the column-parallel LM head's split when V divides by tp (Megatron, DeepSpeed AutoTP).
    """
    if not 0 <= rank < tp_size:
        raise ValueError(f"rank must lie in [0, tp_size={tp_size}), got {rank}")
    shard_size = -(-vocab_size // tp_size)
    return min(rank * shard_size, vocab_size), min((rank + 1) * shard_size, vocab_size)


@dataclass
class VocabShard:
    """This rank's place in the vocabulary-parallel group."""

    # Global vocabulary size V.
    vocab_size: int
    # torch.distributed group of the tensor-parallel ranks (None: the default group).
    group: dist.ProcessGroup | None = None
    # Bytes this rank received in collectives so far (the benchmark reads and resets it).
    bytes_received: int = 0

    def __post_init__(self) -> None:
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)
        self.vocab_start, self.vocab_end = vocab_shard_range(self.vocab_size, self.world_size, self.rank)
        self.max_shard_size = -(-self.vocab_size // self.world_size)

    @property
    def num_ids(self) -> int:
        return self.vocab_end - self.vocab_start

    def all_reduce(self, tensor: torch.Tensor, op: dist.ReduceOp) -> torch.Tensor:
        """In place; returns the tensor."""
        self.bytes_received += 2 * (self.world_size - 1) * _nbytes(tensor) // self.world_size
        dist.all_reduce(tensor, op=op, group=self.group)
        return tensor

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """[...] on every rank -> [tp, ...] in rank order (identical on every rank)."""
        tensor = tensor.contiguous()
        out = tensor.new_empty((self.world_size, *tensor.shape))
        self.bytes_received += (self.world_size - 1) * _nbytes(tensor)
        if tensor.is_cuda:
            dist.all_gather_into_tensor(out, tensor, group=self.group)
        else:  # gloo has no all_gather_into_tensor
            dist.all_gather(list(out.unbind(0)), tensor, group=self.group)
        return out


def gather_vocab(shard_tensor: torch.Tensor, shard: VocabShard) -> torch.Tensor:
    """[..., V / tp] on every rank -> [..., V] on every rank (the full tensor; what verification
    without vocabulary parallelism needs)."""
    pad = shard.max_shard_size - shard_tensor.shape[-1]
    if pad:
        shard_tensor = torch.nn.functional.pad(shard_tensor, (0, pad))
    gathered = shard.all_gather(shard_tensor)  # [tp, ..., max_shard_size]
    # Only the last shard is shorter, so the padding trails the concatenation.
    return torch.cat(gathered.unbind(0), dim=-1)[..., : shard.vocab_size]


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
