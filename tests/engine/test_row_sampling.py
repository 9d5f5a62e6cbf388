"""Per-row sampling settings: each request's own temperature, top-p, seed and stop strings.

A row's probabilities, verdicts and tokens must be the ones it gets in a batch of its own, whatever
the settings of the rows beside it (docs/design.md section 5). The distribution test of a row at its
own temperature is in test_distribution.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from distributed_spec.engine import EngineConfig, SpeculativeEngine
from distributed_spec.engine.config import SamplingConfig, VerifierConfig
from distributed_spec.engine.speculative import make_request
from distributed_spec.models.tiny import tiny_tokenizer
from distributed_spec.verify import RowSampling, SamplingParams, logits_to_probs, verify_logits
from distributed_spec.verify.rules import VerifyUniforms
from tests.configs import engine_replace

GREEDY = SamplingParams(temperature=0.0)
HOT = SamplingParams(temperature=1.0)
SETTINGS = [GREEDY, HOT, SamplingParams(temperature=0.5, top_p=0.8), SamplingParams(temperature=1.5, top_k=5)]
PROMPTS = [[5, 6, 7, 8], [9, 10], [11, 12, 13], [3], [20, 21, 22, 23, 24]]


def test_row_warp_equals_each_row_warped_alone():
    logits = torch.randn(len(SETTINGS), 3, 64, generator=torch.Generator().manual_seed(0)) * 4
    probs = logits_to_probs(logits, RowSampling(tuple(SETTINGS)))
    for row, params in enumerate(SETTINGS):
        assert torch.equal(probs[row], logits_to_probs(logits[row : row + 1], params)[0])
    assert torch.equal(probs[0].amax(dim=-1), torch.ones(3))  # the greedy row is one-hot


@pytest.mark.parametrize("method", ["block", "token"])
def test_row_verdicts_equal_each_row_verified_alone(method):
    generator = torch.Generator().manual_seed(1)
    batch_size, g, vocab_size = len(SETTINGS), 3, 32
    sampling = RowSampling(tuple(SETTINGS))
    draft_probs = logits_to_probs(
        torch.randn(batch_size, g, vocab_size, generator=generator) * 3, sampling
    )
    draft_ids = torch.stack([torch.multinomial(q, 1, generator=generator)[:, 0] for q in draft_probs])
    target_logits = torch.randn(batch_size, g + 1, vocab_size, generator=generator) * 3
    uniforms = VerifyUniforms(
        eta=torch.rand(batch_size, g, generator=generator, dtype=torch.float64),
        u=torch.rand(batch_size, generator=generator, dtype=torch.float64),
    )
    together = verify_logits(method, draft_ids, draft_probs, target_logits, None, uniforms, sampling)
    for row, params in enumerate(SETTINGS):
        rows = slice(row, row + 1)
        alone = verify_logits(
            method,
            draft_ids[rows],
            draft_probs[rows],
            target_logits[rows],
            None,
            VerifyUniforms(eta=uniforms.eta[rows], u=uniforms.u[rows]),
            params,
        )
        assert together.accepted_counts[row] == alone.accepted_counts[0]
        assert together.next_tokens[row] == alone.next_tokens[0]


def decode(target, draft, config, prompts, settings, seeds=None, stops=None):
    """Token ids of each prompt, decoded in one stream with each request's own settings."""
    engine = SpeculativeEngine(target, draft, config, tokenizer=tiny_tokenizer(64))
    requests = [
        make_request(
            prompt,
            config,
            engine.vocab_size,
            engine.max_context,
            key=index,
            seed_key=index,
            sampling=params,
            seed=None if seeds is None else seeds[index],
            stop_strings=None if stops is None else stops[index],
        )
        for index, (prompt, params) in enumerate(zip(prompts, settings))
    ]
    finished = {request.key: request.output for request in engine.stream(requests)}
    return [finished[index] for index in range(len(prompts))]


CONFIG = EngineConfig(
    verifier=VerifierConfig(method="block", num_draft_tokens=3),
    sampling=SamplingConfig(temperature=1.0, max_new_tokens=20),
    max_batch_size=8,
)


@pytest.mark.parametrize("method", ["block", "token"])
def test_a_greedy_row_among_sampled_rows_decodes_as_plain_greedy(tiny_pair, method):
    target, draft = tiny_pair
    config = engine_replace(CONFIG, verifier=replace(CONFIG.verifier, method=method))
    mixed = decode(target, draft, config, PROMPTS, [HOT, GREEDY, HOT, HOT, GREEDY])
    greedy_alone = decode(
        target,
        draft,
        engine_replace(config, sampling=replace(config.sampling, temperature=0.0)),
        [PROMPTS[1], PROMPTS[4]],
        [None, None],
    )
    autoregressive = decode(
        target,
        None,
        engine_replace(
            config,
            verifier=replace(config.verifier, method="autoregressive"),
            sampling=replace(config.sampling, temperature=0.0),
        ),
        [PROMPTS[1]],
        [None],
    )
    assert [mixed[1], mixed[4]] == greedy_alone
    assert mixed[1] == autoregressive[0]


@pytest.mark.parametrize("schedule", ["constant", "adaptive"])
def test_a_sampled_row_with_its_own_seed_is_the_same_alone_and_mixed(tiny_pair, schedule):
    target, draft = tiny_pair
    config = engine_replace(
        CONFIG,
        verifier=replace(CONFIG.verifier, draft_len_schedule=schedule, max_draft_len=4, num_draft_tokens=2),
    )
    own = SamplingParams(temperature=0.7, top_p=0.9)
    settings = [HOT, own, GREEDY, SamplingParams(temperature=1.3), own]
    seeds = [None, 1234, None, 5, 99]
    mixed = decode(target, draft, config, PROMPTS, settings, seeds)
    for row in (1, 3, 4):
        alone = decode(target, draft, config, [PROMPTS[row]], [settings[row]], [seeds[row]])
        assert mixed[row] == alone[0], row
    # The record's seed replaces its stream seed: the same prompt and seed give the same tokens.
    same_seed = decode(target, draft, config, [PROMPTS[1], PROMPTS[1]], [own, own], [1234, 1234])
    assert same_seed[0] == same_seed[1] == mixed[1]


def test_each_row_has_its_own_stop_strings(tiny_pair):
    target, draft = tiny_pair
    tokenizer = tiny_tokenizer(64)
    config = engine_replace(CONFIG, sampling=replace(CONFIG.sampling, temperature=0.0))
    (free,) = decode(target, draft, config, [PROMPTS[0]], [None])
    stop = tokenizer.decode(free[4:6])
    assert stop
    stopped, unstopped = decode(
        target, draft, config, [PROMPTS[0], PROMPTS[0]], [None, None], stops=[(stop,), None]
    )
    assert unstopped == free and len(stopped) < len(free) and stop in tokenizer.decode(stopped)


def test_the_greedy_verifier_refuses_a_sampled_request(tiny_pair):
    target, draft = tiny_pair
    config = engine_replace(
        CONFIG,
        verifier=replace(CONFIG.verifier, method="greedy"),
        sampling=replace(CONFIG.sampling, temperature=0.0),
    )
    with pytest.raises(ValueError, match="greedy verifier needs temperature 0"):
        decode(target, draft, config, [PROMPTS[0]], [HOT])
