"""Launchers: local.sh end to end through the real engine; the Slurm and Ray-cluster dry runs."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.jobs.cli_runs import tiny_args
from tests.jobs.fakes import save_tiny_pair

REPO = Path(__file__).resolve().parents[2]
LAUNCHERS = REPO / "launchers"


def _bash(
    script: str, *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(LAUNCHERS / script), *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_slurm_dry_run_starts_head_then_workers_then_the_job():
    result = _bash(
        "slurm.sbatch",
        "verifier=token",
        "sampling.stop=[it's]",
        env={"DRY_RUN": "1", "DRY_RUN_NODES": "n0 n1 n2"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "+ srun --nodes=1 --ntasks=1 -w n0 ray start --head --node-ip-address=n0 --port=6379 --num-cpus=16 --block &",
        "+ sleep 20",
        "+ srun --nodes=1 --ntasks=1 -w n1 ray start --address=n0:6379 --num-cpus=16 --block &",
        "+ srun --nodes=1 --ntasks=1 -w n2 ray start --address=n0:6379 --num-cpus=16 --block &",
        "+ sleep 20",
        "+ python -m distributed_spec.generate parallel=ray parallel.ray_address=n0:6379 parallel.num_replicas=auto "
        "verifier=token 'sampling.stop=[it'\\''s]'",
    ]
    assert "ray head: n0 (n0:6379), workers: n1 n2" in result.stderr


def test_slurm_dry_run_flag_and_single_node(tmp_path):
    result = _bash(
        "slurm.sbatch",
        "--dry-run",
        env={"DRY_RUN_NODES": "solo", "RAY_PORT": "7000", "SLURM_CPUS_PER_TASK": "4"},
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(
        "+ srun --nodes=1 --ntasks=1 -w solo ray start --head --node-ip-address=solo --port=7000 --num-cpus=4"
    )
    assert not any("--address=" in line for line in lines)
    assert lines[-1] == (
        "+ python -m distributed_spec.generate parallel=ray parallel.ray_address=solo:7000 parallel.num_replicas=auto"
    )


def test_launchers_fill_the_cluster_with_replicas_unless_told_how_many():
    slurm = _bash("slurm.sbatch", "parallel.num_replicas=2", env={"DRY_RUN": "1", "DRY_RUN_NODES": "n0 n1"})
    ray_job = _bash("ray_cluster.sh", "parallel.num_replicas=2", env={"DRY_RUN": "1"})
    for result in (slurm, ray_job):
        assert result.returncode == 0, result.stderr
        job_line = result.stdout.splitlines()[-1]
        assert job_line.endswith(" parallel.num_replicas=2") and "num_replicas=auto" not in job_line


def test_slurm_outside_an_allocation_refuses_to_run():
    env = {key: value for key, value in os.environ.items() if not key.startswith("SLURM_")}
    result = subprocess.run(
        ["bash", str(LAUNCHERS / "slurm.sbatch")], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1 and "DRY_RUN=1" in result.stderr


def test_ray_cluster_dry_run_submits_the_job_to_join_the_cluster():
    env = {
        "DRY_RUN": "1",
        "RAY_ADDRESS": "http://head:8265",
        "OUTPUT_DIR": "/shared/out",
        "WANDB_MODE": "offline",
    }
    result = _bash("ray_cluster.sh", "verifier=block", env=env)
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip()
    assert line.startswith("+ ray job submit --address http://head:8265 --runtime-env-json '{")
    runtime_env = json.loads(line.split("--runtime-env-json '", 1)[1].split("' --", 1)[0])
    assert runtime_env["working_dir"] == str(REPO) and runtime_env["env_vars"] == {"WANDB_MODE": "offline"}
    assert line.endswith(
        "-- python -m distributed_spec.generate parallel=ray parallel.ray_address=auto parallel.num_replicas=auto "
        "data.output_dir=/shared/out verifier=block"
    )


def test_local_launcher_runs_the_job_end_to_end(tmp_path):
    tiny_pair = save_tiny_pair(tmp_path / "pair")
    input_path = tmp_path / "prompts.jsonl"
    input_path.write_text(
        json.dumps({"id": 1, "prompt": "one two"})
        + "\n"
        + json.dumps({"id": 2, "messages": [{"role": "user", "content": "three"}]})
        + "\n"
        + "{bad\n"
    )
    out = tmp_path / "out"
    result = _bash(
        "local.sh",
        *tiny_args(
            tiny_pair,
            input_path,
            f"data.output_dir={out}",
            "sampling.max_new_tokens=8",
            f"hydra.run.dir={tmp_path / 'hydra'}",
        ),
        env={"OMP_NUM_THREADS": "1"},
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr.startswith("+ ") and "-m distributed_spec.generate" in result.stderr.splitlines()[0]
    completions = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    # Records are written as they finish (continuous batching), not in input order.
    assert sorted(record["id"] for record in completions) == [1, 2]
    assert all(1 <= len(record["completion_ids"]) <= 8 for record in completions)
    assert len((out / "errors.jsonl").read_text().splitlines()) == 1
    assert "block efficiency" in result.stderr  # the summary table
    assert (tmp_path / "hydra" / ".hydra" / "config.yaml").is_file()  # the resolved config, kept with the run
