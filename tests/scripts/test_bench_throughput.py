"""scripts/bench_throughput.py's report: which policies goodput is compared with (no timing asserted).

.venv/bin/python -m pytest tests/scripts/test_bench_throughput.py -q
"""

from __future__ import annotations

from types import SimpleNamespace

from scripts import bench_throughput


def _row(policy: str, ratio: float) -> dict:
    return {
        "runtime": "local", "temperature": 0.0, "batch_size": 4, "policy": policy, "batching": "continuous",
        "tokens_per_s": 10.0 * ratio, "ratio": ratio, "ratio_min": ratio, "block_efficiency": 1.0, "seeds": 1,
        "steps_per_draft_len": [1], "ngram_row_share": 0.0,
    }


def test_goodput_is_compared_with_the_fixed_g_policies_of_its_own_proposer():
    rows = [
        _row("autoregressive", 1.0),
        _row("g=1", 1.04),
        _row("g=2 conf0.4", 1.06),
        _row("goodput", 1.05),
        _row("g=2 model+ngram", 1.13),
        _row("goodput model+ngram", 1.10),
    ]
    text = bench_throughput.markdown(rows, SimpleNamespace(argv=[]))
    goodput_table = text.split("its proposer")[1]
    # goodput (model) against g=2 conf0.4, not against the n-gram policy; goodput model+ngram against it.
    assert "| local | 0 | 4 | model | g=2 conf0.4 | 1.06 | 1.05 | 0.991 |" in goodput_table
    assert "| local | 0 | 4 | model+ngram | g=2 model+ngram | 1.13 | 1.10 | 0.973 |" in goodput_table
    assert bench_throughput.proposer_of("g=3 ngram") == "ngram" and bench_throughput.proposer_of("goodput") == "model"
