"""The runtime half of scripts/gpu_check.sh: local engine and Ray runtime on one CUDA GPU.

    .venv/bin/python -m scripts.gpu_check_runtime --out gpu_check_out/runtime.md

Checks, each one line in the report (and the exit status 1 when one fails):
1. backend selection: parallel.device=auto with parallel=ray resolves to cuda and nccl, and the plan of
   TP = 1 with the draft co-located fits this machine's GPUs (one GPU is enough);
2. tiny models built here: the single-process engine on cuda, then the Ray runtime at TP = 1 with the
   draft sharing the shard's GPU (parallel.num_gpus_draft=0.1): the same greedy tokens; the shard
   group's torch.distributed backend; the GPU ids Ray gave the shard and the draft;
3. the default pair (embedded SmolLM2 + its distilled draft) when its files are already here: the same
   comparison, the target loaded through the per-shard checkpoint path;
4. per-GPU memory (nvidia-smi) while the Ray runtime is up, and the engine's peak allocation.
Without CUDA it writes one "skipped" line and exits 0: nothing here can run on a CPU machine.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch

GREEDY_TOKENS = 24


def gpu_memory() -> str:
    """nvidia-smi's per-GPU used/total memory, one line per GPU."""
    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,memory.used,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError) as error:
        return f"nvidia-smi failed: {error}"
    return "; ".join(line.strip() for line in result.stdout.splitlines())


def check_backend_selection() -> tuple[bool, str]:
    from distributed_spec.config import ParallelConfig
    from distributed_spec.distributed.placement import cluster_nodes, connect, format_plan, plan_runtime

    runtime = ParallelConfig(runtime="ray", device="auto").resolve()
    ok = runtime.device == "cuda" and runtime.backend == "nccl"
    connect(None)
    config, plan, assignment = plan_runtime(runtime, cluster_nodes())
    return (
        ok,
        f"device=auto -> {runtime.device}/{runtime.backend}; plan: {format_plan(config, plan, cluster_nodes(), assignment)}",
    )


def run_pair(name: str, target_factory, draft_factory, local_target, local_draft, prompts) -> list[str]:
    """Local engine vs Ray TP = 1 with a co-located draft; returns report lines (ok/FAIL first word)."""
    import ray

    from distributed_spec.config import ParallelConfig
    from distributed_spec.distributed import RayCoordinator
    from distributed_spec.engine import EngineConfig, SamplingConfig, SpeculativeEngine, VerifierConfig

    config = EngineConfig(
        verifier=VerifierConfig(method="block", num_draft_tokens=4),
        sampling=SamplingConfig(temperature=0.0, max_new_tokens=GREEDY_TOKENS),
    )
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    expected = SpeculativeEngine(local_target, local_draft, config).generate(prompts)
    local_s = time.perf_counter() - start
    local_peak = torch.cuda.max_memory_allocated() / 2**20
    del local_target, local_draft
    torch.cuda.empty_cache()
    runtime = ParallelConfig(runtime="ray", tp_size=1, device="cuda", backend="nccl", num_gpus_draft=0.1, load_timeout_s=300)
    with RayCoordinator(target_factory, draft_factory, config, runtime) as coordinator:
        start = time.perf_counter()
        actual = coordinator.generate(prompts)
        ray_s = time.perf_counter() - start
        shard, draft = coordinator.actors.shards[0], coordinator.actors.draft
        backend = ray.get(shard.__ray_call__.remote(lambda actor: torch.distributed.get_backend()))
        shard_gpu = ray.get(shard.__ray_call__.remote(lambda actor: ray.get_gpu_ids()))
        draft_gpu = ray.get(draft.__ray_call__.remote(lambda actor: ray.get_gpu_ids()))
        memory = gpu_memory()
        shard_memory = coordinator.actors.shard_memory
    same = [r.token_ids for r in actual] == [r.token_ids for r in expected]
    return [
        f"{'ok' if same else 'FAIL'} {name}: Ray TP=1 (draft co-located) tokens {'==' if same else '!='} local engine "
        f"({sum(len(r.token_ids) for r in actual)} tokens; local {local_s:.1f} s, Ray {ray_s:.1f} s)",
        f"{'ok' if backend == 'nccl' else 'FAIL'} {name}: shard group backend {backend}",
        f"{'ok' if shard_gpu == draft_gpu else 'FAIL'} {name}: GPU ids shard {shard_gpu}, draft {draft_gpu}",
        f"info {name}: per-GPU memory with the runtime up: {memory}; local engine peak {local_peak:.0f} MiB; "
        f"shard reported {shard_memory}",
    ]


def tiny_pair() -> list[str]:
    from distributed_spec.distributed.factories import TinyLlamaFactory

    target = TinyLlamaFactory(vocab_size=64, num_layers=2, hidden=64, seed=0, logit_scale=16.0)
    draft = TinyLlamaFactory(vocab_size=64, num_layers=2, hidden=64, seed=0, logit_scale=16.0, noise=0.2)
    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]
    return run_pair("tiny", target, draft, target().cuda(), draft().cuda(), prompts)


def default_pair() -> list[str]:
    from distributed_spec.distributed.factories import SpecFactory
    from distributed_spec.models import ModelConfig, ModelSpec, load_pair
    from distributed_spec.models.distilled import DISTILLED_SMOLLM2_DRAFT_DIR
    from distributed_spec.models.fetch import smollm2_gguf_path

    try:
        smollm2_gguf_path(download=False)
    except FileNotFoundError:
        return ["skip default pair: the SmolLM2 .gguf is not here (python -m distributed_spec.models.fetch)"]
    if not DISTILLED_SMOLLM2_DRAFT_DIR.is_dir():
        return [f"skip default pair: no distilled draft at {DISTILLED_SMOLLM2_DRAFT_DIR}"]
    pair = ModelConfig(draft=ModelSpec(str(DISTILLED_SMOLLM2_DRAFT_DIR), kind="distilled"))
    target, draft = load_pair(pair, device="cuda")
    prompts = [
        target.tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for text in ("What is the capital of France?", "Write a Python function that adds two numbers.")
    ]
    return run_pair(
        "smollm2", *SpecFactory.for_pair(pair, "cuda"), target.model, draft.model, prompts
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_check_out/runtime.md"))
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        lines = ["skipped: torch sees no CUDA device"]
    else:
        lines = [f"info GPUs: {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"]
        ok, text = check_backend_selection()
        lines.append(f"{'ok' if ok else 'FAIL'} backend selection: {text}")
        for check in (tiny_pair, default_pair):
            try:
                lines += check()
            except Exception as error:  # noqa: BLE001 - report every check, then fail the script
                lines.append(f"FAIL {check.__name__}: {type(error).__name__}: {error}")
    args.out.write_text("\n".join(f"- {line}" for line in lines) + "\n")
    print("\n".join(lines))
    return 1 if any(line.startswith("FAIL") for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
