"""OpenAI Batch API files: request checks, output lines against the API's schema, the job on a fake
generator (per-request settings reach it, errors answered per request, resume by custom_id)."""

from __future__ import annotations

import json

import pytest

from distributed_spec.config import (
    ConfigError,
    DataConfig,
    JobConfig,
    SamplingConfig,
    TrackingConfig,
    VerifierConfig,
)
from distributed_spec.jobs.errors import RecordError, record_error
from distributed_spec.jobs.io import InputRecord, RecordSampling, read_records
from distributed_spec.jobs.openai_batch import check_request, error_line, output_key, response_line
from distributed_spec.jobs.runner import run
from tests.jobs.fakes import FakeGenerator

CHAT = "/v1/chat/completions"


def chat_request(custom_id: str, content: str = "hi there", **body) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": CHAT,
        "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}], **body},
    }


# Required fields and their types, from the OpenAI API's OpenAPI description (BatchRequestOutput,
# CreateChatCompletionResponse, CreateCompletionResponse, CompletionUsage).
_NULLABLE_STR = (str, type(None))


def assert_batch_output_line(line: dict) -> None:
    assert set(line) == {"id", "custom_id", "response", "error"}
    assert isinstance(line["id"], str) and line["id"]
    if line["error"] is not None:
        assert line["response"] is None
        assert isinstance(line["error"]["code"], str) and isinstance(line["error"]["message"], str)
        return
    response = line["response"]
    assert isinstance(line["custom_id"], str)
    assert response["status_code"] == 200 and isinstance(response["request_id"], str)
    body = response["body"]
    assert isinstance(body["id"], str) and isinstance(body["created"], int) and isinstance(body["model"], str)
    assert body["object"] in ("chat.completion", "text_completion")
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] in ("stop", "length") and "logprobs" in choice
    if body["object"] == "chat.completion":
        message = choice["message"]
        assert message["role"] == "assistant" and isinstance(message["content"], _NULLABLE_STR)
        assert "refusal" in message
    else:
        assert isinstance(choice["text"], str)
    usage = body["usage"]
    assert all(isinstance(usage[key], int) for key in ("prompt_tokens", "completion_tokens", "total_tokens"))
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def check(row) -> InputRecord | RecordError:
    return check_request(1, row, DataConfig())


def test_a_chat_request_with_every_sampling_key():
    record = check(
        chat_request(
            "q1", max_completion_tokens=7, max_tokens=99, temperature=0.5, top_p=0.9, stop="\n", seed=42,
            n=1, stream=False, presence_penalty=0, logprobs=None, user="u", metadata={"a": "b"},
        )
    )
    assert isinstance(record, InputRecord)
    assert record.id == "q1" and record.messages == [{"role": "user", "content": "hi there"}]
    # max_completion_tokens wins over the deprecated max_tokens.
    assert record.max_new_tokens == 7
    assert record.sampling == RecordSampling(temperature=0.5, top_p=0.9, seed=42, stop=("\n",))


def test_completions_and_text_content_parts():
    record = check({"custom_id": "c", "method": "POST", "url": "/v1/completions", "body": {"prompt": "Once", "max_tokens": 3}})
    assert isinstance(record, InputRecord) and record.prompt == "Once" and record.messages is None
    assert record.max_new_tokens == 3 and record.sampling == RecordSampling()
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    record = check(chat_request("p", content=parts))
    assert isinstance(record, InputRecord) and record.messages[0]["content"] == "ab"


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ("[1, 2]", "record is not a JSON object"),
        ({"method": "POST", "url": CHAT, "body": {}}, "missing id"),
        ({**chat_request("x"), "custom_id": 3}, "invalid id"),
        ({**chat_request("x"), "method": "GET"}, "invalid request: method"),
        ({**chat_request("x"), "url": "/v1/embeddings"}, "unsupported request: url '/v1/embeddings'"),
        ({**chat_request("x"), "body": "hi"}, "invalid request"),
        (chat_request("x", n=2), "unsupported request: n=2"),
        (chat_request("x", n=True), "unsupported request: n=True"),
        (chat_request("x", logprobs=True), "unsupported request: logprobs=True"),
        (chat_request("x", logit_bias={"50256": -100}), "unsupported request: logit_bias"),
        (chat_request("x", frequency_penalty=0.5), "unsupported request: frequency_penalty=0.5"),
        (chat_request("x", top_k=5), "unsupported request: parameter 'top_k'"),
        (chat_request("x", content=[{"type": "image_url", "image_url": {"url": "x"}}]), "unsupported request"),
        (chat_request("x", content="  "), "empty prompt"),
        (chat_request("x", max_tokens=0), "invalid max_new_tokens"),
        (chat_request("x", temperature=-1), "invalid sampling settings: temperature"),
        (chat_request("x", temperature="hot"), "invalid sampling settings: temperature"),
        (chat_request("x", top_p=0), "invalid sampling settings: top_p"),
        (chat_request("x", stop=[""]), "invalid sampling settings: stop"),
        (chat_request("x", seed=1.5), "invalid sampling settings: seed"),
        ({"custom_id": "x", "url": "/v1/completions", "body": {"prompt": ["a", "b"]}}, "invalid prompt"),
        ({"custom_id": "x", "url": CHAT, "body": {"model": "m"}}, "missing prompt"),
    ],
)
def test_bad_requests_are_refused_with_a_reason(row, reason):
    error = check(json.loads(row) if isinstance(row, str) else row)
    assert isinstance(error, RecordError) and error.reason.startswith(reason), error


def test_output_lines_follow_the_batch_schema():
    chat = InputRecord(line=3, id="q1", messages=[{"role": "user", "content": "hi"}])
    line = response_line(chat, "hello", "eos", num_prompt_tokens=5, num_completion_tokens=2, model="tiny")
    assert_batch_output_line(line)
    body = line["response"]["body"]
    assert body["choices"][0]["message"]["content"] == "hello" and body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    assert line["custom_id"] == "q1" and line["id"].startswith("batch_req_") and body["model"] == "tiny"
    # The same request gets the same ids on every run (resume writes what the first run would have).
    assert response_line(chat, "x", "length", 5, 4, "tiny")["id"] == line["id"]
    text = response_line(InputRecord(line=4, id="c", prompt="Once"), " upon", "length", 1, 1, "tiny")
    assert_batch_output_line(text)
    assert text["response"]["body"]["choices"][0]["text"] == " upon"
    assert text["response"]["body"]["choices"][0]["finish_reason"] == "length"
    error = error_line(record_error(7, "q9", "unsupported request", "n=2 is not supported (only 1)"))
    assert_batch_output_line(error)
    assert error["error"] == {"code": "unsupported_request", "message": "unsupported request: n=2 is not supported (only 1)"}
    assert error_line(record_error(8, "q8", "prompt over the context length", "9 tokens"))["error"]["code"] == (
        "context_length_exceeded"
    )
    # A round trip through JSON keeps every field, and resume keys tell the kinds of line apart.
    assert json.loads(json.dumps(line)) == line
    assert output_key(line) == '"q1"' and output_key(error) == ("error", error["id"])
    assert output_key(error_line(record_error(9, "q7", "generation failed", "boom"))) is None


def test_duplicate_custom_ids_are_refused(tmp_path):
    path = tmp_path / "batch.jsonl"
    path.write_text("\n".join(json.dumps(chat_request(cid)) for cid in ("a", "b", "a")) + "\n")
    records = list(read_records(path, DataConfig(format="openai_batch"), check_request))
    assert [type(record).__name__ for record in records] == ["InputRecord", "InputRecord", "RecordError"]
    assert records[2].reason == "duplicate id: first seen on line 1"


BATCH = [
    chat_request("chat-1", "hello", max_tokens=3, temperature=0.0),
    chat_request("chat-2", "bye", max_completion_tokens=2, temperature=1.3, top_p=0.5, seed=9, stop=["zz"]),
    "{not json",
    chat_request("chat-3", "again", n=3),
    {"custom_id": "text-1", "method": "POST", "url": "/v1/completions", "body": {"prompt": "abc"}},
    chat_request("chat-4", "x" * 80),  # over the fake's 64-token context
]


def _job(tmp_path, **sampling) -> JobConfig:
    input_path = tmp_path / "batch.jsonl"
    if not input_path.exists():
        input_path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in BATCH))
    return JobConfig(
        verifier=VerifierConfig(method=sampling.pop("method", "block"), num_draft_tokens=2),
        sampling=SamplingConfig(max_new_tokens=4, **sampling),
        data=DataConfig(
            input_path=str(input_path), output_dir=str(tmp_path / "out"), format="openai_batch", batch_size=2, fsync_every=1
        ),
        tracking=TrackingConfig(mode="disabled", progress=False),
    )


def _lines(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_the_job_answers_every_request_in_the_batch_format(tmp_path):
    generator = FakeGenerator()
    summary = run(_job(tmp_path), generator=generator)
    out = tmp_path / "out"
    lines = _lines(out / "completions.jsonl")
    for line in lines:
        assert_batch_output_line(line)
    by_id = {line["custom_id"]: line for line in lines}
    assert len(lines) == 6 and set(by_id) == {"chat-1", "chat-2", None, "chat-3", "text-1", "chat-4"}
    assert by_id["chat-3"]["error"]["code"] == "unsupported_request"
    assert by_id[None]["error"]["code"] == "malformed_json"
    assert by_id["chat-4"]["error"]["code"] == "context_length_exceeded"
    chat = by_id["chat-1"]["response"]["body"]
    assert chat["object"] == "chat.completion" and chat["choices"][0]["message"]["content"] == "user"
    assert by_id["text-1"]["response"]["body"]["choices"][0]["text"] == "abc"
    # Each request's own settings reach the generator; unset ones stay the job's (None here).
    items = {item.handle.record.id: item for item in generator.items}
    assert items["chat-1"].max_new_tokens == 3 and items["chat-1"].sampling == RecordSampling(temperature=0.0)
    assert items["chat-2"].sampling == RecordSampling(temperature=1.3, top_p=0.5, seed=9, stop=("zz",))
    assert items["text-1"].max_new_tokens is None and items["text-1"].sampling == RecordSampling()
    # Bad requests also go to errors.jsonl, as in the job's own format.
    errors = {error["line"]: error["reason"] for error in _lines(out / "errors.jsonl")}
    assert sorted(errors) == [3, 4, 6] and errors[4].startswith("unsupported request: n=3")
    assert summary["records"] == 3 and summary["errors"] == 3


def test_resume_skips_answered_custom_ids(tmp_path):
    run(_job(tmp_path), generator=FakeGenerator())
    out = tmp_path / "out" / "completions.jsonl"
    lines = out.read_bytes().splitlines(keepends=True)
    served = [index for index, raw in enumerate(lines) if b'"error": null' in raw]
    # As after a SIGKILL: the last served line half written.
    out.write_bytes(b"".join(lines[: served[-1]]) + lines[served[-1]][:20])
    generator = FakeGenerator()
    summary = run(_job(tmp_path), generator=generator)
    final = _lines(out)
    assert sorted(str(line["custom_id"]) for line in final) == sorted(
        ["chat-1", "chat-2", "None", "chat-3", "text-1", "chat-4"]
    )
    assert [item.handle.record.id for item in generator.items] == [_lines(out)[-1]["custom_id"]]
    assert summary["records"] == 1 and summary["records_total"] == 3 and summary["errors_total"] == 3


def test_a_sampled_request_under_the_greedy_verifier_is_refused(tmp_path):
    summary = run(_job(tmp_path, method="greedy", temperature=0.0), generator=FakeGenerator())
    errors = _lines(tmp_path / "out" / "errors.jsonl")
    assert any(e["id"] == "chat-2" and e["reason"].startswith("invalid sampling settings") for e in errors)
    assert summary["records"] == 2


def test_openai_batch_reads_jsonl_only():
    with pytest.raises(ConfigError, match="data.format=openai_batch"):
        DataConfig(input_path="batch.parquet", format="openai_batch")
    with pytest.raises(ConfigError, match="data.format"):
        DataConfig(format="csv")
