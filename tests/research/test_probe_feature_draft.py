"""The EAGLE-style probe's batched depths equal one-chain-at-a-time rollouts, and its targets line up."""

import torch

from distributed_spec.models.tiny import tiny_llama
from research.probe_feature_draft import FeatureDraft, make_feature_batch


def _draft(seed: int = 0) -> FeatureDraft:
    target = tiny_llama(vocab_size=64, hidden=32, seed=seed)
    draft = FeatureDraft(target, torch.arange(0, 64, 2))
    torch.manual_seed(seed)
    with torch.no_grad():  # move off the identity-like init so every weight matters
        for p in draft.trainable_parameters():
            p.add_(0.3 * torch.randn_like(p))
    # float64: the two computations differ in shape, so in float32 only to rounding (~1e-4).
    draft = draft.double()
    draft.embed_weight, draft.head_weight = draft.embed_weight.double(), draft.head_weight.double()
    return draft.eval()


def test_chain_features_match_rollouts_at_every_depth_and_position():
    draft = _draft()
    torch.manual_seed(1)
    length, depth = 9, 4
    features = torch.randn(2, length, 32, dtype=torch.float64)
    next_tokens = torch.randint(0, 64, (2, length))
    with torch.no_grad():
        chains = draft.chain_features(features, next_tokens, depth)
    checked = 0
    for b in range(2):
        for s in range(depth):
            for t in range(s, length):
                reference = draft.rollout(features[b:b + 1], next_tokens[b:b + 1], start=t - s, steps=s + 1)[-1]
                torch.testing.assert_close(chains[s][b, t], reference[0], atol=1e-10, rtol=1e-10)
                checked += 1
    assert checked == 2 * sum(length - s for s in range(depth))
    # Depths differ: a chain on its own guesses is not the true-feature prediction.
    assert (chains[1][:, 1:] - chains[0][:, 1:]).abs().max() > 1e-3


def test_feature_batch_targets_are_p_of_the_token_after_next():
    n, k = 6, 3
    record = {"input_ids": torch.arange(10, 10 + n, dtype=torch.int32),
              "topk_ids": torch.arange(n - 1)[:, None].repeat(1, k).int(),  # row r: p of token r + 1
              "topk_probs": torch.full((n - 1, k), 0.25, dtype=torch.float16),
              "rest": torch.full((n - 1,), 0.25), "num_prompt_tokens": 3}
    features = torch.arange(n, dtype=torch.float16)[:, None].repeat(1, 4)
    batch = make_feature_batch([record], [features], torch.arange(64))
    assert batch["valid"][0].tolist() == [True] * (n - 2) + [False] * 2
    # Position t predicts x_{t+2} from (f_t, x_{t+1}): p row t + 1, true next feature f_{t+1}.
    assert batch["sub_ids"][:, 0].tolist() == list(range(1, n - 1))
    assert batch["next_tokens"][0, :n - 1].tolist() == list(range(11, 10 + n))
    assert batch["next_features"][0, :n - 1, 0].tolist() == list(range(1, n))
    assert batch["generated"][0, :n - 2].tolist() == [t + 2 >= 3 for t in range(n - 2)]
