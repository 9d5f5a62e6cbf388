"""scripts/bench.py on tiny models: the bookkeeping behind the published figures (no timing asserted).

.venv/bin/python -m pytest tests/scripts/test_bench.py -q
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest

from distributed_spec.models.tiny import perturbed_copy, tiny_llama
from scripts import bench

MAX_NEW_TOKENS = 6
PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(vocab_size=64, num_layers=2, hidden=32, seed=0, logit_scale=8.0)
    draft = perturbed_copy(target, noise=0.3, seed=1)
    return SimpleNamespace(model=target), SimpleNamespace(model=draft)


def test_tally_ratios():
    tally = bench.Tally(num_tokens=10, num_row_iterations=4, num_accepted=6, num_proposed=8, seconds=2.0)
    tally.add(bench.Tally(num_tokens=2, num_row_iterations=2, num_accepted=0, num_proposed=4, seconds=1.0))
    assert tally.block_efficiency == 2.0
    assert tally.acceptance_rate == 0.5
    assert tally.tokens_per_s == 4.0
    assert bench.Tally().acceptance_rate == 0.0 and bench.Tally().tokens_per_s == 0.0


def test_runs_take_turns_batch_by_batch(monkeypatch):
    """Every run sees every batch exactly once, and who goes first rotates from batch to batch."""
    calls = []

    def fake_engine(target, draft, prompts, method, g, *args):
        calls.append((method, tuple(map(tuple, prompts))))
        return bench.Tally(num_tokens=len(prompts), num_row_iterations=len(prompts), seconds=1.0)

    def fake_hf(target, draft, prompt, g, *args):
        calls.append(("hf_assisted", (tuple(prompt),)))
        return bench.Tally(num_tokens=1, num_row_iterations=1, seconds=1.0)

    monkeypatch.setattr(bench, "run_engine", fake_engine)
    monkeypatch.setattr(bench, "run_hf_assisted", fake_hf)
    runs = [bench.Run("autoregressive", 0), bench.Run("block", 2), bench.Run("hf_assisted", 2)]
    tallies = bench.run_interleaved(None, None, PROMPTS, runs, 1.0, 0, 1, MAX_NEW_TOKENS, (), 8)
    assert [tally.num_tokens for tally in tallies.values()] == [3, 3, 3]
    firsts = [calls[index][0] for index in range(0, len(calls), len(runs))]
    assert firsts == ["autoregressive", "block", "hf_assisted"]
    for method in ("autoregressive", "block", "hf_assisted"):
        assert sorted(prompts for name, prompts in calls if name == method) == sorted((tuple(p),) for p in PROMPTS)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_method_runs_on_tiny_models(pair, temperature):
    """Engine methods (with draft-length policies) and HF assisted generation, interleaved."""
    target, draft = pair
    verifier = "greedy" if temperature == 0 else "block"
    runs = [
        bench.Run("autoregressive", 0),
        bench.Run(verifier, 2),
        bench.Run(f"{verifier}+adaptive", 2),
        bench.Run(f"{verifier}+conf0.4", 3),
        bench.Run("hf_assisted", 2),
    ]
    tallies = bench.run_interleaved(target, draft, PROMPTS, runs, temperature, 0, 1, MAX_NEW_TOKENS, (), 6)
    for run, tally in tallies.items():
        # No EOS id: every prompt runs to the token budget, whatever the method.
        assert tally.num_tokens == len(PROMPTS) * MAX_NEW_TOKENS, run
        assert tally.seconds > 0
        limit = 1 if run.method == "autoregressive" else 1 + (6 if "adaptive" in run.method else run.g)
        assert 1.0 <= tally.block_efficiency <= limit, run
        assert 0.0 <= tally.acceptance_rate <= 1.0
    assert tallies[runs[0]].num_proposed == 0
    assert all(len(tally.outputs) == len(PROMPTS) for tally in tallies.values())
    if temperature == 0:
        # What the "same tokens as AR" column counts: greedy speculation in float32 never differs.
        for run in runs[1:4]:
            assert tallies[run].outputs == tallies[runs[0]].outputs, run
    # The perturbed draft agrees with the target often: speculation must accept something.
    assert tallies[runs[1]].acceptance_rate > 0


@pytest.mark.parametrize("g", [1, 3])
def test_hf_assisted_drafts_g_tokens_per_target_call(pair, g):
    """num_assistant_tokens = g reaches transformers (it reads the assistant's generation config):
    with a draft identical to the target and no confidence stop, every call keeps g drafts."""
    target, _ = pair
    draft = copy.deepcopy(target.model)
    draft.generation_config.assistant_confidence_threshold = 0.0
    tally = bench.Tally()
    for prompt in PROMPTS:
        tally.add(bench.run_hf_assisted(target, SimpleNamespace(model=draft), prompt, g, 0.0, 0, 12, ()))
    assert tally.num_proposed <= g * tally.num_row_iterations
    assert tally.acceptance_rate == 1.0
    assert tally.block_efficiency > g  # g + 1 per call, less only where the budget ends a row
    assert draft.generation_config.num_assistant_tokens is None  # restored afterwards


def test_forward_costs_and_their_table(pair):
    target, draft = pair
    costs = bench.forward_costs(target, draft, max_tokens=3, repeats=2)
    assert len(costs["target_ms"]) == 3 and len(costs["draft_ms"]) == 1
    assert all(ms > 0 for ms in costs["target_ms"] + costs["draft_ms"])
    table = bench.cost_table(costs)
    assert "| target T(n) / T(1) | 1.00 |" in table


def test_append_reads_back_what_was_written(tmp_path):
    """--append continues a grid from results.json, and only with the dtype it was measured in."""
    rows = [bench.Measurement(0.0, 2, "greedy", 1, [1.5], [0.25], [20.0], [1.0])]
    costs = {"target_ms": [40.0, 42.0], "draft_ms": [4.0]}
    args = SimpleNamespace(out=tmp_path, dtype="bfloat16", max_new_tokens=16, seeds=[0], threads=2, max_draft_len=8)
    bench.write_results(rows, costs, args, SimpleNamespace(name="t"), SimpleNamespace(name="d"), [[1]])
    assert bench.load_results(tmp_path / "results.json", "bfloat16") == rows
    assert "| 0.0 | 2 | 1 | greedy | 1.500 ± 0.000 |" in (tmp_path / "results.md").read_text()
    with pytest.raises(SystemExit, match="float32"):
        bench.load_results(tmp_path / "results.json", "float32")
    with pytest.raises(SystemExit, match="does not exist"):
        bench.load_results(tmp_path / "missing.json", "bfloat16")


def test_speedup_is_paired_seed_by_seed():
    """A slow seed slows every run of that seed alike: each ratio uses its own seed's AR figure."""
    ar = bench.Measurement(1.0, 0, "autoregressive", 1, tokens_per_s=[10.0, 20.0])
    block = bench.Measurement(1.0, 4, "block", 1, tokens_per_s=[15.0, 20.0])
    other_batch = bench.Measurement(1.0, 4, "block", 4, tokens_per_s=[30.0])
    assert bench.speedups([ar, block, other_batch], block) == [1.5, 1.0]
    assert bench.speedups([ar, block, other_batch], other_batch) == []


def test_table_rows_follow_batch_then_temperature_then_gamma():
    """A grid run in parts (T = 1 first, then T = 0 with --append) still reads in order."""
    rows = [
        bench.Measurement(1.0, 0, "autoregressive", 1, [1.0], [0.0], [10.0]),
        bench.Measurement(1.0, 4, "block", 1, [1.5], [0.2], [11.0]),
        bench.Measurement(1.0, 4, "token", 1, [1.4], [0.2], [11.0]),
        bench.Measurement(1.0, 4, "block", 4, [1.5], [0.2], [30.0]),
        bench.Measurement(0.0, 2, "greedy", 1, [1.5], [0.25], [12.0]),
        bench.Measurement(0.0, 0, "autoregressive", 1, [1.0], [0.0], [10.0]),
    ]
    table = bench.markdown(rows, "header")
    order = [line.split(" | ")[:4] for line in table.splitlines() if line.startswith("| 0.0 |") or line.startswith("| 1.0 |")]
    assert order[:6] == [
        ["| 0.0", "-", "1", "autoregressive"],
        ["| 0.0", "2", "1", "greedy"],
        ["| 1.0", "-", "1", "autoregressive"],
        ["| 1.0", "4", "1", "block"],
        ["| 1.0", "4", "1", "token"],
        ["| 1.0", "4", "4", "block"],
    ]


def test_each_mode_fills_its_own_defaults():
    """bench.py --engine-table (formerly scripts/bench_engine.py) keeps that script's defaults."""
    engine = bench.parse_args(["--engine-table"])
    assert (engine.num_draft_tokens, engine.batch_sizes, engine.num_prompts, engine.threads) == ([4], [8], 8, 1)
    grid = bench.parse_args(["--num-draft-tokens", "2"])
    assert grid.num_draft_tokens == [2] and grid.temperatures == [0.0, 0.6, 1.0] and grid.dtype == "float32"
    with pytest.raises(SystemExit):
        bench.parse_args(["--engine-table", "--num-draft-tokens", "2", "4"])


def test_engine_table_on_tiny_models(pair):
    tokenizer = SimpleNamespace(eos_token_id=2, decode=lambda ids: " ".join(map(str, ids)))
    target = SimpleNamespace(model=pair[0].model, tokenizer=tokenizer)
    draft = SimpleNamespace(model=pair[1].model, name="tiny")
    args = bench.parse_args(["--engine-table", "--max-new-tokens", "4", "--methods", "autoregressive,block"])
    table = bench.engine_table(target, draft, PROMPTS, ["autoregressive", "block"], 2, args)
    assert "| autoregressive |" in table and "| 1.00x | 1.00 |" in table and "| block |" in table
