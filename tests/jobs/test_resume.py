"""Resume repairs what a crash leaves: torn last lines, unreadable lines, repeated ids."""

from __future__ import annotations

import json

import pytest

from distributed_spec.config import ConfigError
from distributed_spec.jobs.resume import check_run_meta, scan_jsonl


def _key(record):
    return record.get("id")


def test_missing_file_is_empty(tmp_path):
    result = scan_jsonl(tmp_path / "none.jsonl", _key)
    assert result.keys == set() and result.num_records == 0


def test_torn_last_line_is_cut(tmp_path):
    path = tmp_path / "o.jsonl"
    whole = b'{"id": 1}\n{"id": 2}\n'
    path.write_bytes(whole + b'{"id": 3, "compl')
    result = scan_jsonl(path, _key)
    assert result.keys == {1, 2} and result.num_torn == 1 and result.num_dropped == 0
    assert path.read_bytes() == whole
    # A second scan finds nothing to repair.
    again = scan_jsonl(path, _key)
    assert again.num_torn == 0 and again.keys == {1, 2}


def test_unreadable_middle_lines_and_duplicates_are_dropped(tmp_path):
    path = tmp_path / "o.jsonl"
    path.write_bytes(b'{"id": 1}\n{"id": 2, "x\n{"id": 1}\n\xff\xfe\n{"id": 4}\n')
    result = scan_jsonl(path, _key)
    assert result.keys == {1, 4} and result.num_dropped == 3 and result.num_records == 2
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == [1, 4]


def test_run_meta_refuses_other_settings(tmp_path):
    check_run_meta(tmp_path, {"verifier": {"num_draft_tokens": 4}}, resume=True)
    check_run_meta(tmp_path, {"verifier": {"num_draft_tokens": 4}}, resume=True)
    with pytest.raises(ConfigError, match="data.output_dir.*data.resume=false"):
        check_run_meta(tmp_path, {"verifier": {"num_draft_tokens": 8}}, resume=True)
    # Starting over is allowed and records the new settings.
    check_run_meta(tmp_path, {"verifier": {"num_draft_tokens": 8}}, resume=False)
    assert json.loads((tmp_path / "run_meta.json").read_text()) == {"verifier": {"num_draft_tokens": 8}}
