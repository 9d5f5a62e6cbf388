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

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from distributed_spec.verify_parallel.shards import vocab_shard_range

WIRE_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class PickledAsNumpy:
    """A message whose CPU tensors Ray pickles as numpy arrays.

    Ray pickles every message of a step (request, block, result), on the step's critical path. A
    small torch tensor costs several times a numpy array's to pickle and load (one B = 1 StepRequest:
    `python -m scripts.trace_ray_step`, docs/RESULTS.md). Pickling a view also sends its elements
    only, where a tensor sends its whole storage. bfloat16 (no numpy dtype) and device tensors
    travel as tensors. Every tensor field comes back a tensor of the same dtype, shape and values
    (tests/distributed/test_wire.py).
    """

    def __getstate__(self) -> dict:
        return {name: _as_numpy(value) for name, value in self.__dict__.items()}

    def __setstate__(self, state: dict) -> None:
        # object.__setattr__ through __dict__: frozen dataclasses too.
        self.__dict__.update({name: _as_tensor(value) for name, value in state.items()})


def _as_numpy(value):
    if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dtype != torch.bfloat16:
        return value.detach().numpy()
    return value


def _as_tensor(value):
    if isinstance(value, np.ndarray):
        # Ray hands large arrays over read-only (zero-copy from its object store); torch needs them writable.
        return torch.from_numpy(value if value.flags.writeable else value.copy())
    return value


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
    # parallel.verify=vocab_parallel with tp_size > 1: a dense q is cut into this many vocabulary
    # slices, shard k receiving only ids [vocab_shard_range(V, n, k)); 0: rank 0 gets the whole q.
    vocab_shards: int = 0

    @property
    def is_identity(self) -> bool:
        """Dense float32: q is sent as computed and needs no round trip."""
        return self.dtype == "float32" and self.top_k == 0


@dataclass
class DraftBlock(PickledAsNumpy):
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
    # Seconds of the draft's forwards in this step for work owed by earlier steps, not the block's:
    # joining rows' prompts fed apart and catch-up (engine/sides.py); the goodput schedule takes
    # them off the step, as the local runtime does.
    owed_s: float = 0.0
    # Of those, the catch-up's: seconds and tokens fed (for the goodput schedule's price of it).
    catch_up_s: float = 0.0
    num_catch_up_tokens: int = 0
    # A vocabulary slice of a dense q (`vocab_slices`): probs_values holds ids [vocab_start, vocab_end)
    # only, and probs_sums [B, g] float32 the whole rows' sums that decode_probs divides by (None:
    # float32 q, which is not renormalised). vocab_end None: the block holds every id.
    vocab_start: int = 0
    vocab_end: int | None = None
    probs_sums: torch.Tensor | None = None
    # Bytes of every block sent to the shard group for this step (the sum over vocabulary slices);
    # 0: only this block's own bytes count (the other shards get the ids alone).
    group_wire_bytes: int = 0

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
            owed_s=self.owed_s,
            catch_up_s=self.catch_up_s,
            num_catch_up_tokens=self.num_catch_up_tokens,
        )

    @property
    def num_wire_bytes(self) -> int:
        tensors = (self.draft_ids, self.probs_values, self.probs_ids, self.probs_sums)
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def vocab_slices(self, num_shards: int) -> list[DraftBlock]:
        """One block per shard of a vocabulary-parallel group: shard k gets the ids and its slice of
        a dense q (plus the rows' sums, so its decode divides by the very numbers decode_probs would).
        A top-k or absent q is small and sent whole to every shard."""
        if self.probs_values is None or self.probs_ids is not None:
            blocks = [self] * num_shards
        else:
            sums = None
            if self.probs_values.dtype != torch.float32:  # decode_probs renormalises only these
                sums = self.probs_values.float().sum(dim=-1)  # [B, g]
            blocks = [self._vocab_slice(*vocab_shard_range(self.vocab_size, num_shards, k), sums)
                      for k in range(num_shards)]
        total = sum(block.num_wire_bytes for block in blocks)
        return [dataclasses.replace(block, group_wire_bytes=total) for block in blocks]

    def _vocab_slice(self, start: int, end: int, sums: torch.Tensor | None) -> DraftBlock:
        # A copy: a view would ship the whole tensor through the object store.
        values = self.probs_values[..., start:end].clone()
        return dataclasses.replace(self, probs_values=values, vocab_start=start, vocab_end=end, probs_sums=sums)


def num_block_outputs(wire: WireFormat) -> int:
    """How many blocks the draft returns per step (DraftWorker.step; the coordinator's num_returns):
    one per vocabulary slice, or the whole block and the ids-only block."""
    return wire.vocab_shards if wire.vocab_shards > 1 else 2


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


def unpack_probs_slice(block: DraftBlock, vocab_start: int, vocab_end: int, device: torch.device) -> torch.Tensor | None:
    """q's ids [vocab_start, vocab_end) as the verifier reads them (`unpack_probs` of the whole q,
    sliced, bitwise): [B, g, vocab_end - vocab_start] float32 on `device`, or None when q was not sent.

    Reads a block cut by `vocab_slices` (its slice must be this one), a top-k block (only the ids of
    this slice are scattered) or a whole dense block.
    """
    if block.probs_values is None:
        return None
    if block.vocab_end is not None:
        if (block.vocab_start, block.vocab_end) != (vocab_start, vocab_end):
            raise ValueError(
                f"this shard verifies ids [{vocab_start}, {vocab_end}) but received the slice "
                f"[{block.vocab_start}, {block.vocab_end})"
            )
        values = block.probs_values.to(device).float()
        if block.probs_sums is not None:
            values = values / block.probs_sums.to(device).unsqueeze(-1)
        return values
    if block.probs_ids is None:
        return unpack_probs(block, device)[..., vocab_start:vocab_end]
    values = block.probs_values.to(device).float()
    values = values / values.sum(dim=-1, keepdim=True)
    ids = block.probs_ids.to(device).long() - vocab_start
    inside = (ids >= 0) & (ids < vocab_end - vocab_start)
    dense = torch.zeros(*values.shape[:-1], vocab_end - vocab_start, dtype=torch.float32, device=device)
    # Ids outside the slice add 0 at a valid index (scatter_add_, so they never overwrite a real one).
    return dense.scatter_add_(-1, ids.clamp(0, max(vocab_end - vocab_start - 1, 0)), torch.where(inside, values, 0.0))


def point_mass_block(ngram_ids: torch.Tensor, vocab_size: int, wire: WireFormat) -> DraftBlock:
    """A block of n-gram proposals (engine/proposers.py), q a point mass at each token, built where
    no draft runs (the coordinator): one (value 1, id) pair per position, whatever the wire format.

    Args:
        ngram_ids: [B, w] long.
    """
    values, ids = point_mass_pairs(ngram_ids) if wire.send_probs else (None, None)
    return DraftBlock(draft_ids=ngram_ids, probs_values=values, probs_ids=ids, vocab_size=vocab_size)


def point_mass_pairs(token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q a point mass at each token, in the top-k wire form with k = 1: every decode (`decode_probs`,
    `unpack_probs_slice`) reads the same dense one-hot as from any other encoding of it.

    Args:
        token_ids: [*shape] long.
    Returns:
        values [*shape, 1] float32 (ones), ids [*shape, 1] int32.
    """
    return torch.ones(*token_ids.shape, 1, dtype=torch.float32), token_ids[..., None].to(torch.int32)
