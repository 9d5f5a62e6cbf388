"""The two sides of one speculative step over a running batch: `DraftSide` and `TargetSide`.

    from distributed_spec.engine.sides import DraftSide, TargetSide

Each wraps a ModelRunner and the per-row tokens it has been given but not yet fed. The single-process
executor (executor.py) holds one of each; in the Ray runtime the draft actor holds the DraftSide and
every target shard a TargetSide, so both runtimes run exactly the same model work.

Rows join with `update_rows(keep_rows, new_prompts)`: finished rows leave, new rows are appended with
their prompt[:-1] staged in the runner (it goes in with the next forwards, by chunks on the target)
and prompt[-1] as their first Y. A row is *decoding* in a step once the target has been fed (or is
fed in this step) its whole staged prompt; a row still prefilling takes part in the forward with its
prompt chunk only: its block is masked, nothing of it is kept, its Y stays pending.

Invariant between steps, per decoding row: the target holds every kept token except the last, Y
(`TargetSide.last_ids`); the draft holds every kept token except its pending input
(`DraftSide.pending_ids`: [X_g or padding, Y] after a speculative step, one more Y per
autoregressive step, in which the draft does not run at all; X_1..X_tau, Y for a row whose block came
from n-grams, proposers.py). Pending tokens are right-aligned: the last column is each row's Y.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import torch

from distributed_spec.engine.runner import ModelRunner
from distributed_spec.engine.steps import commit_draft, commit_target, draft_from_logits, score
from distributed_spec.verify import RowSampling


class TargetSide:
    """The target runner and each row's Y (last kept token, not in the cache yet)."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.device = runner.device
        self.reset()

    def reset(self) -> None:
        self.runner.reset(0)
        self.last_ids = torch.zeros(0, dtype=torch.long, device=self.device)  # [B]

    def update_rows(self, keep_rows: torch.Tensor | None, new_prompts: list[list[int]]) -> None:
        """Drop the rows not in keep_rows ([B'] long, None keeps all), then append new_prompts' rows."""
        self.last_ids = _update_rows(self.runner, self.last_ids, keep_rows, new_prompts)

    def score(self, draft_ids: torch.Tensor, decoding: torch.Tensor, max_staged: int | None) -> torch.Tensor:
        """One target forward over [Y, X_1..X_g] per decoding row, after each row's next prompt chunk.

        Args:
            draft_ids: [B, g] long (g may be 0: an autoregressive step).
            decoding: [B] bool; rows still prefilling feed their prompt chunk only.
            max_staged: prompt tokens fed per row at most (engine.prefill_chunk_tokens).
        Returns:
            target_logits: [B, g+1, V] (meaningless for rows not decoding).
        """
        return score(self.runner, self.last_ids, draft_ids.to(self.device), decoding.to(self.device), max_staged)

    def commit(
        self, accepted_counts: torch.Tensor, next_tokens: torch.Tensor, decoding: torch.Tensor, g: int
    ) -> None:
        """Keep Y and the tau accepted drafts of each decoding row; Y' becomes its pending token.

        Args:
            accepted_counts: [B] tau; next_tokens: [B] Y'; decoding: [B] bool.
        """
        decoding = decoding.to(self.device)
        commit_target(self.runner, accepted_counts.to(self.device), g, decoding)
        self.last_ids = torch.where(decoding, next_tokens.to(self.device), self.last_ids)


class DraftSide:
    """The draft runner and each row's pending input (kept tokens the draft has not fed yet)."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.device = runner.device
        self.reset()

    def reset(self) -> None:
        self.runner.reset(0)
        # [B, k] / [B, k] long: pending tokens, left-padded; the last real one is Y (`last_ids`).
        self.pending_ids = torch.zeros(0, 1, dtype=torch.long, device=self.device)
        self.pending_mask = torch.zeros(0, 1, dtype=torch.long, device=self.device)
        self.last_ids = torch.zeros(0, dtype=torch.long, device=self.device)  # [B]
        # Seconds and tokens of catch-up forwards so far (cumulative, net of prompt forwards apart).
        self.catch_up_s = 0.0
        self.num_catch_up_tokens = 0

    def update_rows(self, keep_rows: torch.Tensor | None, new_prompts: list[list[int]]) -> None:
        """Drop the rows not in keep_rows ([B'] long, None keeps all), then append new_prompts' rows."""
        if keep_rows is not None:
            keep_rows = keep_rows.to(self.device)
            self.pending_ids, self.pending_mask = self.pending_ids[keep_rows], self.pending_mask[keep_rows]
        self.last_ids = _update_rows(self.runner, self.last_ids, keep_rows, new_prompts)
        if new_prompts:
            # A new row's pending input is its Y alone (the last prompt token).
            new_ids = torch.zeros(len(new_prompts), self.pending_ids.shape[1], dtype=torch.long, device=self.device)
            new_mask = torch.zeros_like(new_ids)
            new_ids[:, -1], new_mask[:, -1] = self.last_ids[-len(new_prompts) :], 1
            self.pending_ids = torch.cat([self.pending_ids, new_ids])
            self.pending_mask = torch.cat([self.pending_mask, new_mask])

    def propose(
        self,
        g: int,
        sampling: RowSampling,
        draft_uniforms: torch.Tensor,
        decoding: torch.Tensor,
        to_sampled: Callable[[torch.Tensor], torch.Tensor] | None = None,
        confidence_threshold: float = 0.0,
        draft_rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """engine.steps.propose from each row's pending input (rows still prefilling feed only their
        staged prompt). Same arguments and returns as `propose`; sampling: each row's settings;
        decoding: [B] bool; draft_rows: `feed_pending`'s."""
        with self._only(draft_rows):
            return draft_from_logits(
                self.runner,
                self.feed_pending(decoding, draft_rows),
                g,
                sampling,
                draft_uniforms,
                to_sampled,
                confidence_threshold,
            )

    def _only(self, rows: torch.Tensor | None):
        """A block in which forwards feed the staged prompts of `rows` alone ([B] bool; None: all)."""
        if rows is None:
            return contextlib.nullcontext()
        return self.runner.staged_held((~rows.bool()).tolist())

    def feed_pending(self, decoding: torch.Tensor, draft_rows: torch.Tensor | None = None) -> torch.Tensor:
        """Feed each row's pending input (rows still prefilling, decoding[b] False: their staged
        prompt only); the first forward of a proposal, which the multi-path step forks after.

        draft_rows: [B] bool, the only rows fed (the others, staged prompt and pending input alike, wait
        for a later step: a goodput probe drafts for a few rows, the others verify no draft); None: all.

        Returns:
            logits [B, V] after each row's last fed token (the draft's X_1 distribution).
        """
        fed = decoding.to(self.device)
        if draft_rows is not None:
            fed = fed & draft_rows.to(self.device)
        input_mask = self.pending_mask * fed[:, None].long()
        with self._only(draft_rows):
            return self.runner.forward_tokens(self.pending_ids, input_mask, num_logits=1)[:, -1]

    def commit(
        self,
        draft_ids: torch.Tensor,
        accepted_counts: torch.Tensor,
        next_tokens: torch.Tensor,
        decoding: torch.Tensor,
        from_ngram: torch.Tensor | None = None,
        num_model_drafts: int | None = None,
        draft_rows: torch.Tensor | None = None,
    ) -> None:
        """Roll the cache back to the kept prefix and set each row's next pending input.

        Args:
            draft_ids: [B, g] the verified block (g = 0 after an autoregressive step: the draft did not
                run, Y' is appended to the pending input); accepted_counts: [B] tau; next_tokens: [B] Y';
            decoding: [B] bool (rows still prefilling keep their pending Y).
            from_ngram: [B] bool, rows whose block the n-gram proposer made (proposers.py); None: none.
                The draft's own drafts for them are dropped and X_1..X_tau, Y' become pending input.
            num_model_drafts: tokens the draft drafted in this step (its block's width; 0: it did not
                run, so every decoding row's X_1..X_tau, Y' join its pending input); None: g.
            draft_rows: [B] bool, the rows `propose` fed (its draft_rows); the others keep their
                pending input and queue X_1..X_tau, Y' after it. None: every row.
        """
        decoding = decoding.to(self.device)
        next_tokens = next_tokens.to(self.device)
        g = draft_ids.shape[1] if num_model_drafts is None else num_model_drafts
        # Host sync: whether any row's block came from n-grams picks the bookkeeping below.
        if draft_rows is not None or (from_ngram is not None and bool(from_ngram.any())):
            self._commit_mixed(
                draft_ids.to(self.device),
                accepted_counts.to(self.device),
                next_tokens,
                decoding,
                torch.zeros_like(decoding) if from_ngram is None else from_ngram.to(self.device),
                decoding if draft_rows is None else decoding & draft_rows.to(self.device),
                g,
            )
        elif g == 0:
            self.pending_ids = torch.cat([self.pending_ids, torch.where(decoding, next_tokens, 0)[:, None]], dim=1)
            self.pending_mask = torch.cat([self.pending_mask, decoding.long()[:, None]], dim=1)
            self._trim_pending()
        else:
            # Rows not decoding keep their Y pending.
            pending_next = torch.where(decoding, next_tokens, self.last_ids)
            self.pending_ids, self.pending_mask = commit_draft(
                self.runner, draft_ids[:, :g].to(self.device), accepted_counts.to(self.device), pending_next,
                decoding,
            )
        self.last_ids = torch.where(decoding, next_tokens, self.last_ids)

    def _commit_mixed(
        self,
        draft_ids: torch.Tensor,
        accepted_counts: torch.Tensor,
        next_tokens: torch.Tensor,
        decoding: torch.Tensor,
        from_ngram: torch.Tensor,
        fed: torch.Tensor,
        g: int,
    ) -> None:
        """`commit` for a block not all of whose rows are the model's: the model's rows as
        `commit_draft` keeps them; the others (n-gram rows, decoding rows the draft did not feed, every
        decoding row when the draft did not run) queue X_1..X_tau, Y'.

        Args:
            draft_ids: [B, W] (W >= g, the model's drafts in the first g columns of its rows);
            accepted_counts: [B]; next_tokens: [B]; decoding, from_ngram: [B] bool; fed: [B] bool, the
            decoding rows whose pending input `propose` fed; g: the model's g.
        """
        columns = torch.arange(draft_ids.shape[1], device=self.device)[None, :]  # [1, W]
        kept = columns < accepted_counts[:, None]  # [B, W]: X_1..X_tau
        if g > 0:
            model_rows = fed & ~from_ngram
            # The model's speculative slots: its rows keep their accepted ones, the others none (those
            # slots hold the model's drafts, not the tokens that were verified).
            self.runner.rollback(torch.where(model_rows, accepted_counts.clamp(max=g - 1), 0), g - 1)
            # A model row's pending input is [X_g if all g were kept] (never fed), then Y'.
            model_pending = (columns == g - 1) & (accepted_counts == g)[:, None]
            block_mask = torch.where(model_rows[:, None], model_pending, kept & decoding[:, None])
            # propose fed these rows' pending input: only the others keep theirs.
            old_mask = self.pending_mask * (~fed).long()[:, None]
        else:
            block_mask = kept & decoding[:, None]
            old_mask = self.pending_mask
        ids = torch.cat([self.pending_ids, draft_ids, next_tokens[:, None]], dim=1)
        mask = torch.cat([old_mask, block_mask.long(), decoding.long()[:, None]], dim=1)
        self.pending_ids, self.pending_mask = ids, mask
        self._trim_pending()

    def lags(self, max_pending: int = 8, rows: torch.Tensor | None = None) -> bool:
        """Whether the draft is behind by more than a step's pending input: a row has staged prompt
        tokens, or the pending input is longer than max_pending (autoregressive steps since it ran).
        rows: [B] bool, only these rows count; None: all."""
        if self.runner.batch_size == 0:
            return False
        if rows is None:
            return any(self.runner.num_staged_tokens()) or self.pending_ids.shape[1] > max_pending
        rows = rows.to(self.device)
        staged = torch.tensor(self.runner.num_staged_tokens(), device=self.device) > 0
        # Host sync: the answer is a Python bool.
        return bool((staged & rows).any()) or int((self.pending_mask.sum(dim=1) * rows).max()) > max_pending

    def catch_up(self, max_pending: int = 8, rows: torch.Tensor | None = None) -> bool:
        """Feed the draft what it lags behind (staged prompts, pending tokens but each row's Y) in one
        forward, when it `lags`. Called before a drafting step that would otherwise feed it all in its
        first forward, or in a step without a draft when the next one is expected to draft. Its seconds
        (net of the runner's own prompt forwards apart, already counted there) add to `catch_up_s`:
        the goodput schedule takes them off the step, as it does prompt forwards. rows: [B] bool, the
        only rows caught up (the rows a goodput probe drafts for); None: all. Returns whether it ran."""
        if not self.lags(max_pending, rows):
            return False
        runner = self.runner
        start, apart_before = time.perf_counter(), (runner.prefill_apart_s, runner.num_prefill_apart_tokens)
        columns = torch.arange(self.pending_mask.shape[1], device=self.device)
        # Each row's last real pending token is its Y: it stays pending (the next proposal feeds it).
        last = (self.pending_mask * (columns + 1)).argmax(dim=1)  # [B]
        input_mask = self.pending_mask.clone()
        input_mask.scatter_(1, last[:, None], 0)
        if rows is not None:
            input_mask *= rows.to(self.device).long()[:, None]
        with self._only(rows):
            # Inside the block the runner shows the staged prompts of `rows` alone.
            num_staged = sum(runner.num_staged_tokens())
            runner.forward_tokens(self.pending_ids, input_mask, num_logits=1)
        # Roll back nothing: every fed token is kept; only Y is pending now (in the rows caught up).
        self.pending_mask = self.pending_mask - input_mask
        self._trim_pending()
        if self.device.type == "cuda":
            # Host sync: the clock must see the forward run, not its launch.
            torch.cuda.synchronize(self.device)
        self.catch_up_s += time.perf_counter() - start - (runner.prefill_apart_s - apart_before[0])
        num_fed = num_staged + int(input_mask.sum())
        self.num_catch_up_tokens += num_fed - (runner.num_prefill_apart_tokens - apart_before[1])
        return True

    def _trim_pending(self) -> None:
        """Right-align each row's pending tokens (the draft reads its next logits at the last column, so
        that column must hold the row's Y), then drop leading columns that no row uses (the pending
        input grows by one per autoregressive step)."""
        # Stable sort: padding (0) first, real tokens (1) last, each in their order.
        order = torch.sort(self.pending_mask, dim=1, stable=True).indices
        self.pending_ids = torch.gather(self.pending_ids, 1, order)
        self.pending_mask = torch.gather(self.pending_mask, 1, order)
        used = self.pending_mask.any(dim=0)
        # Host sync: the new width is a Python int.
        first = int(used.long().argmax()) if bool(used.any()) else self.pending_mask.shape[1] - 1
        self.pending_ids, self.pending_mask = self.pending_ids[:, first:], self.pending_mask[:, first:]


def _update_rows(
    runner: ModelRunner, last_ids: torch.Tensor, keep_rows: torch.Tensor | None, new_prompts: list[list[int]]
) -> torch.Tensor:
    """Drop the rows not in keep_rows from the runner, append new_prompts' rows (prompt[:-1] staged);
    return the new last_ids [B'] (each new row's Y is its last prompt token)."""
    if keep_rows is not None:
        keep_rows = keep_rows.to(runner.device)
        runner.drop_rows(keep_rows)
        last_ids = last_ids[keep_rows]
    if new_prompts:
        runner.add_rows([prompt[:-1] for prompt in new_prompts])
        new_last = torch.tensor([prompt[-1] for prompt in new_prompts], dtype=torch.long, device=runner.device)
        last_ids = torch.cat([last_ids, new_last])
    return last_ids
