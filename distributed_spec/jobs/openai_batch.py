"""OpenAI Batch API files (data.format=openai_batch): request lines in, one output line per request out.

Input, one request per line, as written for the OpenAI Batch API:

    {"custom_id": "q1", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}],
              "max_completion_tokens": 64, "temperature": 0.5, "top_p": 0.9, "stop": ["\\n\\n"], "seed": 7}}

`/v1/chat/completions` (`messages`, through the tokenizer's chat template) and `/v1/completions`
(a `prompt` string, as is) are served. The request's own max_completion_tokens (or max_tokens),
temperature, top_p, stop and seed replace the job's sampling.* for that request; `model` is not
used (the job's pair answers). A request asking for what the job cannot do exactly (another url,
n > 1, logprobs, penalties, logit_bias, tools, ...) is refused with a reason rather than served
with the option silently dropped; keys that do not change the tokens (user, metadata, store, ...)
are accepted. `check_request` turns a line into an InputRecord (its id is the custom_id) or a
RecordError, like io.check_record does for the job's own format.

Output, one line per request (in completion order; match on custom_id), in the Batch API's format:

    {"id": "batch_req_...", "custom_id": "q1", "response": {"status_code": 200, "request_id": "req_...",
     "body": {<a chat.completion or text_completion object with usage>}}, "error": null}
    {"id": "batch_req_...", "custom_id": "q2", "response": null,
     "error": {"code": "unsupported_request", "message": "..."}}

Ids are derived from the input line and custom_id, so a resumed run writes the same ones.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from distributed_spec.config import DataConfig
from distributed_spec.jobs.errors import (
    REASON_BAD_ID,
    REASON_BAD_MAX_NEW_TOKENS,
    REASON_BAD_PROMPT,
    REASON_BAD_REQUEST,
    REASON_EMPTY_PROMPT,
    REASON_GENERATION,
    REASON_MISSING_ID,
    REASON_MISSING_PROMPT,
    REASON_NOT_AN_OBJECT,
    REASON_TOO_LONG,
    REASON_UNSUPPORTED,
    RecordError,
    record_error,
)
from distributed_spec.jobs.io import (
    InputRecord,
    check_messages,
    check_record_sampling,
    has_lone_surrogate,
    id_key,
    is_int,
)

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
SUPPORTED_URLS = (CHAT_URL, COMPLETIONS_URL)
# The body keys this job reads.
_PROMPT_KEYS = {CHAT_URL: "messages", COMPLETIONS_URL: "prompt"}
_SAMPLING_KEYS = frozenset({"max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "seed"})
# Body keys that do not change which tokens are generated: accepted, not used.
_IGNORED_KEYS = frozenset(
    {
        "model",
        "user",
        "metadata",
        "store",
        "service_tier",
        "stream_options",
        "parallel_tool_calls",
        "safety_identifier",
        "prompt_cache_key",
    }
)
# Body keys accepted only at the value that leaves generation unchanged (null means absent, always).
_NEUTRAL_VALUES: dict[str, tuple[Any, ...]] = {
    "n": (1,),
    "best_of": (1,),
    "stream": (False,),
    "logprobs": (False,),
    "top_logprobs": (0,),
    "echo": (False,),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "logit_bias": ({},),
    "tools": ([],),
    "tool_choice": ("none",),
    "functions": ([],),
    "function_call": ("none",),
    "response_format": ({"type": "text"},),
    "modalities": (["text"],),
    "suffix": ("",),
}
# Error codes of the output's `error` object, by RecordError reason prefix (others: the prefix in snake case).
_ERROR_CODES = {
    REASON_TOO_LONG: "context_length_exceeded",
    REASON_GENERATION: "generation_failed",
    REASON_MISSING_ID: "missing_custom_id",
    REASON_BAD_ID: "invalid_custom_id",
}


def check_request(line: int, row: Any, data: DataConfig) -> InputRecord | RecordError:
    """Validate one decoded request line: custom_id, method, url, then the body."""
    del data  # the Batch API's field names are fixed; data.*_field apply to data.format=records
    if not isinstance(row, dict):
        return record_error(line, None, REASON_NOT_AN_OBJECT, f"got {type(row).__name__}")
    custom_id = row.get("custom_id")
    if custom_id is None:
        return record_error(line, None, REASON_MISSING_ID, "no 'custom_id' field")
    if not isinstance(custom_id, str) or not custom_id or has_lone_surrogate(custom_id):
        return record_error(line, None, REASON_BAD_ID, "'custom_id' must be a non-empty string")
    if row.get("method", "POST") != "POST":
        return record_error(line, custom_id, REASON_BAD_REQUEST, f"method {row.get('method')!r}: only POST")
    url = row.get("url")
    if url not in SUPPORTED_URLS:
        return record_error(
            line, custom_id, REASON_UNSUPPORTED, f"url {url!r}: supported urls are {', '.join(SUPPORTED_URLS)}"
        )
    body = row.get("body")
    if not isinstance(body, dict):
        return record_error(line, custom_id, REASON_BAD_REQUEST, "'body' must be an object")
    body = {key: value for key, value in body.items() if value is not None}
    refusal = _refused_key(url, body)
    if refusal is not None:
        return record_error(line, custom_id, REASON_UNSUPPORTED, refusal)
    checked = _check_prompt(line, custom_id, url, body)
    if isinstance(checked, RecordError):
        return checked
    return _with_sampling(checked, body)


def _refused_key(url: str, body: dict[str, Any]) -> str | None:
    """Why the body cannot be served exactly as asked, or None."""
    known = _SAMPLING_KEYS | _IGNORED_KEYS | {_PROMPT_KEYS[url]}
    for key, value in body.items():
        if key in known:
            continue
        if key in _NEUTRAL_VALUES:
            if not any(_same_value(value, neutral) for neutral in _NEUTRAL_VALUES[key]):
                return f"{key}={value!r} is not supported (only {_NEUTRAL_VALUES[key][0]!r})"
            continue
        return f"parameter {key!r} is not supported"
    return None


def _same_value(value: Any, neutral: Any) -> bool:
    # Booleans are not numbers here: n=true is not n=1.
    return isinstance(value, bool) == isinstance(neutral, bool) and value == neutral


def _check_prompt(line: int, custom_id: str, url: str, body: dict[str, Any]) -> InputRecord | RecordError:
    if url == COMPLETIONS_URL:
        prompt = body.get("prompt")
        if prompt is None:
            return record_error(line, custom_id, REASON_MISSING_PROMPT, "body needs 'prompt'")
        if not isinstance(prompt, str):
            return record_error(line, custom_id, REASON_BAD_PROMPT, "'prompt' must be one string")
        if has_lone_surrogate(prompt):
            return record_error(line, custom_id, REASON_BAD_PROMPT, "not valid Unicode (lone surrogate)")
        if not prompt.strip():
            return record_error(line, custom_id, REASON_EMPTY_PROMPT)
        return InputRecord(line=line, id=custom_id, prompt=prompt)
    messages = body.get("messages")
    if messages is None:
        return record_error(line, custom_id, REASON_MISSING_PROMPT, "body needs 'messages'")
    if isinstance(messages, list):
        turns = []
        for turn, message in enumerate(messages):
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list):
                text = _text_of_parts(content)
                if text is None:
                    return record_error(
                        line, custom_id, REASON_UNSUPPORTED, f"turn {turn}: only text content parts are supported"
                    )
                message = {**message, "content": text}
            turns.append(message)
        messages = turns
    return check_messages(line, custom_id, messages, "messages")


def _text_of_parts(parts: list[Any]) -> str | None:
    """The text of a list of content parts ([{"type": "text", "text": ...}, ...]); None if any is not text."""
    texts = []
    for part in parts:
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            return None
        texts.append(part["text"])
    return "".join(texts)


def _with_sampling(record: InputRecord, body: dict[str, Any]) -> InputRecord | RecordError:
    """The record with the body's own token limit and sampling settings, or the error naming the bad one."""
    line, custom_id = record.line, record.id
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not is_int(max_tokens) or max_tokens < 1):
        return record_error(line, custom_id, REASON_BAD_MAX_NEW_TOKENS, "max_(completion_)tokens must be an integer >= 1")
    sampling = check_record_sampling(line, custom_id, body)
    if isinstance(sampling, RecordError):
        return sampling
    return InputRecord(
        line=line,
        id=custom_id,
        prompt=record.prompt,
        messages=record.messages,
        max_new_tokens=max_tokens,
        sampling=sampling,
    )


def _digest(line: int, custom_id: Any) -> str:
    """Hex id of one request line: the same on every run over the same file."""
    return hashlib.blake2b(f"{line}\n{custom_id}".encode(), digest_size=12).hexdigest()


def response_line(
    record: InputRecord,
    text: str,
    finish_reason: str,
    num_prompt_tokens: int,
    num_completion_tokens: int,
    model: str,
) -> dict[str, Any]:
    """The output line of a served request: a chat.completion (messages) or text_completion (prompt).

    finish_reason: the engine's ("eos", "stop" or "length"); OpenAI's "stop" covers EOS and stop strings.
    """
    digest = _digest(record.line, record.id)
    reason = "length" if finish_reason == "length" else "stop"
    if record.messages is not None:
        message = {"role": "assistant", "content": text, "refusal": None}
        choice = {"index": 0, "message": message, "logprobs": None}
        body = {"id": f"chatcmpl-{digest}", "object": "chat.completion"}
    else:
        choice = {"index": 0, "text": text, "logprobs": None}
        body = {"id": f"cmpl-{digest}", "object": "text_completion"}
    body.update(
        created=int(time.time()),
        model=model,
        choices=[{**choice, "finish_reason": reason}],
        usage={
            "prompt_tokens": num_prompt_tokens,
            "completion_tokens": num_completion_tokens,
            "total_tokens": num_prompt_tokens + num_completion_tokens,
        },
    )
    return {
        "id": f"batch_req_{digest}",
        "custom_id": record.id,
        "response": {"status_code": 200, "request_id": f"req_{digest}", "body": body},
        "error": None,
    }


def error_line(error: RecordError) -> dict[str, Any]:
    """The output line of a refused or failed request (custom_id null when the line had none)."""
    prefix = error.reason.split(": ", 1)[0]
    code = _ERROR_CODES.get(prefix, prefix.lower().replace(" ", "_").replace("-", "_"))
    return {
        "id": f"batch_req_{_digest(error.line, error.id)}",
        "custom_id": error.id,
        "response": None,
        "error": {"code": code, "message": error.reason},
    }


def output_key(line: dict[str, Any]) -> Any:
    """Resume key of an output line: the custom_id's key for a served request (skipped when rerun),
    the line's own id for a final error (kept once), None for a generation failure (redone)."""
    error = line.get("error")
    if error is None:
        return id_key(line["custom_id"]) if "custom_id" in line else None
    if isinstance(error, dict) and error.get("code") == _ERROR_CODES[REASON_GENERATION]:
        return None
    return ("error", line.get("id"))


def num_served(keys: set[Any]) -> int:
    """Served requests among the output_key keys of an output file (error lines have tuple keys)."""
    return sum(1 for key in keys if isinstance(key, str))
