"""`TargetShard`: one tensor-parallel rank of the target, a Ray actor (built by the coordinator).

Each shard joins the shard group (torch.distributed through DeepSpeed) and builds its slice of the
target through DeepSpeed AutoTP (`init_inference(tensor_parallel={"tp_size": N},
replace_with_kernel_inject=False)`): from a safetensors checkpoint it reads only its own slice
(shard_loading.py; no rank holds the full weights); a model built in code (tiny test models) is
built whole and cut. After the sharding pass the model is an ordinary module whose linear layers
all-reduce inside the group, so the single-process runner drives it unchanged: the parallelism is
applied to plain model code from outside, never written into it.

Verbs: `node_id`, `load`, `load_draft`, `logits` and `output_width` (tests), `begin`,
`score_and_verify`, `draft_and_verify`, `shutdown`.

With parallel.draft_in_shard the draft lives in rank 0's actor too (`load_draft`: a DraftWorker,
the same object the draft actor wraps), and a step is one call per rank, `draft_and_verify`: the
draft applies its last verdict, which it kept here, and the row changes, proposes the block, rank 0
broadcasts the block's ids to the other ranks (tp_size > 1), and the group scores and verifies it;
q never leaves rank 0's process. Steps without the draft model reach the draft as they reach a
draft actor: held back by the coordinator and replayed, in order, before the draft's next step.

One step (`score_and_verify`): every rank applies the step's row changes (finished rows leave, new
rows join with their prompts staged) and scores [Y, X_1..X_g] after each row's next prompt chunk in
one forward (engine/sides.py TargetSide; the all-reduces of the row-parallel layers run inside it);
rank 0 alone receives q, decodes it and verifies with the uniforms the scheduler drew, then
broadcasts [accepted_counts, next_tokens] so every rank crops its KV cache identically even if a
backend's all-reduce ever differed in the last bit between ranks. Full target probabilities never
leave the group: rank 0 answers with 2B ids and the verified block.

A block of K > 1 paths per row ([B, K, g], verifier.num_paths) runs engine/multipath_step.py's
target half instead: every rank feeds staged prompt chunks unforked, forks its rows K ways and
scores [B*K, g+1] in one forward; rank 0 verifies with verify_paths and broadcasts tau, Y and the
kept path; every rank rolls back and keeps the kept path's row (gather only: multi-path
verification has no vocabulary-parallel form, see ParallelConfig.require_paths_supported).

With `parallel.verify=vocab_parallel` (DecodeSettings.verify) the output head is swapped for this
rank's vocabulary slice (vocab_head.py), so the forward returns [B, g+1, V/tp] logits; each rank
receives its slice of q and every rank runs verify_parallel's collectives, whose result is the
same on every rank: no broadcast (docs/design.md section 4).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from distributed_spec.distributed.draft_worker import DraftWorker
from distributed_spec.distributed.memory import peak_rss_bytes, reset_peak_rss, rss_bytes
from distributed_spec.distributed.messages import DecodeSettings, DraftRequest, StepRequest, StepResult
from distributed_spec.distributed.rendezvous import Rendezvous, ShardPlacement, init_shard_group
from distributed_spec.distributed.shard_loading import autotp, load_shard, parameter_bytes
from distributed_spec.distributed.vocab_head import head_vocab_size, use_head, vocab_slice_head
from distributed_spec.distributed.wire import DraftBlock, unpack_probs, unpack_probs_slice
from distributed_spec.engine.executor import verify_step
from distributed_spec.engine.multipath_step import (
    commit_target_paths,
    kept_blocks,
    score_paths,
    verify_paths_from_logits,
)
from distributed_spec.engine.runner import ModelRunner
from distributed_spec.engine.sides import TargetSide
from distributed_spec.models.cpu_linear import pack_cpu_linears
from distributed_spec.models.pair import ModelFacts
from distributed_spec.verify_parallel import VocabShard
from distributed_spec.verify_parallel.step import verify_step_vocab_parallel

logger = logging.getLogger(__name__)

ModelFactory = Callable[[], torch.nn.Module]


def build_shard(model_factory: ModelFactory, tp_size: int, device: torch.device) -> torch.nn.Module:
    """This rank's shard: read from the factory's checkpoint when it has one, else built whole and cut."""
    checkpoint = model_factory.checkpoint() if hasattr(model_factory, "checkpoint") else None
    if checkpoint is not None:
        return load_shard(checkpoint, tp_size, device)
    model = model_factory().eval()
    return autotp(model, tp_size, next(model.parameters()).dtype)


class TargetShard:
    """One rank of the target shard group; rank 0 answers the coordinator."""

    def __init__(self, num_threads: int = 1) -> None:
        torch.set_num_threads(max(1, num_threads))
        self.model: torch.nn.Module | None = None
        self.runner: ModelRunner | None = None
        self.side: TargetSide | None = None
        self.rank = -1
        self.world_size = 1
        self.device = torch.device("cpu")
        # The output heads: AutoTP's (hidden-sharded, full logits) and, built at the first
        # vocab_parallel batch, this rank's vocabulary slice; `shard` is then this rank's VocabShard.
        self.full_head: torch.nn.Module | None = None
        self.vocab_head: torch.nn.Module | None = None
        self.shard: VocabShard | None = None
        # parallel.draft_in_shard: the draft, in this process (load_draft).
        self.draft: DraftWorker | None = None

    def node_id(self) -> str:
        import ray  # noqa: PLC0415 - the class itself stays importable and testable without Ray

        return ray.get_runtime_context().get_node_id()

    def pid(self) -> int:
        return os.getpid()

    def load(
        self,
        model_factory: ModelFactory,
        rendezvous: Rendezvous,
        placement: ShardPlacement,
        device: str,
        backend: str,
        timeout_s: float,
        compact_fraction: float,
    ) -> dict[str, int | None]:
        """Join the group and build this rank's shard of the target.

        Returns the target's facts (models.pair.ModelFacts: vocabulary size, context length; the group
        checks the pair with them),
        and what the shard holds: its parameter bytes, and how much its resident host memory grew
        while loading at its peak (`load_peak_rss_bytes`; includes mapped checkpoint pages), and how
        many linears model.cpu_prepack packed (`packed_linears`).
        """
        init_shard_group(rendezvous, placement, device, backend, timeout_s)
        self.rank = placement.rank
        self.world_size = rendezvous.world_size
        self.device = torch.device(device, 0) if device == "cuda" else torch.device("cpu")
        reset_peak_rss()
        rss_before = rss_bytes()
        self.model = build_shard(model_factory, rendezvous.world_size, self.device)
        # After AutoTP: its sharded layers are not nn.Linear and stay as they are.
        num_packed = pack_cpu_linears(self.model) if getattr(model_factory, "cpu_prepack", False) else 0
        load_peak_rss = peak_rss_bytes() - rss_before
        self.runner = ModelRunner(self.model, compact_fraction)
        self.side = TargetSide(self.runner)
        self.full_head = self.model.get_output_embeddings()
        return {
            "facts": ModelFacts.of_model(self.model),
            "parameter_bytes": parameter_bytes(self.model),
            "load_peak_rss_bytes": load_peak_rss,
            "packed_linears": num_packed,
        }

    def load_draft(
        self, model_factory: ModelFactory, device: str, compact_fraction: float, seed: int
    ) -> dict[str, ModelFacts]:
        """parallel.draft_in_shard: build the draft in this actor, on this shard's threads (DraftWorker.load)."""
        self.draft = DraftWorker(num_threads=torch.get_num_threads())
        return self.draft.load(model_factory, device, compact_fraction, seed)

    def begin(self, settings: DecodeSettings) -> None:
        """Start a run with an empty batch, with the output head its verification mode needs."""
        if self.draft is not None:
            self.draft.begin(settings)
        self.method = settings.method
        self.vocab_parallel = settings.verify == "vocab_parallel"
        if self.vocab_parallel and self.vocab_head is None:
            # Every rank begins together, so the head's all-gathers meet here.
            self.shard = VocabShard(head_vocab_size(self.full_head))
            self.vocab_head = vocab_slice_head(self.full_head, self.shard)
        use_head(self.model, self.vocab_head if self.vocab_parallel else self.full_head)
        self.side.reset()

    @torch.no_grad()
    def score_and_verify(self, block: DraftBlock, request: StepRequest) -> StepResult | None:
        """Apply the row changes, score the block, verify it inside the group, crop the cache. Rank 0
        returns the result (the other ranks get the block without q)."""
        prefill_before = (self.runner.prefill_apart_s, self.runner.num_prefill_apart_tokens)
        self.side.update_rows(request.keep_rows, request.new_prompts)
        num_draft_tokens = request.num_draft_tokens  # [B]
        if block.num_drafted is not None:
            num_draft_tokens = torch.minimum(num_draft_tokens, block.num_drafted)
        start = time.perf_counter()
        # A block of K paths per row is [B, K, g] (engine/multipath_step.py), one path [B, g].
        step = self._step_paths if block.draft_ids.dim() == 3 else self._step_one_path
        accepted_counts, next_tokens, path_indices, scored = step(block, request, num_draft_tokens)
        self._synchronize()
        if self.rank != 0:
            return None
        if path_indices is not None:
            path_indices = path_indices.cpu()
        kept_ids = block.draft_ids if path_indices is None else kept_blocks(block.draft_ids, path_indices)
        return StepResult(
            # Host copies: the verdict leaves the group through Ray (2B ids + the block's ids).
            accepted_counts=accepted_counts.cpu(),
            next_tokens=next_tokens.cpu(),
            draft_ids=kept_ids,
            num_draft_tokens=num_draft_tokens,
            target_s=scored - start,
            verify_s=time.perf_counter() - scored,
            draft_s=block.draft_s,
            from_overlap=block.from_overlap,
            draft_own_s=0.0 if block.from_overlap else max(block.draft_s - block.owed_s, 0.0),
            num_wire_bytes=block.group_wire_bytes or block.num_wire_bytes,
            num_draft_calls=block.num_draft_calls,
            num_target_calls=self.runner.num_forward_calls,
            discarded_ahead_s=block.discarded_ahead_s,
            prefill_s=self.runner.prefill_apart_s - prefill_before[0] + block.owed_s,
            catch_up_s=block.catch_up_s,
            num_catch_up_tokens=block.num_catch_up_tokens,
            num_prefill_apart_tokens=self.runner.num_prefill_apart_tokens - prefill_before[1],
            path_indices=path_indices,
        )

    def draft_and_verify(
        self,
        draft_request: DraftRequest | None,
        block: DraftBlock | None,
        request: StepRequest,
        held: Sequence[tuple[DraftRequest, StepResult]] = (),
    ) -> StepResult | None:
        """parallel.draft_in_shard: one whole step, the draft in rank 0's process. Rank 0's draft
        replays the held steps, applies its last verdict and the row changes and proposes
        (DraftWorker.step). draft_request is None on the other ranks, and on rank 0 in a step the
        coordinator holds back from the draft (a step without the draft model: it reaches the draft
        later, in `held`). `block` is the coordinator's when the draft proposes nothing (n-gram
        blocks, or none: a plain step), else None on every rank: rank 0 then shares the drafted
        block's ids with the group (`_share_block`). The verdict stays with the draft for its next
        step."""
        drafted = self.draft.step(draft_request, None, held)[0] if draft_request is not None else None
        result = self.score_and_verify(self._share_block(drafted) if block is None else block, request)
        if draft_request is not None:
            if block is None:
                result.num_wire_bytes = 0  # the drafted block never left this process
            self.draft.commit(result)
        return result

    def _share_block(self, block: DraftBlock | None) -> DraftBlock:
        """Rank 0's drafted block (None elsewhere) on every rank: the other ranks get its ids and
        per-row lengths, all they read (only rank 0 decodes q), in three broadcasts of ids.

        Header: [ids.dim(), its shape padded to 3, whether num_drafted is sent, vocab size], long.
        """
        if self.world_size == 1:
            return block
        header = torch.zeros(6, dtype=torch.long, device=self.device)
        if self.rank == 0:
            shape = list(block.draft_ids.shape) + [0] * (3 - block.draft_ids.dim())
            header[:] = torch.tensor(
                [block.draft_ids.dim(), *shape, block.num_drafted is not None, block.vocab_size]
            )
        dist.broadcast(header, src=0)
        ndim, *shape, has_num_drafted, vocab_size = header.tolist()  # host sync: the shapes to receive
        ids = block.draft_ids.to(self.device) if self.rank == 0 else torch.empty(
            shape[:ndim], dtype=torch.long, device=self.device
        )
        dist.broadcast(ids, src=0)
        num_drafted = None
        if has_num_drafted:
            num_drafted = block.num_drafted.to(self.device) if self.rank == 0 else torch.empty(
                shape[0], dtype=torch.long, device=self.device
            )
            dist.broadcast(num_drafted, src=0)
        if self.rank == 0:
            return block
        return DraftBlock(
            draft_ids=ids.cpu(),
            probs_values=None,
            probs_ids=None,
            vocab_size=vocab_size,
            num_drafted=None if num_drafted is None else num_drafted.cpu(),
        )

    def _step_one_path(
        self, block: DraftBlock, request: StepRequest, num_draft_tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, None, float]:
        """Score [Y, X_1..X_g] per row, verify (gather or vocab_parallel), crop the cache.

        Returns:
            accepted_counts [B], next_tokens [B] (long, every rank), None (no path index), and the
            clock when scoring ended.
        """
        draft_ids = block.draft_ids.to(self.device)  # [B, g]
        decoding = request.decoding.to(self.device)  # [B]
        # [B, g+1, V], or [B, g+1, V/tp] with the vocabulary-slice head.
        target_logits = self.side.score(draft_ids, decoding, request.prefill_chunk_tokens)
        self._synchronize()
        scored = time.perf_counter()
        verify = self._verify_vocab_parallel if self.vocab_parallel else self._verify_on_rank0
        accepted_counts, next_tokens = verify(block, request, draft_ids, target_logits, num_draft_tokens)
        self.side.commit(accepted_counts, next_tokens, decoding, draft_ids.shape[1])
        return accepted_counts, next_tokens, None, scored

    def _step_paths(
        self, block: DraftBlock, request: StepRequest, num_draft_tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
        """engine/multipath_step.py's target half: fork K ways, score [B*K, g+1] in one forward, rank 0
        verifies the full logits (parallel.verify=gather only: ParallelConfig.require_paths_supported)
        and broadcasts tau, Y and the kept path; every rank keeps that path's row.

        Returns:
            accepted_counts, next_tokens, path_indices [B] (long, every rank), and the clock when
            scoring ended.
        """
        draft_ids = block.draft_ids.to(self.device)  # [B, K, g]
        _, num_paths, g = draft_ids.shape
        decoding = request.decoding.to(self.device)  # [B]
        # [B, K, g+1, V]
        target_logits = score_paths(self.side, draft_ids, decoding, request.prefill_chunk_tokens)
        self._synchronize()
        scored = time.perf_counter()
        accepted_counts, next_tokens, path_indices = self._verdict_from_rank0(
            lambda: verify_paths_from_logits(
                self.method,
                request.sampling,
                draft_ids,
                unpack_probs(block, self.device),
                target_logits,
                num_draft_tokens,
                request.eta,
                request.u,
            ),
            draft_ids.shape[0],
            3,
        )
        commit_target_paths(self.side, accepted_counts, next_tokens, path_indices, decoding, num_paths, g)
        return accepted_counts, next_tokens, path_indices, scored

    def _verdict_from_rank0(
        self, verify: Callable[[], tuple[torch.Tensor, ...]], batch_size: int, num_fields: int
    ) -> torch.Tensor:
        """Rank 0 runs verify() (num_fields [B] long tensors); every rank gets them, so each crops its
        KV cache identically even if a backend's all-reduce ever differed in the last bit.

        Returns:
            [num_fields, B] long on this rank's device.
        """
        verdict = torch.empty(num_fields, batch_size, dtype=torch.long, device=self.device)
        if self.rank == 0:
            verdict[:] = torch.stack(verify())
        if self.world_size > 1:
            dist.broadcast(verdict, src=0)
        return verdict

    def _verify_on_rank0(
        self,
        block: DraftBlock,
        request: StepRequest,
        draft_ids: torch.Tensor,
        target_logits: torch.Tensor,
        num_draft_tokens: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """parallel.verify=gather: rank 0 verifies the full logits [B, g+1, V] and broadcasts the verdict."""
        accepted_counts, next_tokens = self._verdict_from_rank0(
            lambda: verify_step(
                self.method,
                request.sampling,
                draft_ids,
                unpack_probs(block, self.device) if draft_ids.shape[1] > 0 else None,
                target_logits,
                num_draft_tokens,
                request.eta,
                request.u,
            ),
            draft_ids.shape[0],
            2,
        )
        return accepted_counts, next_tokens

    def _verify_vocab_parallel(
        self,
        block: DraftBlock,
        request: StepRequest,
        draft_ids: torch.Tensor,
        target_logits: torch.Tensor,
        num_draft_tokens: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """parallel.verify=vocab_parallel: every rank verifies its slice [B, g+1, V/tp]; the verdict
        comes out of the group's collectives identical on every rank, so nothing is broadcast."""
        shard = self.shard
        draft_probs = None
        if draft_ids.shape[1] > 0:
            draft_probs = unpack_probs_slice(block, shard.vocab_start, shard.vocab_end, self.device)
        return verify_step_vocab_parallel(
            self.method,
            request.sampling,
            draft_ids,
            draft_probs,
            target_logits,
            num_draft_tokens,
            request.eta,
            request.u,
            shard,
        )

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            # Host sync: step timings must measure kernels, not their launches.
            torch.cuda.synchronize()

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Full-sequence target logits without a cache (tests only; never on the hot path).

        Args:
            input_ids: [B, T] long.
        Returns:
            logits: [B, T, V] float32 on the CPU.
        """
        head = self.model.get_output_embeddings()
        use_head(self.model, self.full_head)  # whole logits, whatever the batch's mode
        try:
            output = self.model(input_ids=input_ids.to(self.device), use_cache=False)
        finally:
            use_head(self.model, head)
        return output.logits.float().cpu()

    def output_width(self) -> int:
        """Logits per position the current output head computes: V, or V/tp with vocab_parallel (tests)."""
        return int(self.model.get_output_embeddings().weight.shape[0])

    def shutdown(self) -> None:
        """Leave the group cleanly (a killed shard skips this; the coordinator kills the rest)."""
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        self.model = None
        self.runner = None
