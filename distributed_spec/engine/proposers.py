"""What proposes each row's block (`verifier.proposer`), and how two proposers' blocks become one.

    from distributed_spec.engine.proposers import combine_blocks, ngram_block

- "model": the draft model drafts every block (sides.py `DraftSide.propose`); q = its warped
  probabilities.
- "ngram": prompt lookup (ngram.py) copies what followed the row's last n tokens earlier in its own
  prompt and output; q is a point mass at each proposed token. A row with no match verifies no draft
  (g = 0 for that row). No draft model is loaded.
- "model+ngram": the n-gram block where the row has a match, the draft model's elsewhere.

Where each one runs: the n-gram proposer needs only token ids, so the scheduler runs it (in the Ray
runtime: on the driver) and puts its blocks in the StepPlan (`ngram_ids`, `from_ngram`); the draft
model runs in the executor (in the Ray runtime: the draft actor) for the longest block among its own
rows (`StepPlan.model_g`; 0: it does not run). `combine_blocks` lays the model's rows over the
n-gram block, so the target verifies one [B, g] block with one q, as with the model alone. The draft
keeps its cache in step for rows whose block came from n-grams: `DraftSide.commit` drops what it
drafted for them and queues their kept tokens as pending input (fed by its next forward).

Exact: a row's block is a function of its tokens so far (n-gram) or drawn from the q that is
verified (model), and point-mass q is an ordinary q to every verifier (tests/verify/test_oracle.py).
"""

from __future__ import annotations

import torch


def ngram_block(proposals: list[list[int]]) -> torch.Tensor:
    """The n-gram proposals as one block.

    Args:
        proposals: B token lists (ragged, possibly empty).
    Returns:
        [B, w] long, w = the longest proposal; each row's proposal first, zeros after it.
    """
    width = max((len(tokens) for tokens in proposals), default=0)
    block = torch.zeros(len(proposals), width, dtype=torch.long)
    for row, tokens in enumerate(proposals):
        block[row, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
    return block


def point_mass_probs(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """q of a proposer that names its tokens outright.

    Args:
        token_ids: [B, g] long.
    Returns:
        [B, g, V] float32, one-hot at each token.
    """
    probs = torch.zeros(*token_ids.shape, vocab_size, dtype=torch.float32, device=token_ids.device)
    return probs.scatter_(-1, token_ids[..., None], 1.0)


def pad_columns(block: torch.Tensor, width: int) -> torch.Tensor:
    """[B, w, ...] -> [B, width, ...] (width >= w), zeros appended."""
    missing = width - block.shape[1]
    if missing <= 0:
        return block
    return torch.cat([block, block.new_zeros(block.shape[0], missing, *block.shape[2:])], dim=1)


def overlay_rows(base: torch.Tensor, rows_block: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """base with its rows `rows` replaced by rows_block in the first columns.

    Args:
        base: [B, W, ...]; rows_block: [B, w, ...] with w <= W, same trailing shape; rows: [B] bool.
    Returns:
        [B, W, ...]
    """
    width = rows_block.shape[1]
    chosen = rows.to(base.device).view(-1, *[1] * (base.dim() - 1))
    merged = base.clone()
    merged[:, :width] = torch.where(chosen, rows_block.to(base.device), base[:, :width])
    return merged


def combine_blocks(
    ngram_ids: torch.Tensor,
    from_ngram: torch.Tensor,
    model_ids: torch.Tensor | None,
    model_probs: torch.Tensor | None,
    vocab_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One block from the n-gram rows and the model's rows (dense q; the Ray draft actor does the same
    on q's wire form).

    Args:
        ngram_ids: [B, w] long; from_ngram: [B] bool, rows taken from ngram_ids;
        model_ids: [B, g'] long and model_probs: [B, g', V] of the draft model, or None when it did
            not run (then every proposing row is an n-gram row).
    Returns:
        draft_ids [B, max(w, g')], draft_probs [B, max(w, g'), V]: the model's rows where not
        from_ngram; columns past a row's own block hold point masses at token 0 (never verified).
    """
    width = max(ngram_ids.shape[1], 0 if model_ids is None else model_ids.shape[1])
    device = ngram_ids.device if model_ids is None else model_ids.device
    draft_ids = pad_columns(ngram_ids.to(device), width)
    draft_probs = point_mass_probs(draft_ids, vocab_size)
    if model_ids is not None:
        model_rows = ~from_ngram.to(device)
        draft_ids = overlay_rows(draft_ids, model_ids, model_rows)
        draft_probs = overlay_rows(draft_probs, model_probs, model_rows)
    return draft_ids, draft_probs
