"""A short job with W&B offline writes config, metrics over time, a summary and a samples table."""

from __future__ import annotations

import json
import struct

from distributed_spec.config import DataConfig, JobConfig, SamplingConfig, TrackingConfig, VerifierConfig
from distributed_spec.jobs.runner import run
from distributed_spec.tracking.wandb_offline import (
    _BLOCK_LEN,
    _records,
    find_offline_runs,
    wait_for_offline_run,
)
from tests.jobs.fakes import FakeGenerator


def test_offline_run_holds_config_metrics_summary_and_samples(tmp_path):
    input_path = tmp_path / "in.jsonl"
    input_path.write_text(
        "".join(json.dumps({"id": f"r{i}", "prompt": f"prompt {i}"}) + "\n" for i in range(5))
    )
    job = JobConfig(
        verifier=VerifierConfig(method="token", num_draft_tokens=2, draft_len_schedule="constant", max_draft_len=8),
        sampling=SamplingConfig(max_new_tokens=4),
        data=DataConfig(input_path=str(input_path), output_dir=str(tmp_path / "out"), batch_size=2),
        tracking=TrackingConfig(mode="offline", project="test", tags=["unit"], progress=False),
    )
    run(job, generator=FakeGenerator())
    runs = find_offline_runs(tmp_path / "out")
    assert len(runs) == 1
    offline = wait_for_offline_run(runs[0])
    assert offline.complete
    assert offline.config["verifier"] == {
        "method": "token", "num_draft_tokens": 2, "draft_len_schedule": "constant", "max_draft_len": 8, "draft_confidence_threshold": 0.0,
        "proposer": "model", "ngram_min": 1, "ngram_max": 3, "num_paths": 1,
    }
    assert offline.config["sampling"]["max_new_tokens"] == 4
    assert {"unit", "token", "d2", "local"} <= set(offline.tags)
    metric_rows = [row for row in offline.history if "tokens_per_s" in row]
    # Five records, batch_size 2: logged every two finished records and at the end (step = records).
    assert [row["_step"] for row in metric_rows] == [2, 4, 5]
    assert [row["records"] for row in metric_rows] == [2, 4, 5]
    last = metric_rows[-1]
    assert (
        last["block_efficiency"] == 2.0
        and last["acceptance/pos_1"] == 1.0
        and last["acceptance/pos_2"] == 0.0
    )
    assert last["time/draft_s"] > 0 and last["time/target_s"] > 0 and last["time/verify_s"] > 0
    assert offline.summary["records_total"] == 5 and offline.summary["block_efficiency"] == 2.0
    assert offline.summary["samples/_type"] == "table-file" and offline.summary["samples/nrows"] == 5
    table_files = list(runs[0].glob("files/media/table/samples_*.table.json"))
    table = json.loads(table_files[0].read_text())
    assert table["columns"][:3] == ["id", "prompt", "completion"]
    assert [row[0] for row in table["data"]] == [f"r{i}" for i in range(5)]


def _chunk(kind: int, payload: bytes) -> bytes:
    return struct.pack("<IHB", 0, len(payload), kind) + payload


def test_reader_joins_records_split_across_blocks(tmp_path):
    # A file header, a record that fills the first block exactly, then one split FIRST/LAST over two.
    header = b":W&B" + b"\xe1\xbe\x00"
    first_len = _BLOCK_LEN - len(header) - 7
    big = bytes(range(256)) * 40
    split_at = 100
    data = header + _chunk(1, b"a" * first_len) + _chunk(2, big[:split_at])
    data += (
        b"\x00" * (_BLOCK_LEN - len(data) % _BLOCK_LEN) if len(data) % _BLOCK_LEN > _BLOCK_LEN - 7 else b""
    )
    data += _chunk(4, big[split_at:])
    path = tmp_path / "run-x.wandb"
    path.write_bytes(data)
    assert list(_records(path)) == [b"a" * first_len, big]
