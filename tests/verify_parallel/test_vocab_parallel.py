"""Vocabulary-parallel verification on gloo groups of 2 and 3 CPU processes against the reference.

Every rank builds the same full inputs from one seed, keeps its vocabulary slice, verifies, and
compares with the unsharded reference for the same uniforms (tau identical on every row; Y identical
away from a CDF boundary): identical decisions for every uniform means the same output distribution,
which the reference's own oracle tests pin down. A worker's assertion fails the spawn, so the test.
"""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from distributed_spec.verify import SamplingParams, draw_uniforms, logits_to_probs, verify
from distributed_spec.verify_parallel import (
    VocabShard,
    verify_gathered,
    verify_vocab_parallel,
    vocab_shard_range,
)
from tests.verify import oracle
from tests.verify.batched import dense_table, sample_block_inputs
from tests.verify_parallel.outcomes import assert_same_outcomes

PARAMS = [
    SamplingParams(),
    SamplingParams(temperature=0.7, top_k=8),
    SamplingParams(temperature=1.3, top_p=0.8),
]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, checks) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        for check, *args in checks:
            check(*args)
    finally:
        dist.destroy_process_group()


def _run_group(world_size: int, *checks) -> None:
    """Each check is (function, *args); one group runs them all (a spawn costs seconds)."""
    mp.spawn(_worker, args=(world_size, _free_port(), checks), nprocs=world_size, join=True)


def _random_case(generator, batch_size, g, vocab_size, params):
    """Target logits, draft ids sampled from a perturbed warp q, ragged n (0 included)."""
    target_logits = torch.randn(batch_size, g + 1, vocab_size, generator=generator) * 2
    draft_probs = logits_to_probs(
        target_logits[:, :g] + torch.randn(batch_size, g, vocab_size, generator=generator), params
    )
    draft_ids = torch.multinomial(draft_probs.reshape(-1, vocab_size), 1, generator=generator).view(
        batch_size, g
    )
    draft_ids[0, 0] = int(draft_probs[0, 0].argmin())  # q = 0 (r becomes 1), or p = 0 under top-k
    num_draft_tokens = torch.randint(0, g + 1, (batch_size,), generator=generator)
    return (
        target_logits,
        draft_ids,
        draft_probs,
        num_draft_tokens,
        draw_uniforms(batch_size, g, generator),
    )


def _check_matches_reference(vocab_size: int, batch_size: int) -> None:
    shard = VocabShard(vocab_size)
    start, end = shard.vocab_start, shard.vocab_end
    for case, (method, params) in enumerate((m, p) for m in ("block", "token") for p in PARAMS):
        generator = torch.Generator().manual_seed(100 + case)
        target_logits, draft_ids, draft_probs, n, uniforms = _random_case(
            generator, batch_size, 4, vocab_size, params
        )
        target_probs = logits_to_probs(target_logits, params)
        reference = verify(method, draft_ids, draft_probs, target_probs, n, uniforms)
        output = verify_vocab_parallel(
            method,
            target_logits[..., start:end],
            draft_ids,
            draft_probs[..., start:end],
            n,
            uniforms,
            params,
            shard,
        )
        compared = assert_same_outcomes(
            method, output, reference, target_probs, draft_ids, draft_probs, n, uniforms.u
        )
        assert compared >= 0.99 * batch_size, (method, params, compared)


def _check_oracle_decisions() -> None:
    """tau and Y of the sharded path equal what the exact oracle dictates (V = 5 split 3 + 2)."""
    vocab_size, g = 5, 3
    shard = VocabShard(vocab_size)
    start, end = shard.vocab_start, shard.vocab_end
    generator = torch.Generator().manual_seed(3)
    for seed in range(6):
        p = oracle.RandomTable(vocab_size, seed=300 + seed, concentration=0.6)
        q = oracle.RandomTable(vocab_size, seed=400 + seed, concentration=0.6)
        draft_ids, draft_probs, target_probs = sample_block_inputs(
            dense_table(p, (), vocab_size, g), dense_table(q, (), vocab_size, g), 64, g, generator
        )
        uniforms = draw_uniforms(64, g, generator)
        for method in ("block", "token"):
            output = verify_vocab_parallel(
                method,
                target_probs.log()[..., start:end],
                draft_ids,
                draft_probs[..., start:end],
                None,
                uniforms,
                SamplingParams(),
                shard,
            )
            for row in range(64):
                tau, _, _ = oracle.decide(
                    method, p, q, tuple(draft_ids[row].tolist()), uniforms.eta[row].tolist(), uniforms.u[row].item()
                )
                assert output.accepted_counts[row].item() == tau, (seed, method, row)


def _check_greedy_bytes_and_errors(vocab_size: int) -> None:
    shard = VocabShard(vocab_size)
    start, end = shard.vocab_start, shard.vocab_end
    generator = torch.Generator().manual_seed(7)
    target_logits, draft_ids, draft_probs, n, uniforms = _random_case(
        generator, 64, 4, vocab_size, SamplingParams()
    )
    # Ties across shards: the lowest id wins, as torch.argmax.
    target_logits[:8, :, -1] = target_logits[:8, :, 0] = 50.0
    draft_ids[:, :2] = target_logits[:, :2].argmax(-1)
    expected = verify("greedy", draft_ids, None, target_logits, n, None)
    for method, params in (("greedy", SamplingParams()), ("block", SamplingParams(temperature=0.0))):
        output = verify_vocab_parallel(
            method,
            target_logits[..., start:end],
            draft_ids,
            draft_probs[..., start:end],
            n,
            uniforms,
            params,
            shard,
        )
        assert torch.equal(output.accepted_counts, expected.accepted_counts)
        assert torch.equal(output.next_tokens, expected.next_tokens)

    # Bytes: O(B g) numbers for the sharded path, the whole logits for gather-then-verify.
    shard.bytes_received = 0
    verify_vocab_parallel(
        "block",
        target_logits[..., start:end],
        draft_ids,
        draft_probs[..., start:end],
        n,
        uniforms,
        SamplingParams(),
        shard,
    )
    sharded_bytes = shard.bytes_received
    shard.bytes_received = 0
    verify_gathered(
        "block",
        target_logits[..., start:end],
        draft_ids,
        draft_probs,
        n,
        uniforms,
        SamplingParams(),
        shard,
        draft_probs_sharded=False,
    )
    # Per rank: (tp - 1) shards' statistics, O(B g) numbers (here under 8 (g + 1) float64 per row);
    # gather-then-verify receives (tp - 1) shards of the logits.
    assert sharded_bytes < (shard.world_size - 1) * 64 * 8 * (4 + 1) * 8
    assert shard.bytes_received >= (shard.world_size - 1) * target_logits[..., start:end].numel() * 4

    bad = target_logits.clone()
    bad[3, 2, vocab_size - 1] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf"):  # raised on every rank: the sums are reduced
        verify_vocab_parallel(
            "block",
            bad[..., start:end],
            draft_ids,
            draft_probs[..., start:end],
            n,
            uniforms,
            SamplingParams(),
            shard,
        )
    with pytest.raises(ValueError, match="draft_probs must be"):
        verify_vocab_parallel(
            "token",
            target_logits[..., start:end],
            draft_ids,
            draft_probs,
            n,
            uniforms,
            SamplingParams(),
            shard,
        )


def test_two_shards_match_reference_and_oracle():
    """block and token, plain / temperature + top-k / top-p fallback, 512 rows each (V = 64); then the
    oracle's decisions with V = 5 split 3 + 2."""
    _run_group(2, (_check_matches_reference, 64, 512), (_check_oracle_decisions,))


def test_three_uneven_shards_greedy_bytes_errors_and_reference():
    """V = 67 over 3 ranks (23 + 23 + 21)."""
    _run_group(3, (_check_greedy_bytes_and_errors, 67), (_check_matches_reference, 67, 256))


def test_vocab_shard_range_covers_the_vocabulary():
    for vocab_size, tp_size in ((128256, 4), (67, 3), (5, 2), (9, 4)):
        ranges = [vocab_shard_range(vocab_size, tp_size, rank) for rank in range(tp_size)]
        assert ranges[0][0] == 0 and ranges[-1][1] == vocab_size
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert vocab_shard_range(128256, 4, 1) == (32064, 64128)
    with pytest.raises(ValueError, match="rank"):
        vocab_shard_range(10, 2, 2)
