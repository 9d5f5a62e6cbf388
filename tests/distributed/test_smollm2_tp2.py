"""The Ray TP = 2 runtime on the real SmolLM2 target with its distilled draft: greedy output equals
the single-process engine's, token for token.

    timeout 600 .venv/bin/python -m pytest tests/distributed/test_smollm2_tp2.py -q
"""

from __future__ import annotations

import pytest
import ray

from distributed_spec.distributed import RayCoordinator
from distributed_spec.distributed.factories import SpecFactory
from distributed_spec.engine import EngineConfig, SpeculativeEngine
from distributed_spec.engine.config import SamplingConfig, VerifierConfig
from distributed_spec.models import ModelConfig, ModelSpec, load_pair
from distributed_spec.models.distilled import DISTILLED_SMOLLM2_DRAFT_DIR
from tests.distributed.conftest import ray_config

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(600)]

PAIR = ModelConfig(target=ModelSpec("smollm2"), draft=ModelSpec(str(DISTILLED_SMOLLM2_DRAFT_DIR), kind="distilled"))
GREEDY = EngineConfig(
    verifier=VerifierConfig(method="block", num_draft_tokens=4),
    sampling=SamplingConfig(temperature=0.0, max_new_tokens=16),
)


def test_smollm2_tp2_greedy_equals_single_process_engine():
    target, draft = load_pair(PAIR)
    prompts = [
        target.tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for text in ("What is the capital of France?", "Write a Python function that adds two numbers.")
    ]
    expected, expected_stats = SpeculativeEngine(target.model, draft.model, GREEDY).generate_with_stats(
        prompts
    )
    del target, draft
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        runtime = ray_config(tp_size=2, num_cpus_per_shard=1.0, num_cpus_draft=1.0)
        with RayCoordinator(*SpecFactory.for_pair(PAIR, "cpu"), GREEDY, runtime) as tp2:
            actual, actual_stats = tp2.generate_with_stats(prompts)
    finally:
        ray.shutdown()
    assert [r.token_ids for r in actual] == [r.token_ids for r in expected]
    assert all(len(r.token_ids) == 16 or r.finish_reason == "eos" for r in actual)
    # The same tokens through the same verifier: the same number of target calls per row.
    assert actual_stats.block_efficiency == pytest.approx(expected_stats.block_efficiency)
