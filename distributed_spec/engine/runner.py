"""ModelRunner: one causal LM plus its batched KV cache, driven by a few verbs.

    from distributed_spec.engine.runner import ModelRunner

The same class serves the draft and the target (and, in the Ray runtime, each tensor-parallel shard
of the target). Its verbs: `start`, `add_rows`, `prefill`, `forward_tokens`, `rollback`, `drop_rows`, `fork_rows`,
`compact`.
`start` / `add_rows` stage prompts so that they go through the model with the next `forward_tokens`
calls (the first draft step, or the first block the target scores): no separate prefill forward,
as in HF assisted generation, with the same cache afterwards. `add_rows` joins new rows to a running
batch (continuous batching); `forward_tokens(max_staged=k)` feeds at most k staged tokens per row,
so a long prompt goes in by chunks beside the other rows' blocks.

How a batch of ragged rows lives in one cache (exact, no recompute):
- The cache has L slots per row (a `transformers.DynamicCache`, [B, H, L, D] per layer) and
  `slot_mask` [B, L] says which slots hold a kept token of that row (1) and which are padding (0).
- Prompts are left-padded. Every forward appends n slots to every row; `input_mask` [B, n] marks
  the slots that are real tokens of the row, so rows may feed different numbers of tokens.
- Position ids are explicit per row: a token's position is the number of kept slots before it
  (`slot_mask.sum(-1)`), so padding and holes never shift positions.
- Attention uses causal order over slots AND the slot mask, so a masked slot (padding, or a rejected
  draft token) is invisible to every later query: the result is the one of a forward over the kept
  tokens alone (up to float summation order; tested to 1e-5).
- `rollback(num_kept, num_new_slots)` keeps, per row, the first num_kept[b] of the last
  num_new_slots slots: it crops (DynamicCache.crop) the slots past the longest kept row, and masks
  the rest of each shorter row (a hole). Holes cost attention work but never change results;
  `compact` gathers every row's kept slots to the right (left padding again) and crops the leftover
  columns; it runs by itself once holes and padding exceed `compact_fraction` of the cache.
- `drop_rows` keeps a subset of rows (finished sequences stop costing work).
- Rows that join a running batch hold nothing yet: their first prompt chunk goes through a forward of
  its own (`prefill_apart_min_slots`), and its keys and values land in the row's padding slots at the
  right end of the cache. Fed with the other rows' blocks instead, the chunk would pad every row of
  the forward (and of the cache) to its length: B x chunk slots where only the chunk is real.
- `drop_rows` keeps a subset of rows (finished sequences stop costing work); `fork_rows` repeats
  rows (K draft paths over one prefix).
Why holes rather than cropping every row to the shortest kept prefix and re-feeding the tokens the
other rows kept: re-feeding recomputes up to g tokens per row and iteration; a hole costs one masked
slot in attention until the next compaction, and nothing is ever recomputed.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel

from distributed_spec.models.cpu_attention import use_gqa_attention


class ModelRunner:
    """A causal LM, its KV cache and the per-slot mask of the current batch."""

    # Feed new rows' first prompt chunks in a forward of their own once the padding that sharing the
    # batch's forward would cost, (rows not joining) x (longest chunk), reaches this many slots: below
    # it, a second forward costs more than the padding (measured on 2 CPU cores, docs/design.md).
    prefill_apart_min_slots: int = 256

    def __init__(self, model: PreTrainedModel, compact_fraction: float = 0.5) -> None:
        if not 0.0 < compact_fraction <= 1.0:
            raise ValueError(f"compact_fraction must be in (0, 1], got {compact_fraction}")
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.compact_fraction = compact_fraction
        # The runner's forwards of several positions carry the slot mask: on the CPU, grouped-query
        # attention without transformers' copy of the cache per query head (same outputs, bitwise;
        # models/cpu_attention.py).
        self.gqa_attention = use_gqa_attention(model)
        # The logits' width; a sub-vocabulary draft head still returns logits over config.vocab_size.
        self.vocab_size = int(model.config.vocab_size)
        forward_params = inspect.signature(model.forward).parameters
        self._cache_kwarg = _cache_kwarg(model)
        self._can_keep_logits = "logits_to_keep" in forward_params
        self.num_forward_calls = 0
        # Seconds and prompt tokens of the forwards that fed joining rows apart (cumulative): the
        # goodput schedule takes them off a step's wall clock, measured rather than estimated.
        self.prefill_apart_s = 0.0
        self.num_prefill_apart_tokens = 0
        self.cache: DynamicCache | None = None
        # [B, L] long: 1 where slot l of row b holds a kept token.
        self.slot_mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)
        # Per row: staged prompt tokens that the next forwards feed first, ahead of their own tokens.
        self._staged: list[list[int]] = []

    @property
    def batch_size(self) -> int:
        return self.slot_mask.shape[0]

    @property
    def num_slots(self) -> int:
        return self.slot_mask.shape[1]

    def num_kept_tokens(self) -> torch.Tensor:
        """[B] long: kept tokens per row, which is also the position id of the row's next token."""
        return self.slot_mask.sum(dim=-1)

    def reset(self, batch_size: int) -> None:
        self.cache = DynamicCache()
        self.slot_mask = torch.zeros(batch_size, 0, dtype=torch.long, device=self.device)
        self._staged = [[] for _ in range(batch_size)]

    def start(self, prompt_ids: list[list[int]]) -> None:
        """Start a new batch without a forward: the prompts (rows may be empty) go through the model
        with the next `forward_tokens` call, ahead of its tokens."""
        self.reset(0)
        self.add_rows(prompt_ids)

    def add_rows(self, prompt_ids: list[list[int]]) -> None:
        """Append rows to the batch (after the existing ones) without a forward; their prompts are
        staged like `start`'s. The new rows' existing slots are padding (masked)."""
        num_new = len(prompt_ids)
        if num_new == 0:
            return
        if self.cache is None or self.batch_size == 0 or self.num_slots == 0:
            # Nothing cached worth keeping: a fresh cache avoids carrying empty slots.
            staged = self._staged if self.cache is not None else []
            self.reset(self.batch_size)
            self._staged = staged
        else:
            _append_empty_rows(self.cache, num_new)
        padding = torch.zeros(num_new, self.num_slots, dtype=torch.long, device=self.device)
        self.slot_mask = torch.cat([self.slot_mask, padding], dim=0)
        self._staged.extend(list(map(int, ids)) for ids in prompt_ids)

    def num_staged_tokens(self) -> list[int]:
        """[B] staged prompt tokens per row not yet fed."""
        return [len(staged) for staged in self._staged]

    @contextmanager
    def staged_held(self, held: list[bool]) -> Iterator[None]:
        """Within the block, forwards feed no staged token of the rows held ([B] bools): their
        prompts stay staged for a later forward (rows must not change inside the block)."""
        aside = [staged if hold else [] for staged, hold in zip(self._staged, held)]
        self._staged = [[] if hold else staged for staged, hold in zip(self._staged, held)]
        try:
            yield
        finally:
            self._staged = [first + rest for first, rest in zip(aside, self._staged)]

    @torch.no_grad()
    def prefill(self, prompt_ids: list[list[int]]) -> torch.Tensor | None:
        """Start a new batch: left-pad the prompts and run them through the model in one forward.

        Rows may be empty (nothing to cache yet). Returns the logits of each row's last prompt token
        [B, V], or None when every row is empty (no forward was run); rows that are empty get
        meaningless logits.
        """
        self.reset(len(prompt_ids))
        input_ids, input_mask = _left_pad(prompt_ids)
        if input_ids.shape[1] == 0:
            return None
        logits = self.forward_tokens(input_ids.to(self.device), input_mask.to(self.device), num_logits=1)
        return logits[:, -1]

    @torch.no_grad()
    def forward_tokens(
        self,
        input_ids: torch.Tensor,
        input_mask: torch.Tensor | None = None,
        num_logits: int | None = None,
        max_staged: int | None = None,
    ) -> torch.Tensor:
        """Append n slots to every row (after its staged tokens, if any) and return their logits.

        Args:
            input_ids: [B, n] long.
            input_mask: [B, n] long/bool, 1 for real tokens; None means all real. Masked slots are
                appended as padding (their logits are meaningless).
            num_logits: return only the last num_logits positions (skips LM-head work); None = all n.
            max_staged: feed at most this many staged tokens per row first (None: all of them).
        Returns:
            logits: [B, num_logits or n, V] (the model's dtype).
        """
        if self.cache is None:
            raise RuntimeError("ModelRunner.forward_tokens called before prefill/reset")
        batch_size, num_new = input_ids.shape
        if batch_size != self.batch_size:
            raise ValueError(f"input_ids has {batch_size} rows, the cache holds {self.batch_size}")
        if input_mask is None:
            input_mask = torch.ones_like(input_ids)
        input_mask = input_mask.to(torch.long)
        staged_chunks = self._take_staged(max_staged)
        if staged_chunks is not None:
            staged_chunks = self._prefill_new_rows_apart(staged_chunks)
        if staged_chunks is not None:
            # The staged prompts go first, in the same forward; only the caller's n positions come back.
            staged_ids, staged_mask = _left_pad(staged_chunks)
            num_logits = min(num_logits or num_new, num_new)
            input_ids = torch.cat([staged_ids.to(self.device), input_ids], dim=1)
            input_mask = torch.cat([staged_mask.to(self.device), input_mask], dim=1)
            num_new = input_ids.shape[1]
        # Position of each new token = kept slots before it in its row; padding slots reuse a valid id.
        position_ids = self.num_kept_tokens()[:, None] + input_mask.cumsum(dim=-1) - 1
        position_ids = position_ids.clamp(min=0)
        self.slot_mask = torch.cat([self.slot_mask, input_mask], dim=-1)
        logits = self._model_forward(input_ids, self.slot_mask, position_ids, self.cache, num_logits)
        return logits[:, -num_logits:] if num_logits else logits

    def _model_forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache: DynamicCache,
        num_logits: int | None,
    ) -> torch.Tensor:
        """One model call appending input_ids [B, n] to `cache`; logits [B, n or num_logits, V]."""
        num_new = input_ids.shape[1]
        keep = {}
        if num_logits and self._can_keep_logits:
            # Positions as an index tensor, not the int: the int slices a strided view of the hidden
            # states, and on the CPU a bf16 LM head over such a view takes a batched matmul that
            # copies the whole [V, hidden] weight (73 ms per SmolLM2 prefill); indexing gives a dense copy.
            keep["logits_to_keep"] = torch.arange(max(num_new - num_logits, 0), num_new, device=self.device)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            **{self._cache_kwarg: cache},
            **keep,
        )
        self.num_forward_calls += 1
        return out.logits

    def _take_staged(self, max_staged: int | None) -> list[list[int]] | None:
        """Remove and return each row's next staged chunk, or None when no row has staged tokens."""
        if not any(self._staged):
            return None
        limit = None if max_staged is None else max(max_staged, 0)
        chunks = [staged[:limit] for staged in self._staged]
        self._staged = [staged[len(chunk) :] for staged, chunk in zip(self._staged, chunks)]
        return chunks

    def _prefill_new_rows_apart(self, chunks: list[list[int]]) -> list[list[int]] | None:
        """Feed the chunks of rows that hold no slot yet in a forward of their own, when that saves
        enough padding (class docstring); returns the chunks left for the shared forward (None: none).

        Their keys and values [n, H, C, D] go into the last C slots of their rows, which are padding:
        a row's attention sees only its own kept slots in slot order, and positions count kept slots,
        so where the slots sit does not change any result.
        """
        if self.num_slots == 0:
            return chunks
        has_slots = self.slot_mask.any(dim=-1).tolist()
        new_rows = [row for row, chunk in enumerate(chunks) if chunk and not has_slots[row]]
        if not new_rows or len(new_rows) == self.batch_size:
            return chunks
        longest = max(len(chunks[row]) for row in new_rows)
        if (self.batch_size - len(new_rows)) * longest < self.prefill_apart_min_slots:
            return chunks
        start = time.perf_counter()
        input_ids, input_mask = _left_pad([chunks[row] for row in new_rows])
        input_ids, input_mask = input_ids.to(self.device), input_mask.to(self.device)
        own_cache = DynamicCache()
        position_ids = (input_mask.cumsum(dim=-1) - 1).clamp(min=0)
        self._model_forward(input_ids, input_mask, position_ids, own_cache, num_logits=1)
        if longest > self.num_slots:
            self._pad_left(longest - self.num_slots)
        rows = torch.tensor(new_rows, device=self.device)
        _place_slots(self.cache, own_cache, rows)
        self.slot_mask[rows, self.num_slots - longest :] = input_mask
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.prefill_apart_s += time.perf_counter() - start
        self.num_prefill_apart_tokens += int(input_mask.sum())
        for row in new_rows:
            chunks[row] = []
        return chunks if any(chunks) else None

    def _pad_left(self, num_slots: int) -> None:
        """Prepend num_slots padding slots to every row."""
        _map_states(self.cache, lambda states: F.pad(states, (0, 0, num_slots, 0)))
        self.slot_mask = F.pad(self.slot_mask, (num_slots, 0))

    def rollback(self, num_kept: torch.Tensor, num_new_slots: int) -> None:
        """Keep the first num_kept[b] of the last `num_new_slots` slots of each row; drop the rest.

        Args:
            num_kept: [B] long in [0, num_new_slots].
        """
        if num_new_slots == 0:
            return
        # Host sync: the crop length is a Python int (the cache is cropped on the host side).
        max_kept = int(num_kept.max()) if num_kept.numel() else 0
        self._crop(self.num_slots - num_new_slots + max_kept)
        tail = self.slot_mask[:, self.num_slots - max_kept :]
        offsets = torch.arange(max_kept, device=self.device)[None, :]
        tail.mul_((offsets < num_kept[:, None].to(self.device)).to(tail.dtype))
        self._maybe_compact()

    def drop_rows(self, keep_rows: torch.Tensor) -> None:
        """Keep only the rows `keep_rows` ([B'] long indices, in the new order)."""
        self.fork_rows(keep_rows)
        self._maybe_compact()

    def fork_rows(self, index: torch.Tensor) -> None:
        """Row i of the new batch is a copy of row index[i] ([B'] long; indices may repeat): keys,
        values, slot mask and staged tokens. Repeating rows forks them (multi-path drafting: K rows
        share a prefix, docs/design.md section 7); no compaction, so the slot layout is unchanged."""
        index = index.to(self.device)
        self._staged = [list(self._staged[row]) for row in index.tolist()]
        if self.cache is not None and self.num_slots == 0:
            # Nothing cached (every row that held slots has left): transformers skips
            # batch_select_indices on an empty cache, which would keep the old batch size.
            self.cache = DynamicCache()
        elif self.cache is not None:
            self.cache.batch_select_indices(index)
        self.slot_mask = self.slot_mask[index]

    def compact(self) -> None:
        """Gather each row's kept slots to the right end (left padding) and crop the unused columns."""
        if self.cache is None or self.batch_size == 0:
            return
        num_kept = self.num_kept_tokens()
        # Host sync: the new cache length is a Python int.
        new_len = int(num_kept.max())
        # Stable sort puts padding slots (0) first and kept slots (1) last, each in slot order.
        order = torch.sort(self.slot_mask, dim=-1, stable=True).indices[:, self.num_slots - new_len :]
        _gather_slots(self.cache, order)
        self.slot_mask = torch.gather(self.slot_mask, 1, order)

    def _crop(self, new_len: int) -> None:
        num_removed = self.num_slots - new_len
        if num_removed > 0:
            # transformers 5.x takes a negative count of slots to remove.
            self.cache.crop(-num_removed)
            self.slot_mask = self.slot_mask[:, :new_len]

    def _maybe_compact(self) -> None:
        if self.batch_size == 0 or self.num_slots == 0:
            return
        # Host sync: deciding whether to compact needs the longest row's length.
        num_unused = self.num_slots - int(self.num_kept_tokens().max())
        if num_unused > self.compact_fraction * self.num_slots:
            self.compact()


def _left_pad(prompt_ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, P] ids and mask (1 = real token) of the prompts, left-padded to the longest, P may be 0."""
    max_len = max((len(ids) for ids in prompt_ids), default=0)
    input_ids = torch.zeros(len(prompt_ids), max_len, dtype=torch.long)
    input_mask = torch.zeros(len(prompt_ids), max_len, dtype=torch.long)
    for row, ids in enumerate(prompt_ids):
        if ids:
            input_ids[row, max_len - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            input_mask[row, max_len - len(ids) :] = 1
    return input_ids, input_mask


def _append_empty_rows(cache: DynamicCache, num_new: int) -> None:
    """Append num_new rows of zero keys and values [num_new, H, L, D] to every layer (in place)."""
    _map_states(cache, lambda states: torch.cat([states, states.new_zeros((num_new, *states.shape[1:]))], dim=0))


def _place_slots(cache: DynamicCache, rows_cache: DynamicCache, rows: torch.Tensor) -> None:
    """Write rows_cache's keys and values [n, H, C, D] into the last C slots of `rows` [n] (in place)."""
    for layer, row_layer in zip(_cache_layers(cache), _cache_layers(rows_cache)):
        for states, row_states in zip(layer, row_layer):
            states[rows, :, states.shape[2] - row_states.shape[2] :] = row_states


def _cache_layers(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) [B, H, L, D] per layer."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache))


def _cache_kwarg(model: PreTrainedModel) -> str:
    """The KV cache's keyword: transformers 5.x renamed `past_key_values` to `cache`. A wrapper whose
    forward passes **kwargs on (the sub-vocabulary draft) takes its base model's name."""
    for forward in (model.forward, getattr(model, "base_model", model).forward):
        if "cache" in inspect.signature(forward).parameters:
            return "cache"
    return "past_key_values"


def _gather_slots(cache: DynamicCache, order: torch.Tensor) -> None:
    """Replace every layer's keys and values [B, H, L, D] by their slots `order` [B, L'] (in place)."""

    def gathered(states: torch.Tensor) -> torch.Tensor:
        index = order[:, None, :, None].expand(-1, states.shape[1], -1, states.shape[3])
        return torch.gather(states, 2, index)

    _map_states(cache, gathered)


def _map_states(cache: DynamicCache, function) -> None:
    """Replace every non-empty layer's keys and values [B, H, L, D] by function(them) (in place)."""
    if hasattr(cache, "layers"):  # recent transformers: one cache object per layer
        for layer in cache.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel() > 0:
                layer.keys, layer.values = function(layer.keys), function(layer.values)
    else:  # older transformers: parallel lists of tensors
        for index, keys in enumerate(cache.key_cache):
            if keys.numel() > 0:
                cache.key_cache[index] = function(keys)
                cache.value_cache[index] = function(cache.value_cache[index])
