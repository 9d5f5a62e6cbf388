"""Multi-path verification (distributed_spec/verify/multipath.py) against block verification and the oracle."""

from collections import Counter

import pytest
import torch

from distributed_spec.verify import SamplingParams, draw_uniforms, logits_to_probs, verify
from distributed_spec.verify.multipath import (
    MultiPathUniforms,
    draw_multipath_uniforms,
    verify_multipath,
    verify_multipath_greedy,
    verify_paths,
)
from tests.verify import oracle
from tests.verify.batched import chi_square_p_value, dense_table, sample_block_inputs

# Each chi-square test fails by chance with probability 1e-4 (fixed seeds make reruns identical).
FALSE_ALARM_RATE = 1e-4


def _sample_paths(p, qs, context, vocab_size, g, num_rows, generator):
    """Path k of every row drawn from qs[k] independently -> ids [N, K, g], q [N, K, g, V], p [N, K, g+1, V]."""
    p_dense = dense_table(p, context, vocab_size, g)
    blocks = [
        sample_block_inputs(p_dense, dense_table(q, context, vocab_size, g), num_rows, g, generator)
        for q in qs
    ]
    return tuple(torch.stack(parts, dim=1) for parts in zip(*blocks))


def _random_block(batch_size, g, vocab_size, generator):
    """Model-like p and q (top-k zeros, a quarter of the rows with q = p) and blocks drawn from q."""
    target_logits = torch.randn(batch_size, g + 1, vocab_size, generator=generator) * 2
    draft_logits = target_logits[:, :g] + torch.randn(batch_size, g, vocab_size, generator=generator)
    draft_logits[: batch_size // 4] = target_logits[: batch_size // 4, :g]
    params = SamplingParams(temperature=1.0, top_k=max(2, vocab_size // 2))
    target_probs, draft_probs = logits_to_probs(target_logits, params), logits_to_probs(draft_logits, params)
    draft_ids = torch.multinomial(draft_probs.reshape(-1, vocab_size), 1, generator=generator)
    return draft_ids.view(batch_size, g), draft_probs, target_probs


@pytest.mark.parametrize(("g", "vocab_size"), [(0, 5), (1, 5), (3, 7), (5, 50), (8, 1000)])
def test_one_path_is_block_verification_bit_for_bit(g, vocab_size):
    generator = torch.Generator().manual_seed(g)
    for _ in range(20):
        batch_size = 48
        draft_ids, draft_probs, target_probs = _random_block(batch_size, g, vocab_size, generator)
        num_draft_tokens = torch.randint(0, g + 1, (batch_size,), generator=generator)
        uniforms = draw_uniforms(batch_size, g, generator)
        block = verify("block", draft_ids, draft_probs, target_probs, num_draft_tokens, uniforms)
        multi = verify_multipath(
            draft_ids[:, None],
            draft_probs[:, None],
            target_probs[:, None],
            num_draft_tokens,
            MultiPathUniforms(eta=uniforms.eta[:, None], u=uniforms.u),
        )
        assert torch.equal(multi.accepted_counts, block.accepted_counts)
        assert torch.equal(multi.next_tokens, block.next_tokens)
        assert torch.equal(multi.accepted_mask, block.accepted_mask)
        assert not multi.path_indices.any()
        greedy = verify("greedy", draft_ids, None, target_probs, num_draft_tokens, None)
        multi_greedy = verify_multipath_greedy(
            draft_ids[:, None], None, target_probs[:, None], num_draft_tokens
        )
        assert torch.equal(multi_greedy.accepted_counts, greedy.accepted_counts)
        assert torch.equal(multi_greedy.next_tokens, greedy.next_tokens)


def test_one_path_uniforms_are_the_single_path_draws():
    one = draw_multipath_uniforms(5, 1, 3, torch.Generator().manual_seed(1))
    single = draw_uniforms(5, 3, torch.Generator().manual_seed(1))
    assert torch.equal(one.eta[:, 0], single.eta) and torch.equal(one.u, single.u)


def test_decisions_match_oracle_for_identical_uniforms():
    """tau, the kept path and Y equal what the oracle's recursion dictates for the same uniforms."""
    generator = torch.Generator().manual_seed(3)
    vocab_size, g, num_paths, num_rows = 4, 3, 3, 64
    for seed in range(15):
        p = oracle.RandomTable(vocab_size, seed=300 + seed, concentration=0.6)
        q = oracle.RandomTable(vocab_size, seed=400 + seed, concentration=0.6)
        draft_ids, draft_probs, target_probs = _sample_paths(
            p, [q] * num_paths, (), vocab_size, g, num_rows, generator
        )
        uniforms = draw_multipath_uniforms(num_rows, num_paths, g, generator)
        output = verify_paths("block", draft_ids, draft_probs, target_probs, None, uniforms)
        for row in range(num_rows):
            tau, kept, y, margin = oracle.decide_multipath(
                p,
                [q] * num_paths,
                [tuple(path) for path in draft_ids[row].tolist()],
                uniforms.eta[row].tolist(),
                uniforms.u[row].item(),
            )
            assert (output.accepted_counts[row].item(), output.path_indices[row].item()) == (tau, kept)
            if margin > 1e-5:  # away from a CDF boundary, where float32 inputs could round either way
                assert output.next_tokens[row].item() == y, (seed, row)


@pytest.mark.parametrize("num_paths", [2, 4])
def test_sampled_outcomes_match_oracle(num_paths):
    """Chi-square of (tau, emitted tokens) against the exact oracle, ragged rows (n = 0..g)."""
    vocab_size, g, num_rows = 3, 2, 120_000
    p = oracle.RandomTable(vocab_size, seed=7, concentration=0.8)
    q = oracle.RandomTable(vocab_size, seed=8, concentration=0.8)
    generator = torch.Generator().manual_seed(num_paths)
    draft_ids, draft_probs, target_probs = _sample_paths(
        p, [q] * num_paths, (1,), vocab_size, g, num_rows, generator
    )
    num_draft_tokens = torch.randint(0, g + 1, (num_rows,), generator=generator)
    uniforms = draw_multipath_uniforms(num_rows, num_paths, g, generator)
    output = verify_multipath(draft_ids, draft_probs, target_probs, num_draft_tokens, uniforms)
    counts = Counter()
    rows = zip(
        num_draft_tokens.tolist(),
        output.accepted_counts.tolist(),
        output.path_indices.tolist(),
        draft_ids.tolist(),
        output.next_tokens.tolist(),
    )
    for n, tau, path, paths, y in rows:
        counts[(n, tau, tuple(paths[path][:tau]) + (y,))] += 1
    for n in range(g + 1):
        expected = oracle.multipath_outcomes(p, [q] * num_paths, (1,), n)
        observed = Counter({(tau, tokens): c for (row_n, tau, tokens), c in counts.items() if row_n == n})
        p_value = chi_square_p_value(observed, expected, sum(observed.values()))
        assert p_value > FALSE_ALARM_RATE, (num_paths, n, p_value)
    # The same statistics reject the single-path law, so the test can fail.
    full = Counter({(tau, tokens): c for (row_n, tau, tokens), c in counts.items() if row_n == g})
    block = oracle.iteration_outcomes("block", p, q, (1,), g)
    assert chi_square_p_value(full, block, sum(full.values())) < 1e-6


def test_more_paths_never_shorten_the_kept_prefix():
    """Path K+1 is used only where K paths would draw Y: with the same uniforms, tau can only grow."""
    generator = torch.Generator().manual_seed(5)
    num_rows, num_paths, g, vocab_size = 2000, 4, 4, 5
    p = oracle.RandomTable(vocab_size, seed=51, concentration=0.5)
    q = oracle.RandomTable(vocab_size, seed=52, concentration=0.5)
    draft_ids, draft_probs, target_probs = _sample_paths(
        p, [q] * num_paths, (), vocab_size, g, num_rows, generator
    )
    uniforms = draw_multipath_uniforms(num_rows, num_paths, g, generator)
    counts = []
    for k in range(1, num_paths + 1):
        output = verify_multipath(
            draft_ids[:, :k],
            draft_probs[:, :k],
            target_probs[:, :k],
            torch.full((num_rows,), g),
            MultiPathUniforms(uniforms.eta[:, :k], uniforms.u),
        )
        assert torch.equal(output.accepted_mask.sum(1), output.accepted_counts)
        # The kept path holds the accepted tokens, and no path before it was the one that kept them.
        assert (output.path_indices < k).all()
        counts.append(output.accepted_counts)
    for fewer, more in zip(counts, counts[1:]):
        assert (more >= fewer).all()
    assert counts[-1].double().mean() > counts[0].double().mean() + 0.1


def test_one_hot_inputs_reduce_to_multipath_greedy():
    """p and q one-hot (temperature 0, or point-mass drafts against a greedy target): the stochastic
    rule keeps the longest greedy match, on the smallest path index that has it."""
    generator = torch.Generator().manual_seed(6)
    batch_size, num_paths, g, vocab_size = 256, 3, 4, 3
    greedy_ids = torch.randint(0, vocab_size, (batch_size, g + 1), generator=generator)
    draft_ids = torch.where(
        torch.rand(batch_size, num_paths, g, generator=generator) < 0.6,
        greedy_ids[:, None, :g],
        torch.randint(0, vocab_size, (batch_size, num_paths, g), generator=generator),
    )
    # The target's argmax follows each path's own prefix: on path k it is the greedy token while
    # the path agrees with the greedy continuation, and an arbitrary (fixed) token after.
    on_greedy = (draft_ids == greedy_ids[:, None, :g]).long().cumprod(dim=2)
    target_ids = greedy_ids[:, None].expand(batch_size, num_paths, g + 1).clone()
    target_ids[:, :, 1:] = torch.where(on_greedy.bool(), target_ids[:, :, 1:], 0)
    target_probs = torch.nn.functional.one_hot(target_ids, vocab_size).float()
    draft_probs = torch.nn.functional.one_hot(draft_ids, vocab_size).float()
    num_draft_tokens = torch.randint(0, g + 1, (batch_size,), generator=generator)
    uniforms = draw_multipath_uniforms(batch_size, num_paths, g, generator)
    stochastic = verify_paths("block", draft_ids, draft_probs, target_probs, num_draft_tokens, uniforms)
    greedy = verify_paths("greedy", draft_ids, None, target_probs, num_draft_tokens, None)
    for field in ("accepted_counts", "next_tokens", "path_indices", "accepted_mask"):
        assert torch.equal(getattr(stochastic, field), getattr(greedy, field)), field
    assert (greedy.path_indices > 0).any() and (greedy.accepted_counts > 0).any()


def test_bad_shapes_and_methods_raise():
    ids, q, p = torch.zeros(1, 2, 3, dtype=torch.long), torch.ones(1, 2, 3, 4) / 4, torch.ones(1, 2, 4, 4) / 4
    uniforms = draw_multipath_uniforms(1, 2, 3)
    with pytest.raises(ValueError, match="supports"):
        verify_paths("token", ids, q, p, None, uniforms)
    with pytest.raises(ValueError, match="needs draft_probs"):
        verify_paths("block", ids, None, p, None, uniforms)
    with pytest.raises(ValueError, match="draft_ids must be"):
        verify_paths("block", ids[0], q, p, None, uniforms)
    with pytest.raises(ValueError, match="target_probs must be"):
        verify_paths("block", ids, q, p[:, :1], None, uniforms)
    with pytest.raises(ValueError, match="target_probs must be"):
        verify_paths("block", ids, q, p[:, :, :3], None, uniforms)
    with pytest.raises(ValueError, match="NaN or inf"):
        verify_paths("block", ids, q, p * float("nan"), None, uniforms)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        verify_paths("block", ids, q, p, torch.tensor([4]), uniforms)
