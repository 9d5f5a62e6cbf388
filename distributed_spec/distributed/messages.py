"""Small messages between the coordinator and the actors (the big one, DraftBlock, is in wire.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from distributed_spec.distributed.wire import PickledAsNumpy, WireFormat
from distributed_spec.verify import RowSampling


@dataclass(frozen=True)
class DecodeSettings:
    """How a batch is decoded; sent when every batch starts, so one launched runtime serves any config."""

    # Verifier: "block", "token", "greedy", or "autoregressive" (no draft). Sampling settings are per
    # row and travel with every step (StepRequest.sampling, DraftRequest.sampling).
    method: str
    wire: WireFormat
    # The draft's confidence stop (EngineConfig.draft_confidence_threshold; 0: off).
    draft_confidence_threshold: float = 0.0
    # parallel.verify: "gather" (rank 0 verifies the full logits) or "vocab_parallel" (every rank
    # scores and verifies its vocabulary slice; wire.vocab_shards then cuts q alike).
    verify: str = "gather"


@dataclass
class StepRequest(PickledAsNumpy):
    """What every shard receives besides the draft block, identical on every rank (the scheduler's
    StepPlan without the draft's part)."""

    # [B_prev'] long indices of the previous step's rows that stay, or None when all stay.
    keep_rows: torch.Tensor | None
    # Prompts of the rows that join after the kept ones (prompt[:-1] staged, prompt[-1] their Y).
    new_prompts: list[list[int]]
    # [B] bool: rows whose prompt is (or goes now) wholly through the target; only these verify.
    decoding: torch.Tensor
    # [B] long: n per row, draft tokens that row may verify (<= g; 0 when not decoding); a row whose
    # block the draft ended earlier (confidence stop) verifies only its own drafts.
    num_draft_tokens: torch.Tensor
    # [B, g] float64 in [0, 1): the verifier's eta (block/token verification), rank 0 reads them;
    # [B, K, g] with K > 1 draft paths (the block's draft_ids are then [B, K, g]).
    eta: torch.Tensor
    # [B] float64 in [0, 1): drives sampling of the correction/bonus token.
    u: torch.Tensor
    # Each row's sampling settings: rank 0 warps row b's target logits with rows[b].
    sampling: RowSampling
    # Prompt tokens fed per row at most in this step (engine.prefill_chunk_tokens; None: all).
    prefill_chunk_tokens: int | None = None


@dataclass
class DraftRequest(PickledAsNumpy):
    """What the draft actor receives each step (also in steps without a draft: rows change)."""

    keep_rows: torch.Tensor | None
    new_prompts: list[list[int]]
    # [B] bool, as in StepRequest.
    decoding: torch.Tensor
    # Draft tokens to propose per row; 0: the draft model does not run in this step (an autoregressive
    # step, or every proposing row's block comes from n-grams).
    g: int
    # [B, g] float64: the draft's sampling uniforms ([B, K, g] with num_paths = K > 1).
    draft_uniforms: torch.Tensor
    # Each row's sampling settings, as in StepRequest (the draft warps q with them).
    sampling: RowSampling
    # With verifier.proposer=model+ngram: the n-gram blocks [B, w] long and [B] bool, the rows they
    # serve (engine/proposers.py); the draft lays its own rows over them. None: no n-gram rows.
    ngram_ids: torch.Tensor | None = None
    from_ngram: torch.Tensor | None = None
    # In a step without the draft (g = 0): whether the draft catches up now (the next step is
    # expected to draft, StepPlan.next_g_guess) or stays idle until it drafts again.
    catch_up: bool = True
    # K draft paths per row (engine/multipath_step.py); 1: one path.
    num_paths: int = 1
    # [B] bool: the only rows the draft feeds and drafts for (engine StepPlan.draft_rows); None: all.
    draft_rows: torch.Tensor | None = None


@dataclass
class StepResult(PickledAsNumpy):
    """What shard rank 0 answers: the verified prefix of every row and the timing of the step."""

    # [B] long: tau, accepted draft tokens per row.
    accepted_counts: torch.Tensor
    # [B] long: Y, the correction or bonus token of each row.
    next_tokens: torch.Tensor
    # [B, g] long: the block that was verified, the kept path's with K > 1 paths (so the coordinator
    # never fetches the block itself).
    draft_ids: torch.Tensor
    # [B] long: draft tokens each row verified (the request's n, or fewer after a confidence stop).
    num_draft_tokens: torch.Tensor
    # Seconds on rank 0: target forward (scoring g+1 positions), verification (decode q, verify,
    # broadcast the result, crop the KV cache).
    target_s: float = 0.0
    verify_s: float = 0.0
    # Copied from the draft block: seconds the draft spent on it, and whether it was drafted ahead.
    draft_s: float = 0.0
    from_overlap: bool = False
    # Of draft_s, the forwards for this block (not the work owed by earlier steps; 0 when drafted
    # ahead, hidden behind the last step): StepOutcome.draft_own_s.
    draft_own_s: float = 0.0
    # Bytes of the draft block as it reached rank 0 (the other ranks get the ids only); with
    # parallel.verify=vocab_parallel, of every shard's block together (each holds its slice of q).
    num_wire_bytes: int = 0
    # The draft's forward calls so far (cumulative, from the block) and the target's (rank 0).
    num_draft_calls: int = 0
    num_target_calls: int = 0
    # Seconds of a discarded block drafted ahead (from the block).
    discarded_ahead_s: float = 0.0
    # Rank 0's prompt forwards for joining rows run apart in this step, seconds and prompt tokens; the
    # seconds include the draft's work owed by earlier steps (DraftBlock.owed_s).
    prefill_s: float = 0.0
    num_prefill_apart_tokens: int = 0
    # The draft's catch-up in this step (from the block): seconds and tokens fed.
    catch_up_s: float = 0.0
    num_catch_up_tokens: int = 0
    # [B] long: the kept path of each row in a K-path step (the draft keeps that path's row); None:
    # a one-path step.
    path_indices: torch.Tensor | None = None
