"""The Hydra app: config composition and checks, and end-to-end runs through the real engine.

End-to-end runs use a tiny random pair saved as safetensors directories (tests/jobs/fakes.py), so they
go through the real loader, engine and CLI in a subprocess: a sweep, and a SIGKILL mid-run + resume.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from distributed_spec.config import ConfigError, JobConfig, ParallelConfig
from distributed_spec.hydra_config import CONF_DIR
from tests.jobs.cli_runs import cli, read_jsonl, tiny_args, write_prompts
from tests.jobs.fakes import save_tiny_pair

REPO = Path(__file__).resolve().parents[1]
MODEL_OPTIONS = sorted(path.stem for path in (CONF_DIR / "model").glob("*.yaml"))


def _compose(overrides: list[str]) -> JobConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="generate", overrides=overrides)
    return JobConfig.from_dictconfig(cfg)


@pytest.mark.parametrize("model", MODEL_OPTIONS)
def test_every_model_option_composes(model):
    job = _compose([f"model={model}"])
    assert job.model.name == model


def test_defaults_are_the_embedded_pair_on_the_sample_prompts():
    job = _compose([])
    assert job.model.target.source == "smollm2"
    assert (
        job.model.draft.kind == "distilled" and (Path(job.model.draft.source) / "draft_config.json").is_file()
    )
    assert (job.verifier.method, job.parallel.runtime, job.tracking.mode) == ("block", "local", "offline")
    assert Path(job.data.input_path).name == "sample_prompts.jsonl" and Path(job.data.input_path).is_file()


def test_sample_prompts_are_valid_and_varied():
    records = [json.loads(line) for line in (REPO / "distributed_spec/assets/sample_prompts.jsonl").open()]
    assert len(records) >= 16 and len({record["id"] for record in records}) == len(records)
    assert {record["id"].split("-")[0] for record in records} >= {"chat", "code", "sum"}
    assert any("prompt" in record for record in records) and any("messages" in record for record in records)


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["verifier.num_draft_tokens=0"], "verifier.num_draft_tokens"),
        (["verifier.draft_len_schedule=heuristic"], "verifier.draft_len_schedule"),
        (["verifier.draft_len_schedule=adaptive", "verifier.num_draft_tokens=10"], "verifier.max_draft_len"),
        (["verifier.draft_confidence_threshold=1.0"], "verifier.draft_confidence_threshold"),
        (["verifier.method=beam"], "verifier.method"),
        (["parallel.tp_size=2"], "parallel.runtime"),
        (["parallel=ray", "parallel.wire_dtype=int3"], "parallel.wire_dtype"),
        (["sampling.top_p=0"], "sampling.top_p"),
        (["verifier=greedy"], "sampling.temperature"),
        (["model.target.source=not-a-model"], "model.target.source"),
        (["model.draft.kind=truncated", "model.draft.num_layers=0"], "model.draft.num_layers"),
        (["model.target.kind=distilled"], "model.target.kind"),
        (["data.batch_size=0"], "data.batch_size"),
        (["tracking.mode=cloud"], "tracking.mode"),
        (["+verifier.gama=3"], "verifier.gama"),
        (["verifier.proposer=lookup"], "verifier.proposer"),
        (["verifier=autoregressive", "verifier.proposer=ngram"], "verifier.proposer"),
        (["verifier.proposer=ngram", "verifier.ngram_min=4"], "verifier.ngram_min"),
        (["verifier.num_paths=0"], "verifier.num_paths"),
        (["verifier=token", "verifier.num_paths=2"], "verifier.num_paths"),
        (["verifier=autoregressive", "verifier.num_paths=2"], "verifier.num_paths"),
        (["verifier.num_paths=2", "verifier.draft_confidence_threshold=0.2"], "verifier.num_paths"),
        (["parallel=ray", "parallel.verify=vocab_parallel", "verifier.num_paths=2"], "parallel.verify"),
    ],
)
def test_bad_configuration_names_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        _compose(overrides)


@pytest.mark.parametrize(
    ("overrides", "run_dir_name"),
    [
        ([], "block-dgp4-t0.7-n128-s0"),
        (["verifier.draft_len_schedule=constant"], "block-d4-t0.7-n128-s0"),
        (["verifier.draft_len_schedule=adaptive", "verifier.num_draft_tokens=2", "verifier.max_draft_len=8"], "block-d2a8-t0.7-n128-s0"),
        (["verifier.draft_len_schedule=constant", "verifier.draft_confidence_threshold=0.4"], "block-d4c0.4-t0.7-n128-s0"),
        (["verifier.proposer=ngram"], "block-dgp4-ngram1-3-t0.7-n128-s0"),
        (["verifier.proposer=model+ngram", "verifier.ngram_min=2"], "block-dgp4-model+ngram2-3-t0.7-n128-s0"),
        (["verifier.draft_len_schedule=constant", "verifier.num_paths=4"], "block-d4k4-t0.7-n128-s0"),
    ],
)
def test_run_directory_names_the_draft_length_schedule(overrides, run_dir_name):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="generate", overrides=overrides, return_hydra_config=True)
    assert Path(cfg.hydra.run.dir).name == run_dir_name


def test_parallel_keys_are_the_one_parallel_config():
    # One class for both runtimes (distributed/config.py): every key of conf/parallel/ is a field
    # with the same default, and every field is a key.
    from distributed_spec.distributed.config import ParallelConfig as RuntimeParallelConfig

    assert ParallelConfig is RuntimeParallelConfig
    ours = {field.name: field.default for field in dataclasses.fields(ParallelConfig)}
    keys = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "parallel" / "local.yaml"))
    assert set(keys) == set(ours)
    for name, value in keys.items():
        assert ours[name] == value, name


@pytest.mark.parametrize(
    ("group", "option", "config_class"),
    [
        ("verifier", "block", "VerifierConfig"),
        ("sampling", "default", "SamplingConfig"),
        ("engine", "default", "SchedulingConfig"),
    ],
)
def test_engine_groups_are_the_engines_config_classes(group, option, config_class):
    # conf/<group> is the engine's own class (engine/config.py): its keys are the class's fields,
    # and the job hands the very objects to the engine.
    from distributed_spec.engine import config as engine_config

    fields = {field.name for field in dataclasses.fields(getattr(engine_config, config_class))}
    keys = OmegaConf.to_container(OmegaConf.load(CONF_DIR / group / f"{option}.yaml"))
    assert set(keys) == fields
    job = _compose([])
    config = job.engine_config((7,))
    assert config.verifier is job.verifier and config.sampling is job.sampling and config.scheduling is job.engine
    assert config.max_batch_size == job.data.batch_size and config.eos_token_ids == (7,)


def test_old_draft_length_keys_name_their_new_names():
    for old, new in [
        ("verifier.gamma", "verifier.num_draft_tokens"),
        ("verifier.max_gamma", "verifier.max_draft_len"),
        ("verifier.gamma_schedule", "verifier.draft_len_schedule"),
    ]:
        with pytest.raises(ConfigError, match=f"{old} is now {new}"):
            _compose([f"+{old}=3"])


def test_the_proposer_key_reaches_the_verifier():
    job = _compose(["verifier.proposer=ngram"])
    assert job.verifier.proposer == "ngram" and not job.verifier.uses_draft_model
    assert _compose(["verifier.proposer=model+ngram"]).verifier.uses_draft_model


def test_cli_config_error_is_one_line_and_exit_code_2(tmp_path):
    process = cli(["verifier.num_draft_tokens=0", "parallel.device=cpu", f"hydra.run.dir={tmp_path}"])
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 2, output
    errors = [line for line in output.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and "verifier.num_draft_tokens must be >= 1" in errors[0]
    assert "Traceback" not in output


def test_cli_unknown_model_lists_the_options(tmp_path):
    process = cli(["model=gpt5", f"hydra.run.dir={tmp_path}"])
    output, _ = process.communicate(timeout=120)
    assert process.returncode != 0
    assert "Could not find 'model/gpt5'" in output and "smollm2" in output and "llama3_70b_1b" in output


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    return save_tiny_pair(tmp_path_factory.mktemp("tiny_pair"))


def test_sigkill_mid_run_then_rerun_completes_without_duplicates(tiny_pair, tmp_path):
    num_records = 24
    input_path = tmp_path / "prompts.jsonl"
    write_prompts(input_path, num_records)
    out = tmp_path / "out"
    args = tiny_args(
        tiny_pair,
        input_path,
        f"data.output_dir={out}",
        "data.batch_size=2",
        "data.fsync_every=1",
        "sampling.max_new_tokens=24",
        "sampling.temperature=1.0",
        # A schedule of the row's own history: sampled completions are reproducible record by record.
        "verifier.draft_len_schedule=constant",
        f"hydra.run.dir={tmp_path / 'hydra'}",
    )
    process = cli(args)
    completions = out / "completions.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if completions.exists() and completions.read_bytes().count(b"\n") >= 4:
            break
        time.sleep(0.02)
    assert process.poll() is None, "the job ended before it could be killed:\n" + process.communicate()[0]
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    num_before = completions.read_bytes().count(b"\n")
    assert 4 <= num_before < num_records
    # A SIGKILL can land mid-write: leave a torn line as it would.
    with open(completions, "ab") as file:
        file.write(b'{"id": "r999", "prompt": "torn')

    rerun = cli(args)
    output, _ = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, output
    records = read_jsonl(completions)
    ids = [record["id"] for record in records]
    assert len(ids) == len(set(ids)) == num_records
    assert set(ids) == {f"r{index:03d}" for index in range(num_records)}
    assert all(
        record["completion_ids"] and record["finish_reason"] in ("eos", "stop", "length")
        for record in records
    )
    errors = read_jsonl(out / "errors.jsonl")
    assert len(errors) == 1 and errors[0]["line"] == 7 and errors[0]["reason"].startswith("malformed JSON")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["records_total"] == num_records and summary["records_skipped"] == num_before
    assert summary["errors_total"] == 1
    assert 1.0 <= summary["block_efficiency"] <= 5.0
    # Every record is what an uninterrupted run at another batch size writes, token for token.
    reference_out = tmp_path / "reference"
    reference = cli([*args, f"data.output_dir={reference_out}", "data.batch_size=5"])
    output, _ = reference.communicate(timeout=300)
    assert reference.returncode == 0, output
    expected = {record["id"]: record["completion_ids"] for record in read_jsonl(reference_out / "completions.jsonl")}
    assert {record["id"]: record["completion_ids"] for record in records} == expected


def test_multirun_sweep_writes_one_output_dir_per_run(tiny_pair, tmp_path):
    input_path = tmp_path / "prompts.jsonl"
    write_prompts(input_path, 3)
    sweep_dir = tmp_path / "sweep"
    args = tiny_args(
        tiny_pair,
        input_path,
        "sampling.max_new_tokens=8",
        "tracking.progress=false",
        f"hydra.sweep.dir={sweep_dir}",
    )
    process = cli(["--multirun", *args, "verifier=block,token", "verifier.num_draft_tokens=2,3"])
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    run_dirs = sorted(path.parent for path in sweep_dir.glob("*/completions.jsonl"))
    # Directory names are the overrides minus paths and settings that do not change completions.
    assert [",".join(path.name.split(",")[-2:]) for path in run_dirs] == [
        "verifier.num_draft_tokens=2,verifier=block",
        "verifier.num_draft_tokens=2,verifier=token",
        "verifier.num_draft_tokens=3,verifier=block",
        "verifier.num_draft_tokens=3,verifier=token",
    ]
    assert run_dirs[0].name.startswith("model.draft.kind=dir,model.name=tiny,")
    for run_dir in run_dirs:
        assert len(read_jsonl(run_dir / "completions.jsonl")) == 3
        meta = json.loads((run_dir / "run_meta.json").read_text())
        assert f"verifier.num_draft_tokens={meta['verifier']['num_draft_tokens']}" in run_dir.name
        assert f"verifier={meta['verifier']['method']}" in run_dir.name


def test_ngram_proposer_job_loads_no_draft_and_reports_its_rows(tiny_pair, tmp_path):
    """proposer=ngram: the target alone is loaded; the summary counts the rows served by n-grams."""
    from distributed_spec.jobs.local_generator import LocalGenerator
    from distributed_spec.jobs.runner import run

    input_path = tmp_path / "prompts.jsonl"
    write_prompts(input_path, 4)
    job = _compose(
        tiny_args(
            tiny_pair, input_path, "verifier.proposer=ngram", "sampling=greedy", "sampling.max_new_tokens=24",
            "data.resume=false",
            # Constant blocks: goodput on tiny CPU models decides from wall-clock timings whether
            # n-gram blocks pay, and the counts below need blocks verified.
            "verifier.draft_len_schedule=constant",
        )
    )
    generator = LocalGenerator(job)
    assert generator.engine.draft_runner is None
    summary = run(job, output_dir=tmp_path / "out", generator=generator)
    assert summary["records"] == 4 and summary["proposer/rows_ngram"] > 0
    assert 0 < summary["proposer/accepted_ngram"] < summary["proposer/proposed_ngram"]
    with pytest.raises(ConfigError, match="verifier.proposer=model"):
        generator.reconfigure(_compose(tiny_args(tiny_pair, input_path)))


def test_openai_batch_file_runs_end_to_end(tiny_pair, tmp_path):
    """An OpenAI Batch API file with per-request settings, a malformed line and an unsupported request:
    every request is answered once in the Batch output format; a rerun adds nothing."""
    from tests.jobs.test_openai_batch import assert_batch_output_line, chat_request

    requests = [
        chat_request("greedy", "alpha says", max_tokens=12, temperature=0),
        chat_request("warm", "beta says", max_completion_tokens=9, temperature=0.8, seed=7),
        chat_request("warm-again", "beta says", max_completion_tokens=9, temperature=0.8, seed=7),
        chat_request("nucleus", "g says", max_tokens=16, temperature=1.2, top_p=0.7, stop=["e"]),
        '{"custom_id": "torn", "body": ',
        chat_request("two", "delta", n=2),
        {"custom_id": "text", "method": "POST", "url": "/v1/completions", "body": {"prompt": "echo 5", "max_tokens": 5}},
    ]
    input_path = tmp_path / "batch.jsonl"
    input_path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in requests))
    out = tmp_path / "out"
    args = tiny_args(
        tiny_pair,
        input_path,
        "data.format=openai_batch",
        f"data.output_dir={out}",
        "data.batch_size=3",
        "sampling.max_new_tokens=20",
        "verifier.draft_len_schedule=constant",
        f"hydra.run.dir={tmp_path / 'hydra'}",
    )
    process = cli(args)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    lines = read_jsonl(out / "completions.jsonl")
    for line in lines:
        assert_batch_output_line(line)
    by_id = {line["custom_id"]: line for line in lines}
    assert len(lines) == 7 and set(by_id) == {"greedy", "warm", "warm-again", "nucleus", None, "two", "text"}
    assert by_id[None]["error"]["code"] == "malformed_json" and by_id["two"]["error"]["code"] == "unsupported_request"
    usage = {custom_id: line["response"]["body"]["usage"] for custom_id, line in by_id.items() if line["response"]}
    assert usage["greedy"]["completion_tokens"] <= 12 and usage["warm"]["completion_tokens"] <= 9
    assert usage["text"]["completion_tokens"] <= 5
    assert by_id["text"]["response"]["body"]["object"] == "text_completion"

    def content(custom_id):
        return by_id[custom_id]["response"]["body"]["choices"][0]["message"]["content"]

    # The request's seed is its stream's seed: same messages, settings and seed, same completion.
    assert content("warm") == content("warm-again")
    assert "e" not in content("nucleus")
    errors = read_jsonl(out / "errors.jsonl")
    assert sorted(error["line"] for error in errors) == [5, 6]
    # Rerunning resumes: every custom_id is answered already, nothing is added.
    before = (out / "completions.jsonl").read_bytes()
    rerun = cli(args)
    output, _ = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, output
    assert (out / "completions.jsonl").read_bytes() == before


def test_verify_modes_reach_the_ray_runtime_and_local_refuses_vocab_parallel():
    from distributed_spec.config import ParallelConfig

    assert _compose(["parallel=ray", "parallel.verify=vocab_parallel"]).parallel.verify == "vocab_parallel"
    with pytest.raises(ConfigError, match=r"parallel.verify=vocab_parallel .*parallel=ray"):
        _compose(["parallel.verify=vocab_parallel"])
    with pytest.raises(ConfigError, match="parallel.verify"):
        _compose(["parallel=ray", "parallel.verify=scatter"])
    with pytest.raises(ValueError, match="parallel.verify"):
        ParallelConfig(runtime="ray", verify="scatter")
