"""Replicas against threads on the same cores: (a) 2 replicas x TP = 1, one torch thread per actor,
against (b) 1 replica, two threads per actor; same records, same settings, real jobs.

    python -m scripts.bench_replicas                              # SmolLM2 pair, 64 records (docs/RESULTS.md)
    python -m scripts.bench_replicas --tiny --num-records 8 --max-new-tokens 8 --out /tmp/bench   # smoke test

Each configuration is a whole job (`distributed_spec.jobs.runner.run`: input file, tokenizer, scheduler,
completions.jsonl); tokens/s is the job's own figure (generated tokens over its wall clock, loading
excluded). Records: the benchmark chat prompts (distributed_spec/assets/bench_prompts.jsonl, cycled).
The verifier's draft length is constant by default so that sampled completions depend on the record
alone (per-record seeding) and the two configurations must write identical completions; the script
checks that. Ray starts here with 4 logical CPUs (both configurations reserve 4 one-thread or two
two-thread bundles on the machine's cores). Writes results.json into --out.

--rounds N runs the two configurations N times, taking turns (a, b, a, b, ...), so that a slow spell of
a shared host falls on both: each round's ratio, and their mean, are reported; every run's completions
must equal the first run's.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path

from distributed_spec.config import (
    DataConfig,
    JobConfig,
    ModelConfig,
    ModelSpec,
    ParallelConfig,
    SamplingConfig,
    TrackingConfig,
    VerifierConfig,
)
from scripts.common import read_bench_prompts

# name -> (num_replicas, torch threads per actor)
CONFIGS = {"2 replicas x 1 thread": (2, 1), "1 replica x 2 threads": (1, 2)}


def write_records(path: Path, num_records: int) -> None:
    prompts = read_bench_prompts()
    with open(path, "w", encoding="utf-8") as file:
        for index in range(num_records):
            record = dict(prompts[index % len(prompts)])
            record["id"] = f"b{index:03d}"
            file.write(json.dumps(record) + "\n")


def model_config(tiny: bool, root: Path, dtype: str) -> ModelConfig:
    if not tiny:
        # conf/model/smollm2.yaml's pair as the job composes it: the embedded target and its distilled
        # draft (ModelConfig()'s own fallback draft is the truncated target, which keeps few tokens).
        from hydra import compose, initialize_config_dir

        from distributed_spec.hydra_config import CONF_DIR

        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            config = compose(config_name="generate", overrides=[f"model.dtype={dtype}"])
        return JobConfig.from_dictconfig(config).model
    from tests.jobs.fakes import save_tiny_pair

    target, draft = save_tiny_pair(root / "pair", max_position_embeddings=1024)
    return ModelConfig(name="tiny", target=ModelSpec(str(target), "dir"), draft=ModelSpec(str(draft), "dir"))


def job_for(args, model: ModelConfig, input_path: Path, out: Path, num_replicas: int, threads: int) -> JobConfig:
    return JobConfig(
        model=model,
        parallel=ParallelConfig(
            runtime="ray",
            device="cpu",
            tp_size=1,
            num_replicas=num_replicas,
            num_cpus_per_shard=float(threads),
            num_cpus_draft=float(threads),
        ),
        verifier=VerifierConfig(method="block", num_draft_tokens=args.num_draft_tokens, draft_len_schedule=args.draft_len_schedule, max_draft_len=args.num_draft_tokens),
        sampling=SamplingConfig(temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=0),
        data=DataConfig(
            input_path=str(input_path),
            output_dir=str(out),
            batch_size=args.batch_size,
            resume=False,
        ),
        tracking=TrackingConfig(mode="disabled", progress=False),
        log_level="WARNING",
    )


def completions(out: Path) -> dict[str, list[int]]:
    lines = (out / "completions.jsonl").read_text(encoding="utf-8").splitlines()
    return {record["id"]: record["completion_ids"] for record in map(json.loads, lines)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-records", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--num-draft-tokens", "--gamma", type=int, default=4)
    parser.add_argument("--draft-len-schedule", "--gamma-schedule", default="constant", choices=["constant", "adaptive", "goodput"])
    parser.add_argument("--dtype", default="bfloat16", help="model.dtype of the pair (not with --tiny)")
    parser.add_argument("--tiny", action="store_true", help="tiny random models (smoke test)")
    parser.add_argument("--rounds", type=int, default=1, help="run both configurations this many times, in turns")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    import ray

    from distributed_spec.jobs.runner import run

    out = args.out or Path(tempfile.mkdtemp(prefix="bench_replicas_"))
    out.mkdir(parents=True, exist_ok=True)
    input_path = out / "records.jsonl"
    write_records(input_path, args.num_records)
    model = model_config(args.tiny, out, args.dtype)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    results: dict = {"settings": vars(args) | {"out": str(out)}, "rounds": []}
    outputs: dict[str, dict[str, list[int]]] = {}
    try:
        for round_index in range(args.rounds):
            runs = {}
            for name, (num_replicas, threads) in CONFIGS.items():
                run_dir = out / f"round{round_index}" / name.replace(" ", "_")
                summary = run(job_for(args, model, input_path, run_dir, num_replicas, threads))
                outputs[f"{name}, round {round_index}"] = completions(run_dir)
                runs[name] = {
                    key: summary[key]
                    for key in ("records", "new_tokens", "wall_time_s", "tokens_per_s", "block_efficiency")
                } | {key: value for key, value in summary.items() if key.startswith("replica/")}
                print(f"round {round_index}, {name}: {summary['tokens_per_s']:.2f} tokens/s "
                      f"({summary['new_tokens']} tokens, {summary['wall_time_s']:.1f} s)", flush=True)
            replicas, threaded = (runs[name]["tokens_per_s"] for name in CONFIGS)
            results["rounds"].append({"runs": runs, "ratio": replicas / threaded if threaded else float("nan")})
    finally:
        ray.shutdown()
    ratios = [entry["ratio"] for entry in results["rounds"]]
    # The first round's runs stay under "runs" (the figures RESULTS quotes from earlier results.json files).
    results["runs"] = results["rounds"][0]["runs"]
    reference_name, reference = next(iter(outputs.items()))
    mismatched = sorted(
        {key for other in outputs.values() for key in reference.keys() | other.keys() if reference.get(key) != other.get(key)}
    )
    results.update(
        ratio=sum(ratios) / len(ratios), ratios=ratios, identical=not mismatched, mismatched=mismatched
    )
    print(f"ratio (2 replicas x 1 thread) / (1 replica x 2 threads): {results['ratio']:.2f}"
          + (f" (mean of {' '.join(f'{ratio:.2f}' for ratio in ratios)})" if len(ratios) > 1 else "")
          + f"; completions identical across all {len(outputs)} runs: {not mismatched}"
          + (f" (differ from {reference_name}: {mismatched})" if mismatched else ""))
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
