"""What crosses the wire each iteration: a `DraftBlock` (draft ids and draft probabilities q).

q is the biggest message of an iteration ([B, g, V]); two options shrink it, both exact:
- `wire_dtype` bfloat16/float16 halves it. Rounding changes q, so the draft SAMPLES from the very
  rounded q it sends: `round_trip(q) == decode(encode(q))`, renormalised in float32, is both what
  the draft samples from and what the target's verifier reads (bitwise, same function, same device
  type). Sampling from the unrounded q while verifying against the rounded one would not be exact.
- `wire_top_k` k > 0 sends the k largest entries of each row (values and int32 ids). This is exact
  only because the draft then samples from its own top-k: q is exactly that sparse distribution
  (renormalised over the k ids), so the verifier sees the draft's true q. It changes the draft's
  proposals (a sharper draft), never the target's output distribution.
With greedy verification the verifier never reads q, so no probabilities are sent at all.
`wire_dtype=auto` (the default) is bfloat16 on cuda, the cheapest dense encoding that keeps the
draft's proposals (top-k changes them), and float32 on the CPU, where the actors share one node's
object store and the runtime then replays the single-process engine's sampled tokens bit for bit.
`block_wire_bytes` gives the bytes per iteration without running anything (bench_distributed --bytes-only).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

WIRE_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_wire_dtype(wire_dtype: str, device: str) -> str:
    """parallel.wire_dtype with "auto" decided by the shards' device ("cuda" or "cpu")."""
    if wire_dtype != "auto":
        return wire_dtype
    return "bfloat16" if device == "cuda" else "float32"


@dataclass(frozen=True)
class WireFormat:
    """How q is encoded; built from parallel.wire_dtype and parallel.wire_top_k."""

    dtype: str = "float32"
    # 0 = dense.
    top_k: int = 0
    # False when the verifier ignores q (greedy): nothing is sent.
    send_probs: bool = True

    @property
    def is_identity(self) -> bool:
        """Dense float32: q is sent as computed and needs no round trip."""
        return self.dtype == "float32" and self.top_k == 0


@dataclass
class DraftBlock:
    """One proposal of the draft for every active row."""

    # [B, g] long: X_1..X_g.
    draft_ids: torch.Tensor
    # [B, g, V] (dense) or [B, g, k] (top-k) in the wire dtype; None when q is not sent.
    probs_values: torch.Tensor | None
    # [B, g, k] int32 vocabulary ids of probs_values (top-k only).
    probs_ids: torch.Tensor | None
    vocab_size: int
    # [B] long: each row's block length (< g where the confidence stop ended it); None: all g.
    num_drafted: torch.Tensor | None = None
    # Seconds the draft spent producing the block (forwards and sampling), for the timing split.
    draft_s: float = 0.0
    # True when the block was drafted ahead, during the previous verification (overlap hit).
    from_overlap: bool = False
    # The draft runner's forward calls so far (cumulative), for RunStats.num_draft_calls.
    num_draft_calls: int = 0
    # Seconds spent on a block drafted ahead and then discarded just before this one (overlap miss).
    discarded_ahead_s: float = 0.0

    def without_probs(self) -> DraftBlock:
        """The block as the shards that do not verify receive it: the ids, no q."""
        return DraftBlock(
            draft_ids=self.draft_ids,
            probs_values=None,
            probs_ids=None,
            vocab_size=self.vocab_size,
            num_drafted=self.num_drafted,
            draft_s=self.draft_s,
            from_overlap=self.from_overlap,
            num_draft_calls=self.num_draft_calls,
            discarded_ahead_s=self.discarded_ahead_s,
        )

    @property
    def num_wire_bytes(self) -> int:
        tensors = (self.draft_ids, self.probs_values, self.probs_ids)
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def block_wire_bytes(batch_size: int, g: int, vocab_size: int, wire: WireFormat) -> int:
    """Bytes of the tensors of one DraftBlock as rank 0 receives it (`DraftBlock.num_wire_bytes`):
    draft ids [B, g] int64, plus q: [B, g, V] in the wire dtype, or top-k values [B, g, k] and int32
    ids. The other shards receive the ids alone."""
    num_ids = batch_size * g
    if not wire.send_probs:
        return num_ids * 8
    value_bytes = torch.empty(0, dtype=WIRE_TORCH_DTYPES[wire.dtype]).element_size()
    if 0 < wire.top_k < vocab_size:
        return num_ids * (8 + wire.top_k * (value_bytes + 4))
    return num_ids * (8 + vocab_size * value_bytes)


def encode_probs(probs: torch.Tensor, wire: WireFormat) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q as it goes on the wire.

    Args:
        probs: [..., V] float32.
    Returns:
        values [..., V] or [..., k] in the wire dtype, and ids [..., k] int32 (top-k) or None.
    """
    dtype = WIRE_TORCH_DTYPES[wire.dtype]
    if 0 < wire.top_k < probs.shape[-1]:
        values, ids = torch.topk(probs, wire.top_k, dim=-1)
        return values.to(dtype), ids.to(torch.int32)
    return probs.to(dtype), None


def decode_probs(values: torch.Tensor, ids: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """Dense float32 q from its wire form, renormalised so each row sums to 1.

    Args:
        values: [..., V] or [..., k]; ids: [..., k] int32 or None.
    Returns:
        probs: [..., V] float32.
    """
    values = values.float()
    values = values / values.sum(dim=-1, keepdim=True)
    if ids is None:
        return values
    dense = torch.zeros(*values.shape[:-1], vocab_size, dtype=torch.float32, device=values.device)
    return dense.scatter_(-1, ids.long(), values)


def sample_view(
    probs: torch.Tensor, wire: WireFormat
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Encode one step's q once; return the q the draft must sample from and its wire form.

    Args:
        probs: [B, V] float32, the draft's warped probabilities.
    Returns:
        sampled_probs [B, V] float32 (== what the verifier decodes, bitwise), values, ids.
    """
    if wire.is_identity:
        return probs, probs, None
    values, ids = encode_probs(probs, wire)
    return decode_probs(values, ids, probs.shape[-1]), values, ids


def unpack_probs(block: DraftBlock, device: torch.device) -> torch.Tensor | None:
    """q as the verifier reads it: [B, g, V] float32 on `device`, or None when it was not sent."""
    if block.probs_values is None:
        return None
    values = block.probs_values.to(device)
    if block.probs_ids is None and values.dtype == torch.float32:
        return values
    ids = None if block.probs_ids is None else block.probs_ids.to(device)
    return decode_probs(values, ids, block.vocab_size)


def point_mass_block(ngram_ids: torch.Tensor, vocab_size: int, wire: WireFormat) -> DraftBlock:
    """A block of n-gram proposals (engine/proposers.py), q a point mass at each token, built where
    no draft runs (the coordinator): one (value 1, id) pair per position, whatever the wire format.

    Args:
        ngram_ids: [B, w] long.
    """
    send = wire.send_probs
    return DraftBlock(
        draft_ids=ngram_ids,
        probs_values=torch.ones(*ngram_ids.shape, 1, dtype=torch.float32) if send else None,
        probs_ids=ngram_ids[..., None].to(torch.int32) if send else None,
        vocab_size=vocab_size,
    )
