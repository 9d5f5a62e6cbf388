"""`DraftWorker`: the draft model and its KV cache in one Ray actor (built by the coordinator).

It wraps the single-process engine's draft side (engine/sides.py): `step` applies the last verdict
and the step's row changes, then draws X_1..X_g (or nothing, in a step without a draft); rank 0's
verdict of a step arrives with the next `step` call (its `verdict`, with any `held` steps the draft
sat out, replayed first), which applies it. With verifier.num_paths = K > 1 `step` draws
K paths per row (engine/multipath_step.py propose_paths: the side stays forked to B*K rows) and the
verdict's kept path folds it back to B rows (commit_draft_paths). Two additions, both exact:
- the draft samples from q as it will be decoded by the verifier (wire.py: reduced precision or
  top-k), so the verifier reads exactly the distribution the draft sampled from;
- `propose_ahead` (parallel.overlap): while the shards verify block k, the draft feeds X_g, guesses
  the bonus token G ~ q_{g+1} and proposes block k+1 after it. Block k+1 is kept only when every row
  accepted all g drafts and its bonus token Y equals G (then block k+1 is exactly what `propose`
  would have drawn from that context); otherwise the 2g speculative slots are rolled back.

Verbs: `node_id`, `load`, `begin`, `step`, `propose_ahead`, `shutdown`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from distributed_spec.distributed.messages import DecodeSettings, DraftRequest, StepResult
from distributed_spec.distributed.wire import (
    DraftBlock,
    WireFormat,
    encode_probs,
    num_block_outputs,
    point_mass_pairs,
    sample_view,
)
from distributed_spec.engine.multipath_step import commit_draft_paths, propose_paths
from distributed_spec.engine.proposers import overlay_rows, pad_columns, point_mass_probs
from distributed_spec.engine.runner import ModelRunner
from distributed_spec.engine.sides import DraftSide
from distributed_spec.engine.steps import propose
from distributed_spec.models.cpu_linear import pack_cpu_linears
from distributed_spec.models.pair import ModelFacts
from distributed_spec.verify import RowSampling, logits_to_probs, sample_from_probs


class WireSampler:
    """`to_sampled` of a proposal (engine.steps.propose): the draft samples each q_i as the verifier
    will decode it (wire.sample_view), and the wire form of every q_i is kept for the block."""

    def __init__(self, wire: WireFormat) -> None:
        self.wire = wire
        self.values: list[torch.Tensor] = []  # per position: [rows, V or k] in the wire dtype
        self.ids: list[torch.Tensor | None] = []  # per position: [rows, k] int32 or None (dense)

    def __call__(self, probs: torch.Tensor) -> torch.Tensor:
        sampled_probs, values, ids = sample_view(probs, self.wire)
        self.values.append(values)
        self.ids.append(ids)
        return sampled_probs

    def stacked(self, draft_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The wire form of the q that drew draft_ids ([B, g'], or [B, K, g'] whose paths were
        sampled as rows b*K + k): values [*draft_ids.shape, V or k], ids [*draft_ids.shape, k] or None."""
        values = torch.stack(self.values, dim=1).view(*draft_ids.shape, -1)
        ids = None if self.ids[0] is None else torch.stack(self.ids, dim=1).view(*draft_ids.shape, -1)
        return values, ids


def propose_on_wire(
    draft: ModelRunner,
    draft_input_ids: torch.Tensor,
    draft_input_mask: torch.Tensor,
    g: int,
    sampling: RowSampling,
    draft_uniforms: torch.Tensor,
    wire: WireFormat,
    confidence_threshold: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """engine.steps.propose, sampling each X_i from q_i as the verifier will decode it.

    Args:
        draft_input_ids / draft_input_mask: [B, k] pending tokens, last column = Y.
        sampling: each row's settings; draft_uniforms: [B, g] float64.
    Returns:
        draft_ids [B, g'] long, probs values [B, g', V or k] (wire dtype), probs ids [B, g', k] or
        None, num_drafted [B] long (g' <= g and num_drafted < g' only with a confidence stop).
    """
    sampler = WireSampler(wire)
    draft_ids, _, num_drafted = propose(
        draft, draft_input_ids, draft_input_mask, g, sampling, draft_uniforms, sampler, confidence_threshold
    )
    return draft_ids, *sampler.stacked(draft_ids), num_drafted


@dataclass
class _AheadBlock:
    """A block drafted during the previous verification."""

    # [B] long: G, the draft's guess of the bonus token of the block being verified.
    guess_ids: torch.Tensor
    # [B, g'] long.
    draft_ids: torch.Tensor
    block: DraftBlock
    # The block length it was drafted for (g' < g after a confidence stop).
    g: int


class DraftWorker:
    """The draft side of the loop, one actor."""

    def __init__(self, num_threads: int = 1) -> None:
        torch.set_num_threads(max(1, num_threads))
        self.runner: ModelRunner | None = None
        self.side: DraftSide | None = None

    def pid(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        import ray  # noqa: PLC0415 - the class itself stays importable and testable without Ray

        return ray.get_runtime_context().get_node_id()

    def load(
        self,
        model_factory: Callable[[], torch.nn.Module],
        device: str,
        compact_fraction: float,
        seed: int,
    ) -> dict[str, ModelFacts]:
        """Build the draft on this actor's device. Returns its facts (vocabulary size, context length) and
        how many linears model.cpu_prepack packed."""
        self.device = torch.device(device, 0) if device == "cuda" else torch.device("cpu")
        model = model_factory().to(self.device)
        num_packed = pack_cpu_linears(model) if getattr(model_factory, "cpu_prepack", False) else 0
        self.runner = ModelRunner(model, compact_fraction)
        self.side = DraftSide(self.runner)
        # Uniforms of blocks drafted ahead (the coordinator cannot know their rows in advance).
        self.generator = torch.Generator().manual_seed(seed)
        return {"facts": ModelFacts.of_model(model), "packed_linears": num_packed}

    def begin(self, settings: DecodeSettings) -> None:
        """Start a run with an empty batch."""
        self.wire = settings.wire
        self.confidence_threshold = settings.draft_confidence_threshold
        self.side.reset()
        # [B, g] or [B, K, g]: the block being verified.
        self.draft_ids = torch.zeros(0, 0, dtype=torch.long, device=self.device)
        self.decoding = torch.zeros(0, dtype=torch.bool, device=self.device)  # [B] of that step
        self.sampling = RowSampling(())  # each row's settings in that step
        # That step's n-gram rows ([B] bool, None: none) and the tokens this draft drafted in it.
        self.from_ngram: torch.Tensor | None = None
        self.num_model_drafts = 0
        # That step's drafting rows ([B] bool, None: all; DraftRequest.draft_rows).
        self.draft_rows: torch.Tensor | None = None
        self.result: StepResult | None = None
        self.ahead: _AheadBlock | None = None

    def step(
        self,
        request: DraftRequest,
        verdict: StepResult | None = None,
        held: Sequence[tuple[DraftRequest, StepResult]] = (),
    ) -> tuple[DraftBlock | None, ...]:
        """Apply the last verdict and the row changes; return the next block as the shards receive it
        (`_for_shards`). All None when request.g is 0: the step runs without a draft.

        verdict: rank 0's StepResult of this actor's previous step; it rides on this call rather than
        a call of its own (one Ray call fewer per drafting step). held: the steps run without the
        draft since then (the coordinator held them), replayed in order before this one.
        """
        if verdict is not None:
            self.commit(verdict)
        self.replay(held)
        return self._step(request)

    def _step(self, request: DraftRequest) -> tuple[DraftBlock | None, ...]:
        start = time.perf_counter()
        discarded_ahead_s = 0.0 if self.ahead is None else self.ahead.block.draft_s
        usable = self._apply_result(request)
        self.decoding = request.decoding.to(self.device)
        self.sampling = request.sampling
        has_ngram_rows = request.from_ngram is not None and bool(request.from_ngram.any())
        self.from_ngram = request.from_ngram.to(self.device) if has_ngram_rows else None
        self.num_model_drafts = request.g
        self.draft_rows = None if request.draft_rows is None or request.g == 0 else request.draft_rows.to(self.device)
        if request.g == 0:
            self.draft_ids = torch.zeros(len(self.decoding), 0, dtype=torch.long, device=self.device)
            if request.catch_up:
                self.side.catch_up()
            return (None,) * num_block_outputs(self.wire)
        if usable is not None:
            self.draft_ids = usable.draft_ids
            return self._for_shards(usable.block)
        owed_before = self._owed_s()
        catch_up_before = (self.side.catch_up_s, self.side.num_catch_up_tokens)
        # What the draft lags behind goes in first, timed apart (a debt of earlier steps).
        self.side.catch_up(rows=self.draft_rows)
        draft_ids, values, ids, num_drafted = self._propose(request)
        self.num_model_drafts = draft_ids.shape[-1]
        if self.from_ngram is not None:
            draft_ids, values, ids, num_drafted = self._with_ngram_rows(
                request.ngram_ids.to(self.device), draft_ids, values, ids, num_drafted
            )
        self.draft_ids = draft_ids
        block = self._pack(draft_ids, values, ids, num_drafted, time.perf_counter() - start)
        block.discarded_ahead_s = discarded_ahead_s
        block.owed_s = self._owed_s() - owed_before
        block.catch_up_s = self.side.catch_up_s - catch_up_before[0]
        block.num_catch_up_tokens = self.side.num_catch_up_tokens - catch_up_before[1]
        return self._for_shards(block)

    def _owed_s(self) -> float:
        """Seconds so far of forwards for work owed by earlier steps: prompts fed apart, catch-up."""
        return self.runner.prefill_apart_s + self.side.catch_up_s

    def _propose(
        self, request: DraftRequest
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """The step's block from each row's pending input, q sampled as it goes on the wire.

        Returns:
            draft_ids [B, g'] (one path) or [B, K, g] (request.num_paths = K > 1, the side left forked
            to B*K rows until the verdict comes: engine/multipath_step.py), q's values and ids in
            the same leading shape (WireSampler.stacked), num_drafted [B] long (None: K > 1, never
            a confidence stop).
        """
        sampler = WireSampler(self.wire)
        if request.num_paths > 1:
            draft_ids, _ = propose_paths(
                self.side,
                request.g,
                request.num_paths,
                request.sampling,
                request.draft_uniforms,
                self.decoding,
                sampler,
            )
            num_drafted = None
        else:
            draft_ids, _, num_drafted = self.side.propose(
                request.g,
                request.sampling,
                request.draft_uniforms,
                self.decoding,
                sampler,
                self.confidence_threshold,
                self.draft_rows,
            )
        return draft_ids, *sampler.stacked(draft_ids), num_drafted

    def _for_shards(self, block: DraftBlock) -> tuple[DraftBlock, ...]:
        """Vocabulary-parallel verification: one block per shard with its slice of q. Otherwise the
        block whole (for rank 0, the verifier) and without q (for the other shards)."""
        if self.wire.vocab_shards > 1:
            return tuple(block.vocab_slices(self.wire.vocab_shards))
        return block, block.without_probs()

    def _with_ngram_rows(
        self,
        ngram_ids: torch.Tensor,
        draft_ids: torch.Tensor,
        values: torch.Tensor,
        ids: torch.Tensor | None,
        num_drafted: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """engine.proposers.combine_blocks on q's wire form: the n-gram rows' point masses go through
        the same encoding as the draft's q (exact: 0 and 1 are exact in every wire dtype).

        Args:
            ngram_ids: [B, w]; draft_ids: [B, g']; values: [B, g', V or k]; ids: [B, g', k] or None;
            num_drafted: [B].
        Returns:
            the same four for the combined block of width max(w, g').
        """
        width = max(ngram_ids.shape[1], draft_ids.shape[1])
        padded = pad_columns(ngram_ids, width)
        point_values, point_ids = encode_probs(point_mass_probs(padded, self.runner.vocab_size), self.wire)
        model_rows = ~self.from_ngram
        combined_ids = overlay_rows(padded, draft_ids, model_rows)
        combined_values = overlay_rows(point_values, values, model_rows)
        if ids is not None:
            ids = overlay_rows(point_ids, ids, model_rows)
        # An n-gram row's block is as long as the scheduler planned (num_drafted clips model rows only).
        num_drafted = torch.where(model_rows, num_drafted, width)
        return combined_ids, combined_values, ids, num_drafted

    def propose_ahead(self, g: int) -> None:
        """Draft block k+1 (g tokens) while block k is verified, assuming block k is accepted whole."""
        start = time.perf_counter()
        batch_size = self.draft_ids.shape[0]
        # Feed X_g (never fed by propose) to get q_{g+1}, then guess the bonus token from it.
        logits = self.runner.forward_tokens(self.draft_ids[:, -1:])[:, 0]  # [B, V]
        uniforms = torch.rand(batch_size, g + 1, generator=self.generator, dtype=torch.float64)
        sampled_probs, _, _ = sample_view(logits_to_probs(logits, self.sampling), self.wire)
        guess_ids = sample_from_probs(sampled_probs, uniforms[:, 0].to(sampled_probs.device))  # [B]
        draft_ids, values, ids, num_drafted = propose_on_wire(
            self.runner,
            guess_ids[:, None],
            torch.ones_like(guess_ids[:, None]),
            g,
            self.sampling,
            uniforms[:, 1:],
            self.wire,
            self.confidence_threshold,
        )
        block = self._pack(draft_ids, values, ids, num_drafted, time.perf_counter() - start)
        block.from_overlap = True
        self.ahead = _AheadBlock(guess_ids=guess_ids, draft_ids=draft_ids, block=block, g=g)

    def commit(self, result: StepResult) -> None:
        """Remember rank 0's verdict; it is applied at the next step, which knows the kept rows."""
        self.result = result

    def replay(self, steps: Sequence[tuple[DraftRequest, StepResult]]) -> None:
        """Steps the coordinator ran without the draft (g = 0, no catch-up) and held back: each one's
        row changes and verdict, in order, as a step with that verdict would have applied them."""
        for request, result in steps:
            self._step(request)
            self.commit(result)

    def shutdown(self) -> None:
        self.runner = None
        self.side = None

    def _apply_result(self, request: DraftRequest) -> _AheadBlock | None:
        """Roll the cache back to the kept prefix and apply the row changes; return the block drafted
        ahead when it is valid for this step."""
        result, ahead = self.result, self.ahead
        self.result, self.ahead = None, None
        keep_rows = request.keep_rows
        usable = None
        if result is not None:
            accepted_counts = result.accepted_counts.to(self.device)  # [B]
            next_tokens = result.next_tokens.to(self.device)  # [B]
            if result.path_indices is not None:
                # A K-path step: the side is still forked to B*K rows (no block is drafted ahead).
                commit_draft_paths(
                    self.side,
                    self.draft_ids,
                    accepted_counts,
                    next_tokens,
                    result.path_indices,
                    self.decoding,
                )
            elif ahead is None:
                if self.from_ngram is None:
                    self.side.commit(
                        self.draft_ids, accepted_counts, next_tokens, self.decoding, draft_rows=self.draft_rows
                    )
                else:
                    # The verified block is the combined one (the result carries it, also when the
                    # draft did not run).
                    self.side.commit(
                        result.draft_ids.to(self.device), accepted_counts, next_tokens, self.decoding,
                        self.from_ngram, self.num_model_drafts, self.draft_rows,
                    )
            else:
                verified_g = self.draft_ids.shape[1]
                hit = (accepted_counts == verified_g) & (next_tokens == ahead.guess_ids)  # [B]
                kept_hit = hit if keep_rows is None else hit[keep_rows.to(self.device)]
                same_rows = not request.new_prompts and bool(request.decoding.all())
                # Drafted for every row: not usable once some rows' blocks come from n-grams.
                model_only = request.from_ngram is None or not bool(request.from_ngram.any())
                # Host sync: whether the block drafted ahead is usable decides what to run next.
                # Drafted for every row: not usable in a probe step that drafts for a few (draft_rows).
                every_row = request.draft_rows is None
                if same_rows and model_only and every_row and bool(kept_hit.all()) and ahead.g == request.g:
                    usable = ahead
                else:
                    # Slots since the last commit: X_1..X_{g-1}, X_g, G, X'_1..X'_{g'-1}; keep X_1..X_tau.
                    num_new_slots = verified_g + ahead.draft_ids.shape[1]
                    self.runner.rollback(accepted_counts, num_new_slots)
                    self.side.pending_ids = torch.stack([self.draft_ids[:, -1], next_tokens], dim=1)  # [B, 2]
                    self.side.pending_mask = torch.stack(
                        [torch.zeros_like(next_tokens), torch.ones_like(next_tokens)], dim=1
                    )
                self.side.last_ids = next_tokens
        self.side.update_rows(keep_rows, request.new_prompts)
        if usable is not None and keep_rows is not None:
            usable = _select_rows(usable, keep_rows.to(self.device))
        return usable

    def _pack(
        self,
        draft_ids: torch.Tensor,
        values: torch.Tensor,
        ids: torch.Tensor | None,
        num_drafted: torch.Tensor | None,
        draft_s: float,
    ) -> DraftBlock:
        send = self.wire.send_probs
        if send and all(self.sampling.greedy_rows()):
            # Temperature 0 everywhere: each q_i is one-hot at X_i (verify.logits_to_probs), so a
            # (1, X_i) pair is the same q in a few bytes, not V floats a token (docs/distributed.md).
            values, ids = point_mass_pairs(draft_ids.cpu())
        return DraftBlock(
            # Host copies: the block leaves this process through Ray's object store.
            draft_ids=draft_ids.cpu(),
            probs_values=values.cpu() if send else None,
            probs_ids=ids.cpu() if send and ids is not None else None,
            vocab_size=self.runner.vocab_size,
            num_drafted=None if num_drafted is None else num_drafted.cpu(),
            draft_s=draft_s,
            num_draft_calls=self.runner.num_forward_calls,
        )


def _select_rows(ahead: _AheadBlock, keep_rows: torch.Tensor) -> _AheadBlock:
    block = ahead.block
    cpu_rows = keep_rows.cpu()
    return _AheadBlock(
        guess_ids=ahead.guess_ids[keep_rows],
        draft_ids=ahead.draft_ids[keep_rows],
        g=ahead.g,
        block=DraftBlock(
            draft_ids=block.draft_ids[cpu_rows],
            probs_values=None if block.probs_values is None else block.probs_values[cpu_rows],
            probs_ids=None if block.probs_ids is None else block.probs_ids[cpu_rows],
            vocab_size=block.vocab_size,
            num_drafted=None if block.num_drafted is None else block.num_drafted[cpu_rows],
            draft_s=block.draft_s,
            from_overlap=True,
            num_draft_calls=block.num_draft_calls,
        ),
    )
