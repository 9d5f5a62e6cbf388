"""Per-row sampling settings in the Ray runtime: the coordinator, draft actor and target shard carry
each row's own temperature, top-p and seed, so a row decodes as in the local engine on its own.

    timeout 600 .venv/bin/python -m pytest tests/distributed/test_row_sampling_ray.py -x -q
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import ray

from distributed_spec.distributed import RayCoordinator
from distributed_spec.distributed.factories import TinyLlamaFactory
from distributed_spec.engine import EngineConfig, SpeculativeEngine
from distributed_spec.engine.config import SamplingConfig, VerifierConfig
from distributed_spec.engine.speculative import make_request
from distributed_spec.verify import SamplingParams
from tests.configs import engine_replace
from tests.distributed.conftest import ray_config

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

TARGET = TinyLlamaFactory(vocab_size=64, num_layers=2, hidden=32, seed=0, logit_scale=8.0)
DRAFT = TinyLlamaFactory(vocab_size=64, num_layers=2, hidden=32, seed=0, logit_scale=8.0, noise=0.3)
GREEDY, HOT = SamplingParams(temperature=0.0), SamplingParams(temperature=1.0)
OWN = SamplingParams(temperature=0.7, top_p=0.9)
CONFIG = EngineConfig(
    verifier=VerifierConfig(method="block", num_draft_tokens=3),
    sampling=SamplingConfig(temperature=1.0, max_new_tokens=20, seed=3),
    max_batch_size=8,
)
RUNTIME = ray_config(tp_size=1, num_cpus_per_shard=0.5, num_cpus_draft=0.5, step_timeout_s=60.0)
PROMPTS = [[5, 6, 7, 8], [9, 10], [11, 12, 13], [3], [20, 21, 22, 23, 24]]
SETTINGS = [HOT, OWN, GREEDY, SamplingParams(temperature=1.3), OWN]
SEEDS = [None, 1234, None, 5, 99]


def decode(backend, vocab_size, max_context, prompts, settings, seeds):
    requests = [
        make_request(
            prompt, CONFIG, vocab_size, max_context, key=index, seed_key=index, sampling=params, seed=seed
        )
        for index, (prompt, params, seed) in enumerate(zip(prompts, settings, seeds))
    ]
    finished = {request.key: request.output for request in backend.stream(requests)}
    return [finished[index] for index in range(len(prompts))]


def decode_alone_locally(row: int) -> list[int]:
    engine = SpeculativeEngine(TARGET(), DRAFT(), CONFIG)
    return decode(
        engine, engine.vocab_size, engine.max_context, [PROMPTS[row]], [SETTINGS[row]], [SEEDS[row]]
    )[0]


@pytest.fixture(scope="module")
def coordinator():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    with RayCoordinator(TARGET, DRAFT, CONFIG, RUNTIME) as started:
        yield started
    ray.shutdown()


def test_each_row_decodes_as_alone_in_the_local_engine(coordinator):
    actors = coordinator.actors
    mixed = decode(coordinator, actors.vocab_size, actors.max_context, PROMPTS, SETTINGS, SEEDS)
    for row in range(len(PROMPTS)):
        assert mixed[row] == decode_alone_locally(row), row


def test_greedy_rows_stay_greedy_with_blocks_drafted_ahead(coordinator):
    """Overlap drafts ahead with its own uniforms (sampled rows follow another draw), but each row
    keeps its own settings there too: greedy rows are still plain greedy."""
    coordinator.runtime = replace(RUNTIME, overlap=True)
    actors = coordinator.actors
    settings = [GREEDY, OWN, GREEDY, HOT, GREEDY]
    mixed = decode(coordinator, actors.vocab_size, actors.max_context, PROMPTS, settings, [None] * 5)
    engine = SpeculativeEngine(
        TARGET(), DRAFT(), engine_replace(CONFIG, sampling=replace(CONFIG.sampling, temperature=0.0))
    )
    greedy_prompts = [PROMPTS[row] for row in (0, 2, 4)]
    expected = decode(engine, engine.vocab_size, engine.max_context, greedy_prompts, [GREEDY] * 3, [None] * 3)
    assert [mixed[row] for row in (0, 2, 4)] == expected
