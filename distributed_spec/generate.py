"""Offline generation with speculative decoding: JSONL (or Parquet) prompts in, completions out.

    python -m distributed_spec.generate                                   # sample prompts, SmolLM2 pair
    python -m distributed_spec.generate data.input_path=prompts.jsonl sampling.max_new_tokens=256
    python -m distributed_spec.generate --multirun verifier=block,token verifier.num_draft_tokens=2,4,8
    distributed-spec-generate parallel=ray parallel.tp_size=2            # the console script

A Hydra app over conf/ (groups: model, parallel, verifier, engine, sampling, data, tracking; every value can
be overridden on the command line). Each run writes to its own directory (`data.output_dir`, by
default the Hydra run directory, named after the settings that change completions):

- completions.jsonl: one line per finished record: id, prompt, completion, completion_ids,
  finish_reason, stats. Written as records finish (continuous batching: `data.batch_size` rows decode
  at once and a finished row's place goes to the next record), fsynced every `data.fsync_every`.
- errors.jsonl: one line per bad record (line, id, reason); bad input never stops the job.
- with data.format=openai_batch the input is an OpenAI Batch API file and completions.jsonl holds
  the Batch API's output lines instead, one per request, bad ones included (jobs/openai_batch.py).
- summary.json, run_meta.json, .hydra/ (the resolved config), wandb/ (offline W&B run).

Rerunning the same command resumes: finished ids are skipped and a torn last line is repaired, so
the output ends complete and without duplicates (jobs/resume.py). Bad configuration fails at start,
before any model is loaded, with one message naming the key to change.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import hydra
from omegaconf import DictConfig

from distributed_spec.config import ConfigError, JobConfig
from distributed_spec.hydra_config import CONF_DIR
from distributed_spec.jobs.runner import run
from distributed_spec.tracking import rank_zero_logger

logger = rank_zero_logger(__name__)


@hydra.main(config_path=str(CONF_DIR), config_name="generate", version_base="1.3")
def main(cfg: DictConfig) -> dict[str, Any]:
    try:
        job = JobConfig.from_dictconfig(cfg)
        logging.getLogger("distributed_spec").setLevel(job.log_level)
        return run(job)
    except ConfigError as err:
        # One clear line, no traceback: the message names the key to change.
        logger.error("configuration error: %s", err)
        sys.exit(2)


if __name__ == "__main__":
    main()
