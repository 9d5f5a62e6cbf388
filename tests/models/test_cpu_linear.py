"""models/cpu_linear.py: bf16 linears packed once for oneDNN compute what F.linear computes, bitwise.

    .venv/bin/python -m pytest tests/models/test_cpu_linear.py -q
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from distributed_spec.models import cpu_linear
from distributed_spec.models.cpu_linear import PackedLinear, pack_cpu_linears, packing_available
from distributed_spec.models.tiny import tiny_llama
from tests.jobs.cli_runs import tiny_args, write_prompts
from tests.models.test_lean_llama import _draft, _scripted_run

pytestmark = pytest.mark.skipif(not packing_available(), reason="this torch build has no oneDNN packed linear")


@pytest.mark.parametrize("out_features, in_features", [(48, 32), (96, 64), (576, 576), (1000, 576)])
@pytest.mark.parametrize("bias", [False, True])
def test_the_packed_product_is_f_linear_bitwise(out_features, in_features, bias):
    torch.manual_seed(0)
    linear = nn.Linear(in_features, out_features, bias=bias).to(torch.bfloat16)
    packed = PackedLinear(linear)
    assert packed.weight is linear.weight and packed.bias is linear.bias
    with torch.inference_mode():
        # Both sides of PACKED_MAX_ROWS: the packed product below it, F.linear past it.
        for shape in [*((rows, in_features) for rows in range(1, 65)), (2, 5, in_features), (4, 9, in_features)]:
            x = torch.randn(*shape, dtype=torch.bfloat16)
            assert torch.equal(packed(x), F.linear(x, linear.weight, linear.bias)), shape
        # A strided view (a slice of [B, T, H]) goes in as its dense copy would. (F.linear itself
        # takes a batched-matmul path over such a view, which rounds differently with a bias.)
        x = torch.randn(4, 6, in_features, dtype=torch.bfloat16)[:, 2:5]
        assert torch.equal(packed(x), F.linear(x.contiguous(), linear.weight, linear.bias))


def _tiny(dtype: torch.dtype) -> nn.Module:
    return tiny_llama(vocab_size=64, num_layers=2, hidden=32, seed=0).to(dtype).eval()


def test_a_bf16_model_gives_the_same_logits_packed():
    model = _tiny(torch.bfloat16)
    ids = torch.randint(3, 64, (3, 9), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want = model(ids).logits
        linears = [module for module in model.modules() if type(module) is nn.Linear]
        assert pack_cpu_linears(model) == len(linears) > 0
        assert not any(type(module) is nn.Linear for module in model.modules())
        assert torch.equal(model(ids).logits, want)
    # Packing again finds nothing left to pack; a float32 model is left as it is.
    assert pack_cpu_linears(model) == 0
    assert pack_cpu_linears(_tiny(torch.float32)) == 0


def test_a_linear_shared_by_two_parents_is_packed_once_and_stays_shared():
    shared = nn.Linear(8, 8, bias=False).to(torch.bfloat16)
    model = nn.ModuleDict({"a": nn.Sequential(shared), "b": nn.Sequential(shared)})
    assert pack_cpu_linears(model) == 1
    assert isinstance(model["a"][0], PackedLinear) and model["a"][0] is model["b"][0]


def test_a_shape_whose_packed_product_differs_here_is_left_plain(monkeypatch):
    model = _tiny(torch.bfloat16)
    square = {(module.out_features, module.in_features) for module in model.modules() if type(module) is nn.Linear}
    assert (32, 32) in square and len(square) > 1
    # As on a CPU where oneDNN picks another kernel for the packed weight: the check at load sees it.
    monkeypatch.setattr(cpu_linear, "matches_f_linear", lambda packed: packed.in_features != packed.out_features)
    pack_cpu_linears(model)
    for module in model.modules():
        if isinstance(module, nn.Linear):
            assert isinstance(module, PackedLinear) == (module.in_features != module.out_features)


def test_the_drafts_lean_forward_gives_the_same_logits_packed():
    # The distilled draft's plain-torch forward (models/lean_llama.py) calls the projections' own
    # forward, so packing reaches it too; the engine's verbs give bitwise the same logits.
    draft = _draft(torch.bfloat16)
    want = _scripted_run(draft, lean=True)
    assert pack_cpu_linears(draft) > 0
    for got, expected in zip(_scripted_run(draft, lean=True), want):
        assert torch.equal(got, expected)


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    from tests.jobs.fakes import save_tiny_pair

    return save_tiny_pair(tmp_path_factory.mktemp("tiny_pair"))


def _packed_linears(generator) -> list[int]:
    """How many linears the job's models hold packed: Ray's per actor (shard 0, the draft), or local's
    per model (target, draft)."""
    coordinator = getattr(generator, "coordinator", None)
    if coordinator is not None:
        return coordinator.actors.packed_linears
    runners = (generator.engine.target_runner, generator.engine.draft_runner)
    return [sum(isinstance(module, PackedLinear) for module in runner.model.modules()) for runner in runners]


def _completions(tiny_pair, tmp_path, name: str, *extra: str) -> tuple[dict[str, list[int]], list[int]]:
    from hydra import compose, initialize_config_dir

    from distributed_spec.config import JobConfig
    from distributed_spec.hydra_config import CONF_DIR
    from distributed_spec.jobs.runner import build_generator, run

    input_path = tmp_path / "prompts.jsonl"
    if not input_path.exists():
        write_prompts(input_path, 5)
    overrides = tiny_args(
        tiny_pair, input_path, "model.dtype=bfloat16", "sampling.temperature=1.0", "sampling.max_new_tokens=16",
        "data.batch_size=2", "data.resume=false", "verifier.num_draft_tokens=3",
        # Constant blocks: the same shapes in both runs (goodput's lengths follow wall-clock timings).
        "verifier.draft_len_schedule=constant", *extra,
    )
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        job = JobConfig.from_dictconfig(compose(config_name="generate", overrides=overrides))
    out = tmp_path / name
    generator = build_generator(job)
    packed = _packed_linears(generator)
    run(job, output_dir=out, generator=generator)
    lines = (out / "completions.jsonl").read_text().splitlines()
    return {record["id"]: record["completion_ids"] for record in map(json.loads, lines)}, packed


def test_a_sampled_bf16_job_writes_the_same_tokens_packed_locally_and_in_ray(tiny_pair, tmp_path):
    plain, packed = _completions(tiny_pair, tmp_path, "plain")
    assert len(plain) == 5 and packed == [0, 0]
    local, packed = _completions(tiny_pair, tmp_path, "packed", "model.cpu_prepack=true")
    # Each model's 2 layers x 7 projections, and the output head.
    assert local == plain and packed == [15, 15]
    # Ray at TP = 1 (the draft inside shard 0): the shard and the draft pack their own copies.
    in_ray, packed = _completions(
        tiny_pair, tmp_path, "ray_packed", "model.cpu_prepack=true", "parallel=ray", "parallel.tp_size=1",
        "parallel.num_cpus_per_shard=0.5", "parallel.num_cpus_draft=0.5",
    )
    assert in_ray == plain and packed == [15, 15]
