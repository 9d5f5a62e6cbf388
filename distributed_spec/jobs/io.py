"""Input records in, completions out: JSONL (or Parquet) reading that never stops on bad input.

Input: one record per line (JSONL) or row (Parquet), with an id and either a `prompt` string or a
chat `messages` list of `{"role": ..., "content": ...}`, and optionally the record's own
`max_new_tokens`, `temperature`, `top_p`, `seed` and `stop` (a string or a list of them), which
replace the job's sampling.* for that record (data.format=records; openai_batch.py checks OpenAI
Batch API requests instead, with the same sampling checks). `read_records` yields an `InputRecord`
for every good record and a `RecordError` (see errors.py) for every bad one, in input order, so the
job writes the latter to errors.jsonl and goes on. Blank lines are skipped silently.

Output: `JsonlAppender` appends one JSON object per line (UTF-8, not ASCII-escaped), flushing and
fsyncing on `sync()`, so what is on disk after a crash is whole lines plus at most one torn line,
which resume.py repairs.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distributed_spec.config import DataConfig
from distributed_spec.jobs.errors import (
    REASON_BAD_ID,
    REASON_BAD_MAX_NEW_TOKENS,
    REASON_BAD_MESSAGES,
    REASON_BAD_PROMPT,
    REASON_BAD_SAMPLING,
    REASON_DUPLICATE_ID,
    REASON_EMPTY_PROMPT,
    REASON_INVALID_UTF8,
    REASON_MALFORMED_JSON,
    REASON_MISSING_ID,
    REASON_MISSING_PROMPT,
    REASON_NOT_AN_OBJECT,
    RecordError,
    record_error,
)


@dataclass(frozen=True)
class RecordSampling:
    """A record's own sampling settings; None takes the job's (sampling.*)."""

    temperature: float | None = None
    top_p: float | None = None
    # Replaces the record's random stream seed (by default derived from sampling.seed and its id).
    seed: int | None = None
    stop: tuple[str, ...] | None = None


@dataclass(frozen=True)
class InputRecord:
    """One valid input record; exactly one of `prompt` and `messages` is set."""

    # 1-based line (JSONL) or row (Parquet) of the input file.
    line: int
    # The record's id as given (str or int), kept unchanged in the outputs.
    id: Any
    prompt: str | None = None
    # Chat turns: [{"role": str, "content": str}, ...]
    messages: list[dict[str, str]] | None = None
    # The record's own token limit (its optional `max_new_tokens` field); None: sampling.max_new_tokens.
    max_new_tokens: int | None = None
    sampling: RecordSampling = RecordSampling()


def id_key(record_id: Any) -> str:
    """A hashable key that keeps 7 and "7" apart (the JSON text of the id)."""
    return json.dumps(record_id, ensure_ascii=False)


# Checks one decoded row: (line, row, data) -> a record or its error.
RecordCheck = Callable[[int, Any, DataConfig], InputRecord | RecordError]


def read_records(
    path: str | Path, data: DataConfig, check: RecordCheck | None = None
) -> Iterator[InputRecord | RecordError]:
    """Parse and check every record of a JSONL or Parquet file (with `check`, default check_record);
    see the module docstring."""
    check = check or check_record
    path = Path(path).expanduser()
    rows = _parquet_rows(path) if path.suffix == ".parquet" else _jsonl_rows(path)
    first_line_of_id: dict[str, int] = {}
    for line, row in rows:
        if isinstance(row, RecordError):
            yield row
            continue
        checked = check(line, row, data)
        if isinstance(checked, InputRecord):
            key = id_key(checked.id)
            if key in first_line_of_id:
                checked = record_error(
                    line, checked.id, REASON_DUPLICATE_ID, f"first seen on line {first_line_of_id[key]}"
                )
            else:
                first_line_of_id[key] = line
        yield checked


def _jsonl_rows(path: Path) -> Iterator[tuple[int, Any]]:
    # Binary mode: each line is decoded on its own, so invalid UTF-8 costs one record, not the file.
    with open(path, "rb") as file:
        for line, raw in enumerate(file, start=1):
            if not raw.strip():
                continue
            try:
                # utf-8-sig on the first line: a byte-order mark there is not part of the record.
                text = raw.decode("utf-8-sig" if line == 1 else "utf-8")
            except UnicodeDecodeError as err:
                yield line, record_error(line, None, REASON_INVALID_UTF8, f"byte {err.start}")
                continue
            try:
                yield line, json.loads(text)
            except json.JSONDecodeError as err:
                yield (
                    line,
                    record_error(line, None, REASON_MALFORMED_JSON, f"{err.msg} at column {err.colno}"),
                )


def _parquet_rows(path: Path) -> Iterator[tuple[int, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as err:
        raise ImportError(
            "Parquet input needs pyarrow: pip install 'distributed_spec[parquet]' (or use JSONL)"
        ) from err
    line = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            line += 1
            yield line, row


def has_lone_surrogate(text: str) -> bool:
    # JSON escapes like "\ud800" decode to strings that cannot be written back as UTF-8.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def check_record(line: int, row: Any, data: DataConfig) -> InputRecord | RecordError:
    """Validate one decoded row: id, then `prompt` or `messages`."""
    if not isinstance(row, dict):
        return record_error(line, None, REASON_NOT_AN_OBJECT, f"got {type(row).__name__}")
    record_id = row.get(data.id_field)
    if record_id is None:
        return record_error(line, None, REASON_MISSING_ID, f"no {data.id_field!r} field")
    if isinstance(record_id, bool) or not isinstance(record_id, (str, int)):
        return record_error(line, None, REASON_BAD_ID, f"{data.id_field!r} must be a string or an integer")
    if isinstance(record_id, str) and (not record_id or has_lone_surrogate(record_id)):
        return record_error(line, None, REASON_BAD_ID, "empty or not valid Unicode")
    max_new_tokens = row.get("max_new_tokens")
    if max_new_tokens is not None and (not is_int(max_new_tokens) or max_new_tokens < 1):
        return record_error(line, record_id, REASON_BAD_MAX_NEW_TOKENS, "must be an integer >= 1")
    sampling = check_record_sampling(line, record_id, row)
    if isinstance(sampling, RecordError):
        return sampling
    checked = _check_prompt(line, record_id, row, data)
    if isinstance(checked, InputRecord):
        checked = dataclasses.replace(checked, max_new_tokens=max_new_tokens, sampling=sampling)
    return checked


def check_record_sampling(line: int, record_id: Any, fields: dict[str, Any]) -> RecordSampling | RecordError:
    """A record's own `temperature`, `top_p`, `seed` and `stop` (absent: the job's), or the error
    naming the bad one. Used for the job's records and for OpenAI batch request bodies alike."""
    temperature, top_p, seed = fields.get("temperature"), fields.get("top_p"), fields.get("seed")
    if temperature is not None and not (_is_number(temperature) and temperature >= 0):
        return record_error(line, record_id, REASON_BAD_SAMPLING, "temperature must be a number >= 0")
    if top_p is not None and not (_is_number(top_p) and 0 < top_p <= 1):
        return record_error(line, record_id, REASON_BAD_SAMPLING, "top_p must be a number in (0, 1]")
    if seed is not None and not is_int(seed):
        return record_error(line, record_id, REASON_BAD_SAMPLING, "seed must be an integer")
    stop = fields.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (
        isinstance(stop, list) and all(isinstance(s, str) and s and not has_lone_surrogate(s) for s in stop)
    ):
        return record_error(line, record_id, REASON_BAD_SAMPLING, "stop must be a non-empty string or a list of them")
    return RecordSampling(
        temperature=None if temperature is None else float(temperature),
        top_p=None if top_p is None else float(top_p),
        seed=seed,
        stop=None if stop is None else tuple(stop),
    )


def is_int(value: Any) -> bool:
    """An int that is not a bool (JSON true/false decode to bools, which are ints in Python)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


def _check_prompt(line: int, record_id: Any, row: dict, data: DataConfig) -> InputRecord | RecordError:
    prompt = row.get(data.prompt_field)
    messages = row.get(data.messages_field)
    if prompt is None and messages is None:
        return record_error(
            line, record_id, REASON_MISSING_PROMPT, f"needs {data.prompt_field!r} or {data.messages_field!r}"
        )
    if prompt is not None:
        if not isinstance(prompt, str):
            return record_error(line, record_id, REASON_BAD_PROMPT, f"{data.prompt_field!r} must be a string")
        if has_lone_surrogate(prompt):
            return record_error(line, record_id, REASON_BAD_PROMPT, "not valid Unicode (lone surrogate)")
        if not prompt.strip():
            return record_error(line, record_id, REASON_EMPTY_PROMPT)
        return InputRecord(line=line, id=record_id, prompt=prompt)
    return check_messages(line, record_id, messages, data.messages_field)


def check_messages(line: int, record_id: Any, messages: Any, field_name: str) -> InputRecord | RecordError:
    """A chat record from a `messages` list (the input field `field_name`), or its error."""
    if not isinstance(messages, list) or not messages:
        return record_error(line, record_id, REASON_BAD_MESSAGES, f"{field_name!r} must be a non-empty list")
    for turn, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            return record_error(line, record_id, REASON_BAD_MESSAGES, f"turn {turn} needs a string 'role'")
        content = message.get("content")
        if not isinstance(content, str) or has_lone_surrogate(content):
            return record_error(
                line, record_id, REASON_BAD_MESSAGES, f"turn {turn} needs a valid string 'content'"
            )
    if not any(message["content"].strip() for message in messages):
        return record_error(line, record_id, REASON_EMPTY_PROMPT, "every message is empty")
    turns = [{"role": message["role"], "content": message["content"]} for message in messages]
    return InputRecord(line=line, id=record_id, messages=turns)


class JsonlAppender:
    """Appends JSON lines to a file; `sync()` flushes and fsyncs (the durability point)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")
        self.num_unsynced = 0

    def write(self, obj: dict[str, Any]) -> None:
        self._file.write(json.dumps(obj, ensure_ascii=False) + "\n")
        self.num_unsynced += 1

    def sync(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self.num_unsynced = 0

    def close(self) -> None:
        if not self._file.closed:
            self.sync()
            self._file.close()

    def __enter__(self) -> JsonlAppender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
