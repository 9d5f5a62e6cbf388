"""Input parsing never stops on bad records; the appender writes whole JSON lines."""

from __future__ import annotations

import json

import pytest

from distributed_spec.config import DataConfig
from distributed_spec.jobs.errors import RecordError
from distributed_spec.jobs.io import InputRecord, JsonlAppender, RecordSampling, id_key, read_records

GOOD_AND_BAD_LINES = [
    b'{"id": "a", "prompt": "hello"}',
    b'{"id": "b", "prompt": "hel',  # malformed JSON
    b"",  # blank: skipped silently
    b'{"id": "c", "prompt": "caf\xff"}',  # invalid UTF-8
    b'{"prompt": "no id"}',
    b'{"id": "e"}',  # neither prompt nor messages
    b'{"id": "f", "prompt": "   "}',
    b'{"id": "a", "prompt": "again"}',  # duplicate id
    b"[1, 2]",
    b'{"id": 7, "messages": [{"role": "user", "content": "hi"}]}',
    b'{"id": "7", "prompt": "string seven is not int seven"}',
    b'{"id": "h", "messages": [{"role": "user"}]}',
    b'{"id": "i", "prompt": "\\ud800"}',  # lone surrogate: cannot be written back as UTF-8
    b'{"id": true, "prompt": "bool id"}',
    b'{"id": "j", "messages": []}',
]


def _read(tmp_path, lines):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return list(read_records(path, DataConfig(input_path=str(path))))


def test_bad_records_become_errors_with_line_numbers(tmp_path):
    items = _read(tmp_path, GOOD_AND_BAD_LINES)
    good = [item for item in items if isinstance(item, InputRecord)]
    errors = {item.line: item.reason for item in items if isinstance(item, RecordError)}
    assert [(record.line, record.id) for record in good] == [(1, "a"), (10, 7), (11, "7")]
    assert good[1].messages == [{"role": "user", "content": "hi"}]
    assert errors[2].startswith("malformed JSON")
    assert errors[4].startswith("invalid UTF-8")
    assert errors[5].startswith("missing id")
    assert errors[6].startswith("missing prompt")
    assert errors[7] == "empty prompt"
    assert errors[8] == "duplicate id: first seen on line 1"
    assert errors[9].startswith("record is not a JSON object")
    assert errors[12].startswith("invalid messages")
    assert errors[13].startswith("invalid prompt")
    assert errors[14].startswith("invalid id")
    assert errors[15].startswith("invalid messages")
    assert 3 not in errors and len(errors) == len(GOOD_AND_BAD_LINES) - 1 - 3


def test_a_record_may_carry_its_own_sampling_settings(tmp_path):
    """temperature, top_p, seed and stop (a string or a list) replace the job's for that record, as an
    OpenAI batch request's do; a bad value refuses the record with a reason, not the job."""
    items = _read(tmp_path, [
        b'{"id": "a", "prompt": "x", "max_new_tokens": 3, "temperature": 0, "top_p": 0.5, "seed": 9, "stop": "zz"}',
        b'{"id": "b", "prompt": "x", "stop": ["\\n\\n", "END"]}',
        b'{"id": "c", "prompt": "x"}',
        b'{"id": "d", "prompt": "x", "temperature": -1}',
        b'{"id": "e", "prompt": "x", "top_p": 0}',
        b'{"id": "f", "prompt": "x", "seed": 1.5}',
        b'{"id": "g", "prompt": "x", "stop": [""]}',
        b'{"id": "h", "prompt": "x", "temperature": true}',
    ])  # fmt: skip
    good = {item.id: item for item in items if isinstance(item, InputRecord)}
    assert good["a"].max_new_tokens == 3
    assert good["a"].sampling == RecordSampling(temperature=0.0, top_p=0.5, seed=9, stop=("zz",))
    assert good["b"].sampling == RecordSampling(stop=("\n\n", "END"))
    assert good["c"].sampling == RecordSampling() and good["c"].max_new_tokens is None
    errors = {item.id: item.reason for item in items if isinstance(item, RecordError)}
    assert sorted(errors) == ["d", "e", "f", "g", "h"]
    assert all(reason.startswith("invalid sampling settings") for reason in errors.values())
    assert "temperature" in errors["d"] and "top_p" in errors["e"] and "seed" in errors["f"]


def test_custom_field_names(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"uid": 3, "text": "x"}) + "\n")
    data = DataConfig(input_path=str(path), id_field="uid", prompt_field="text")
    assert list(read_records(path, data)) == [InputRecord(line=1, id=3, prompt="x")]


def test_parquet_rows_are_numbered_from_one(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "in.parquet"
    table = pa.table({"id": ["p", "q", "r"], "prompt": ["one", "", "three"]})
    pq.write_table(table, path)
    items = list(read_records(path, DataConfig(input_path=str(path))))
    assert items[0] == InputRecord(line=1, id="p", prompt="one")
    assert isinstance(items[1], RecordError) and items[1].line == 2 and items[1].reason == "empty prompt"
    assert items[2].line == 3


def test_byte_order_mark_and_crlf_are_tolerated(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"id": 1, "prompt": "a"}\r\n{"id": 2, "prompt": "b"}\r\n')
    assert [item.id for item in read_records(path, DataConfig(input_path=str(path)))] == [1, 2]


def test_id_key_keeps_int_and_string_apart():
    assert id_key(7) != id_key("7")


def test_appender_writes_unicode_lines_and_syncs(tmp_path):
    path = tmp_path / "out" / "o.jsonl"
    with JsonlAppender(path) as out:
        out.write({"id": "é", "completion": "naïve\nline"})
        assert out.num_unsynced == 1
        out.sync()
        assert out.num_unsynced == 0
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["completion"] == "naïve\nline"
    assert "é" in lines[0]
