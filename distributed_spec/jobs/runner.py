"""One generation job: records in, completions out, as records finish (the job's loop).

    from distributed_spec.jobs.runner import run
    summary = run(JobConfig.from_dictconfig(cfg))        # what `python -m distributed_spec.generate` does

`run` checks the job (input, devices, runtime, vocabularies) before loading anything, resumes from
what its output directory already holds (jobs/resume.py), builds the Generator of `parallel.runtime`
(jobs/local_generator.py, jobs/ray_generator.py, jobs/replicas.py) and hands the records to a
`JobRunner`, which writes completions.jsonl and errors.jsonl as records finish, tracks metrics
(W&B, console) and writes summary.json at the end.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distributed_spec.config import ConfigError, JobConfig, check_devices
from distributed_spec.jobs import openai_batch
from distributed_spec.jobs.errors import (
    REASON_BAD_SAMPLING,
    REASON_GENERATION,
    REASON_TOKENIZER,
    REASON_TOO_LONG,
    RecordError,
    record_error,
)
from distributed_spec.jobs.generator import GenerationItem, Generator
from distributed_spec.jobs.io import InputRecord, JsonlAppender, check_record, id_key, read_records
from distributed_spec.jobs.resume import check_run_meta, reset_outputs, scan_jsonl
from distributed_spec.models.pair import check_declared_pair
from distributed_spec.tracking import rank_zero_logger
from distributed_spec.tracking.metrics import RunMetrics, record_stats
from distributed_spec.tracking.progress import Progress, print_summary
from distributed_spec.tracking.trackers import Tracker, build_tracker

logger = rank_zero_logger(__name__)

COMPLETIONS_NAME = "completions.jsonl"
ERRORS_NAME = "errors.jsonl"
SUMMARY_NAME = "summary.json"


def check_runtime_available(job: JobConfig) -> None:
    """Fail before loading anything when the chosen runtime is not part of this installation."""
    module = {"local": "distributed_spec.engine", "ray": "distributed_spec.distributed.coordinator"}[
        job.parallel.runtime
    ]
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        raise ConfigError(
            f"parallel.runtime={job.parallel.runtime} is not available yet ({module} is missing); "
            "use parallel.runtime=local"
        )


def build_generator(job: JobConfig) -> Generator:
    """Load the pair for `job.parallel.runtime`; the runtime modules are imported only here."""
    check_runtime_available(job)
    if job.parallel.runtime == "local":
        from distributed_spec.jobs.local_generator import LocalGenerator

        return LocalGenerator(job)
    if job.parallel.num_replicas != 1:
        # Data-parallel replicas of the runtime, one work queue (jobs/replicas.py).
        from distributed_spec.jobs.replicas import ReplicaPool

        return ReplicaPool(job)
    from distributed_spec.jobs.ray_generator import RayGenerator

    return RayGenerator(job)


@dataclass
class OutputPaths:
    """The files of one run directory."""

    root: Path

    @property
    def completions(self) -> Path:
        return self.root / COMPLETIONS_NAME

    @property
    def errors(self) -> Path:
        return self.root / ERRORS_NAME

    @property
    def summary(self) -> Path:
        return self.root / SUMMARY_NAME


@dataclass
class PendingRecord:
    """A valid record, tokenised, waiting for its batch."""

    record: InputRecord
    # The text fed to the model (after the chat template for `messages`).
    prompt_text: str
    # [num_prompt_tokens]
    prompt_ids: list[int]


def fingerprint(job: JobConfig) -> dict[str, Any]:
    """The settings that decide what a completion is; resuming with others is refused."""
    settings = job.to_dict()
    data = settings["data"]
    verifier = settings["verifier"]
    if verifier["proposer"] == "model":
        # With the draft model the n-gram keys change nothing, and runs from before they existed resume.
        verifier = {key: value for key, value in verifier.items() if key not in ("proposer", "ngram_min", "ngram_max")}
    return {
        "model": {key: settings["model"][key] for key in ("target", "draft", "tokenizer", "dtype")},
        "verifier": verifier,
        "sampling": settings["sampling"],
        "input_path": str(Path(data["input_path"]).expanduser().resolve()),
        "format": data["format"],
        "fields": [data["id_field"], data["prompt_field"], data["messages_field"]],
        "chat_template_for_prompts": data["chat_template_for_prompts"],
    }


def default_output_dir() -> Path:
    """The Hydra run directory when Hydra runs this job, else the working directory."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path.cwd()


def check_job(job: JobConfig) -> None:
    """Every start-time check that needs no model: input file, devices, runtime, and the pair as its
    config.json files declare it (vocabularies, context)."""
    job.data.check_input_exists()
    check_devices(job.parallel)
    check_runtime_available(job)
    check_declared_pair(job.model, with_draft=job.verifier.uses_draft_model)


def render_prompt(
    record: InputRecord, tokenizer: Any, chat_template_for_prompts: bool
) -> tuple[str, list[int]]:
    """Prompt text and ids: chat `messages` (and plain prompts, if asked) go through the chat template."""
    if record.messages is not None or chat_template_for_prompts:
        messages = record.messages or [{"role": "user", "content": record.prompt}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        # The template already holds the special tokens (BOS, role markers).
        return text, list(tokenizer.encode(text, add_special_tokens=False))
    assert record.prompt is not None
    return record.prompt, list(tokenizer.encode(record.prompt))


def cut_at_stop(text: str, stop: list[str]) -> str:
    """The completion text up to (not including) the first stop string."""
    cut = min((index for index in (text.find(s) for s in stop) if index >= 0), default=len(text))
    return text[:cut]


# What `JobRunner.prepare` yields for records that need no work: already completed, or already
# recorded in errors.jsonl by an earlier run.
_DONE = "done"
_KNOWN_ERROR = "known error"
# Generation failures in a row (no success between) after which the runtime is taken as broken.
MAX_CONSECUTIVE_FAILURES = 8


class _InputFailure(Exception):
    """Reading the input failed (not generation): the job stops with the original error."""


class JobRunner:
    """One run: streams records through the generator, writes outputs as they finish, tracks metrics."""

    def __init__(self, job: JobConfig, generator: Generator, tracker: Tracker, paths: OutputPaths) -> None:
        self.job = job
        self.generator = generator
        self.tracker = tracker
        self.paths = paths
        self.metrics = RunMetrics(replicas=getattr(generator, "replica_metrics", None))
        self.samples: list[tuple[Any, ...]] = []
        self.num_consecutive_failures = 0
        self.num_skipped = 0
        self.num_logged = 0

    def prepare(self, records: Iterator[Any], done_ids: set[str], error_lines: set[int]) -> Iterator[Any]:
        """Skip finished work; tokenise; turn tokenizer and length failures into errors."""
        max_context_len = self.generator.max_context_len
        for item in records:
            if isinstance(item, InputRecord):
                if id_key(item.id) in done_ids:
                    yield _DONE
                    continue
                refusal = self._sampling_refusal(item)
                if refusal is not None:
                    yield _KNOWN_ERROR if item.line in error_lines else refusal
                    continue
                try:
                    text, ids = render_prompt(
                        item, self.generator.tokenizer, self.job.data.chat_template_for_prompts
                    )
                except Exception as err:  # any tokenizer failure is this record's problem only
                    item = record_error(item.line, item.id, REASON_TOKENIZER, f"{type(err).__name__}: {err}")
                else:
                    # Prompts that leave room for fewer than max_new_tokens still run (shorter budget).
                    if len(ids) < max_context_len:
                        yield PendingRecord(item, text, ids)
                        continue
                    item = record_error(
                        item.line,
                        item.id,
                        REASON_TOO_LONG,
                        f"{len(ids)} tokens, the context holds {max_context_len} (model.max_context_len)",
                    )
            yield _KNOWN_ERROR if item.line in error_lines else item

    def _sampling_refusal(self, record: InputRecord) -> RecordError | None:
        """The error of a record whose own sampling settings the job's verifier cannot serve, or None."""
        temperature = record.sampling.temperature
        if self.job.verifier.method == "greedy" and temperature is not None and temperature > 0:
            return record_error(
                record.line,
                record.id,
                REASON_BAD_SAMPLING,
                f"temperature {temperature} needs a sampling verifier (verifier=block), not verifier=greedy",
            )
        return None

    def run(
        self, records: Iterator[Any], done_ids: set[str], error_lines: set[int], progress: Progress
    ) -> int:
        """Process every record; returns how many were skipped as already finished."""
        self.progress = progress
        with JsonlAppender(self.paths.completions) as completions, JsonlAppender(self.paths.errors) as errors:
            self.completions, self.errors = completions, errors
            pending = self._pending(self.prepare(records, done_ids, error_lines))
            finished = False
            while not finished:
                # Records handed to the generator and not finished yet, by object identity.
                in_flight: dict[int, PendingRecord] = {}
                try:
                    for pending_record, result in self.generator.stream(self._items(pending, in_flight)):
                        del in_flight[id(pending_record)]
                        self._write_completion(pending_record, result)
                    finished = True
                except _InputFailure as failure:
                    raise failure.__cause__ from None
                except Exception as err:
                    from distributed_spec.engine.executor import is_out_of_memory  # noqa: PLC0415 - torch

                    if is_out_of_memory(err):
                        # The scheduler already retried at half the rows: these records fail as they are.
                        logger.warning("out of memory with %d record(s) in flight: %s", len(in_flight), err)
                        for pending_record in in_flight.values():
                            self._write_generation_error(pending_record, err)
                        self._count_failure(err)
                        continue
                    logger.warning(
                        "generation failed with %d record(s) in flight; retrying them one by one",
                        len(in_flight),
                        exc_info=True,
                    )
                    if not in_flight:
                        self._count_failure(err)
                    self._retry_one_by_one(list(in_flight.values()))
                finally:
                    self.metrics.close_stream(self.generator.stats)
        if self.metrics.num_records and self.metrics.num_records != self.num_logged * self._records_per_log:
            self.tracker.log(self.metrics.snapshot(), step=self.metrics.num_records)
        return self.num_skipped

    @property
    def _records_per_log(self) -> int:
        return self.job.tracking.log_every * self.job.data.batch_size

    def _pending(self, prepared: Iterator[Any]) -> Iterator[PendingRecord]:
        """The records to generate; skipped and bad records are counted and written on the way."""
        for item in prepared:
            if item is _DONE:
                self.num_skipped += 1
            elif item is _KNOWN_ERROR:
                continue
            elif isinstance(item, PendingRecord):
                yield item
            else:
                self._write_error(item)
                self.metrics.num_errors += 1
                self.progress.update(1, self.metrics)
                self._maybe_sync()

    def _items(self, pending: Iterator[PendingRecord], in_flight: dict[int, PendingRecord]) -> Iterator[GenerationItem]:
        """Generation items of the pending records, registering each as in flight when it is taken."""
        while True:
            try:
                pending_record = next(pending, None)
            except Exception as err:
                raise _InputFailure() from err
            if pending_record is None:
                return
            in_flight[id(pending_record)] = pending_record
            yield self._item(pending_record)

    def _item(self, pending_record: PendingRecord) -> GenerationItem:
        return GenerationItem(
            handle=pending_record,
            prompt_ids=pending_record.prompt_ids,
            seed_key=id_key(pending_record.record.id),
            max_new_tokens=pending_record.record.max_new_tokens,
            sampling=pending_record.record.sampling,
        )

    def _retry_one_by_one(self, pending_records: list[PendingRecord]) -> None:
        """Each record alone: one bad record must not cost the others; failures become its error."""
        for pending_record in pending_records:
            try:
                for _, result in self.generator.stream([self._item(pending_record)]):
                    self._write_completion(pending_record, result)
            except Exception as err:
                self._write_generation_error(pending_record, err)
                self._count_failure(err)
            finally:
                self.metrics.close_stream(self.generator.stats)

    def _write_error(self, error: RecordError) -> None:
        """errors.jsonl always; the OpenAI batch output also answers every request, bad ones included."""
        self.errors.write(error.to_json())
        if self.job.data.format == "openai_batch":
            self.completions.write(openai_batch.error_line(error))

    def _write_generation_error(self, pending_record: PendingRecord, err: Exception) -> None:
        """The record failed to generate: its error line, with the exception."""
        record = pending_record.record
        self._write_error(record_error(record.line, record.id, REASON_GENERATION, f"{type(err).__name__}: {err}"))
        self.metrics.num_errors += 1
        self.progress.update(1, self.metrics)

    def _count_failure(self, err: Exception) -> None:
        self.num_consecutive_failures += 1
        if self.num_consecutive_failures >= MAX_CONSECUTIVE_FAILURES:
            self.errors.sync()
            raise RuntimeError(
                f"generation failed {self.num_consecutive_failures} times in a row "
                f"(last: {type(err).__name__}: {err}); the runtime looks broken: fix it and rerun to resume "
                "(records that failed to generate are retried)"
            ) from err

    def _write_completion(self, pending_record: PendingRecord, result: Any) -> None:
        self.num_consecutive_failures = 0
        self.completions.write(self._output_record(pending_record, result))
        self.metrics.add_record(len(pending_record.prompt_ids))
        self.metrics.live = self.generator.stats
        self._maybe_sync()
        self.progress.update(1, self.metrics)
        if self.metrics.num_records // self._records_per_log > self.num_logged:
            self.num_logged = self.metrics.num_records // self._records_per_log
            self.tracker.log(self.metrics.snapshot(), step=self.metrics.num_records)

    def _maybe_sync(self) -> None:
        """fsync both outputs once either holds data.fsync_every unsynced records."""
        threshold = self.job.data.fsync_every
        if self.completions.num_unsynced >= threshold or self.errors.num_unsynced >= threshold:
            self.completions.sync()
            self.errors.sync()

    def _output_record(self, pending: PendingRecord, result: Any) -> dict[str, Any]:
        record = pending.record
        text = self.generator.tokenizer.decode(result.token_ids, skip_special_tokens=True)
        stop = self.job.sampling.stop if record.sampling.stop is None else list(record.sampling.stop)
        text = cut_at_stop(text, stop)
        stats = record_stats(result)
        if len(self.samples) < self.job.tracking.num_samples:
            self.samples.append(
                (
                    str(record.id),
                    pending.prompt_text,
                    text,
                    result.finish_reason,
                    len(result.token_ids),
                    stats["block_efficiency"],
                )
            )
        if self.job.data.format == "openai_batch":
            return openai_batch.response_line(
                record,
                text,
                result.finish_reason,
                num_prompt_tokens=len(pending.prompt_ids),
                num_completion_tokens=len(result.token_ids),
                model=self.job.model.name,
            )
        output: dict[str, Any] = {"id": record.id, "prompt": pending.prompt_text}
        if record.messages is not None:
            output["messages"] = record.messages
        output.update(
            completion=text,
            completion_ids=list(result.token_ids),
            finish_reason=result.finish_reason,
            num_prompt_tokens=len(pending.prompt_ids),
            stats=stats,
        )
        return output


def count_input_records(path: str, limit: int | None) -> int:
    """Records in the input (non-blank JSONL lines, Parquet rows): the progress bar's total."""
    if Path(path).suffix == ".parquet":
        import pyarrow.parquet as pq

        total = pq.ParquetFile(Path(path).expanduser()).metadata.num_rows
    else:
        with open(Path(path).expanduser(), "rb") as file:
            total = sum(1 for raw in file if raw.strip())
    return total if limit is None else min(total, limit)


def _limited(records: Iterator[Any], limit: int | None) -> Iterator[Any]:
    for index, item in enumerate(records):
        if limit is not None and index >= limit:
            return
        yield item


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
    os.replace(partial, path)


def _completion_key(record: dict[str, Any]) -> str | None:
    return id_key(record["id"]) if "id" in record else None


def _final_error_line(error: dict[str, Any]) -> int | None:
    return None if str(error.get("reason", "")).startswith(REASON_GENERATION) else error.get("line")


def run(job: JobConfig, output_dir: Path | None = None, generator: Generator | None = None) -> dict[str, Any]:
    """Run the job; returns the summary. `generator` replaces the configured runtime (tests)."""
    if job.parallel.plan_only:
        # The placement alone (parallel.plan_*): nothing is loaded or written.
        from distributed_spec.plan import plan_text

        print(plan_text(job))
        return {}
    check_job(job)
    paths = OutputPaths(
        Path(job.data.output_dir) if job.data.output_dir else output_dir or default_output_dir()
    )
    if not job.data.resume:
        reset_outputs([paths.completions, paths.errors, paths.summary])
    check_run_meta(paths.root, fingerprint(job), job.data.resume)
    openai_format = job.data.format == "openai_batch"
    done = scan_jsonl(paths.completions, openai_batch.output_key if openai_format else _completion_key)
    # Completions done (the OpenAI batch output also holds the error lines, counted as errors).
    num_done = openai_batch.num_served(done.keys) if openai_format else done.num_records
    # Input errors are final; generation failures are dropped from errors.jsonl and retried.
    errors_done = scan_jsonl(paths.errors, _final_error_line)
    if num_done or errors_done.num_records:
        logger.info(
            "resuming in %s: %d records done, %d errors recorded",
            paths.root,
            num_done,
            errors_done.num_records,
        )
    config = job.to_dict()
    verifier = job.verifier
    tags = [job.model.name, verifier.method, verifier.describe_draft_len(), job.parallel.runtime]
    tracker = build_tracker(job.tracking, paths.root, config, tags)
    exit_code = 1  # until the run returns: a crashed job's W&B run is marked failed
    try:
        if generator is None:
            logger.info(
                "loading %s (target %s, draft %s)",
                job.model.name,
                job.model.target.source,
                job.model.draft.source,
            )
            generator = build_generator(job)
        total = count_input_records(job.data.input_path, job.data.limit)
        initial = min(num_done + errors_done.num_records, total)
        progress = Progress(total=total, initial=initial, enabled=job.tracking.progress)
        runner = JobRunner(job, generator, tracker, paths)
        check = openai_batch.check_request if openai_format else check_record
        records = _limited(read_records(job.data.input_path, job.data, check), job.data.limit)
        try:
            num_skipped = runner.run(records, done.keys, errors_done.keys, progress)
        finally:
            progress.close()
        summary = runner.metrics.snapshot()
        summary.update(
            records_total=num_done + runner.metrics.num_records,
            records_skipped=num_skipped,
            errors_total=errors_done.num_records + runner.metrics.num_errors,
            acceptance_per_position=runner.metrics.engine.acceptance_per_position,
            steps_per_draft_len=list(runner.metrics.engine.num_steps_per_draft_len),
            num_paths=job.verifier.num_paths,
            output_dir=str(paths.root),
        )
        _write_json(paths.summary, summary)
        tracker.log_samples(runner.samples)
        tracker.summary({key: value for key, value in summary.items() if not isinstance(value, list)})
        print_summary(summary, title=f"{job.model.name} {job.verifier.method} {job.verifier.describe_draft_len()}")
        logger.info(
            "done: %d records (%d in output), %d errors, %.1f tokens/s, block efficiency %.3f -> %s",
            summary["records"],
            summary["records_total"],
            summary["errors"],
            summary["tokens_per_s"],
            summary["block_efficiency"],
            paths.root,
        )
        exit_code = 0
        return summary
    finally:
        tracker.finish(exit_code)
        if generator is not None:
            generator.close()
