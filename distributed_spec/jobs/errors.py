"""Per-record errors of the generation job: bad input is recorded, never fatal.

Each bad record becomes one line of errors.jsonl: `{"line": 12, "id": "q7", "reason": "..."}`, where
`line` is the 1-based line of the JSONL input (the 1-based row of a Parquet input) and `id` is null
when the record had none. The reasons are the `REASON_*` prefixes below followed by details.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

REASON_INVALID_UTF8 = "invalid UTF-8"
REASON_MALFORMED_JSON = "malformed JSON"
REASON_NOT_AN_OBJECT = "record is not a JSON object"
REASON_MISSING_ID = "missing id"
REASON_BAD_ID = "invalid id"
REASON_DUPLICATE_ID = "duplicate id"
REASON_MISSING_PROMPT = "missing prompt"
REASON_EMPTY_PROMPT = "empty prompt"
REASON_BAD_PROMPT = "invalid prompt"
REASON_BAD_MESSAGES = "invalid messages"
REASON_BAD_MAX_NEW_TOKENS = "invalid max_new_tokens"
REASON_BAD_SAMPLING = "invalid sampling settings"
# OpenAI batch requests (data.format=openai_batch): a malformed request line, and a valid one that
# asks for something this job does not do (another endpoint, n > 1, logprobs, penalties, ...).
REASON_BAD_REQUEST = "invalid request"
REASON_UNSUPPORTED = "unsupported request"
REASON_TOO_LONG = "prompt over the context length"
REASON_TOKENIZER = "tokenizer failed"
REASON_GENERATION = "generation failed"


@dataclass(frozen=True)
class RecordError:
    """One input record the job could not process."""

    # 1-based line (JSONL) or row (Parquet) of the input file.
    line: int
    # The record's id, or None when it had no usable one.
    id: Any
    # One of the REASON_* prefixes, then ": " and the details.
    reason: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def record_error(line: int, record_id: Any, reason: str, detail: str = "") -> RecordError:
    return RecordError(line=line, id=record_id, reason=f"{reason}: {detail}" if detail else reason)
