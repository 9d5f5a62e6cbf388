"""Where a Ray step's time goes outside the models: Ray's own task phases, from `ray.timeline`.

    .venv/bin/python -m scripts.trace_ray_step                     # g = 0 (autoregressive) and 1, B = 1
    .venv/bin/python -m scripts.trace_ray_step --g 0 2 --batch-size 4 --temperature 1

Runs the default pair (SmolLM2 target, the bundled distilled draft) in the Ray runtime at TP =
--tp-size, --num-cpus threads per actor (parallel.num_cpus_per_shard / num_cpus_draft; 1), block
verification at a fixed g (g = 0: verifier.method=autoregressive, no draft call), on --batch-size
prompts after a warm-up run. For each g it prints the runtime's own split of an iteration (draft,
target forward, verify, coordinator, transfer: RayCoordinator.timings) and, from Ray's task
timeline of the measured run only, the median per task of each phase Ray times: the driver's
`submit_task`, and per actor method the arguments' load (`deserialize_arguments`), the method itself
(`execute`) and its outputs' store (`store_outputs`); then the gaps on the critical path between one
actor's task ending and the next one's starting. First it times one StepRequest's pickling both
ways (no Ray). Medians: a step's phases are a few ms, and a
single slow one (the host) moves a mean by more than the effects this script is for.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import pickle
import statistics
import time

import ray
import torch

from distributed_spec.config import ParallelConfig
from distributed_spec.distributed import RayCoordinator
from distributed_spec.distributed.factories import SpecFactory
from distributed_spec.distributed.messages import StepRequest
from distributed_spec.engine import EngineConfig
from distributed_spec.engine.config import SamplingConfig, VerifierConfig
from distributed_spec.models import ModelConfig
from distributed_spec.models.tokenizers import load_tokenizer
from distributed_spec.verify import RowSampling, SamplingParams
from scripts.common import draft_spec, markdown_table, question_prompts, time_calls

# Ray's names of a task's phases in its timeline (the method's own event is "task::<Class>.<method>").
PHASES = ("task:deserialize_arguments", "task:execute", "task:store_outputs")
STEP_METHODS = ("DraftWorker.step", "TargetShard.score_and_verify")


def task_phases(events: list[dict], since_us: float) -> dict[str, dict[str, float]]:
    """Median milliseconds of each phase per actor method, from Ray timeline events after since_us.

    Ray reports a task's phases as separate events on its worker's track, inside the task's own
    "task::<Class>.<method>" event: each phase goes to the method whose event contains it.
    """
    methods = collections.defaultdict(list)  # worker -> [(start, end, method)]
    for event in events:
        name = event.get("cat", "")
        if name.startswith("task::") and event.get("ph") == "X":
            methods[event["tid"]].append((event["ts"], event["ts"] + event["dur"], name[len("task::"):]))
    durations: dict[str, dict[str, list[float]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for event in events:
        if event.get("ph") != "X" or event["ts"] < since_us:
            continue
        if event.get("cat") == "submit_task":
            durations["driver"]["submit_task"].append(event["dur"] / 1000)
        elif event.get("cat") in PHASES:
            owner = next((m for start, end, m in methods[event["tid"]] if start <= event["ts"] <= end), None)
            if owner is not None:
                durations[owner][event["cat"].split(":")[1]].append(event["dur"] / 1000)
    return {
        owner: {phase: statistics.median(values) for phase, values in phases.items()}
        for owner, phases in durations.items()
    }


def critical_gaps(events: list[dict], since_us: float) -> dict[str, float]:
    """Median ms from each step task's end to the next step task's start (any actor), by the pair of
    methods: e.g. draft step -> shard (the block's way through the driver), shard -> draft step or
    shard -> shard (the driver's bookkeeping and the next submit)."""
    tasks = sorted(
        (
            (event["ts"], event["ts"] + event["dur"], event["cat"][len("task::"):])
            for event in events
            if event.get("cat", "").startswith("task::") and event["cat"][len("task::"):] in STEP_METHODS
            and event["ts"] >= since_us
        ),
    )
    gaps: dict[str, list[float]] = collections.defaultdict(list)
    for (_, end, method), (next_start, _, next_method) in zip(tasks, tasks[1:]):
        if next_start >= end:  # tasks of one step on different actors overlap; only hand-offs count
            gaps[f"{method} -> {next_method}"].append((next_start - end) / 1000)
    return {pair: statistics.median(values) for pair, values in gaps.items()}


def pickle_cost(batch_size: int, g: int = 1, repeats: int = 2000) -> dict[str, float]:
    """Microseconds to pickle and load one B-row StepRequest (Ray's cost per message, without Ray):
    its tensors as numpy (PickledAsNumpy, as sent) and as torch tensors (the state pickled as is).
    The median over `repeats` round trips of each, the two taking turns (scripts.common.time_calls)."""
    request = StepRequest(
        keep_rows=None,
        new_prompts=[],
        decoding=torch.ones(batch_size, dtype=torch.bool),
        num_draft_tokens=torch.full((batch_size,), g),
        eta=torch.rand(batch_size, g, dtype=torch.float64),
        u=torch.rand(batch_size, dtype=torch.float64),
        sampling=RowSampling.uniform(SamplingParams(), batch_size),
    )
    messages = {"numpy": request, "torch": dict(vars(request))}
    seconds = time_calls(
        {label: (lambda message=message: pickle.loads(pickle.dumps(message))) for label, message in messages.items()},
        iters=repeats,
        reduce=statistics.median,
    )
    return {label: 1e6 * value for label, value in seconds.items()}


def trace(pair: ModelConfig, prompts: list[list[int]], g: int, args) -> dict:
    config = EngineConfig(
        verifier=VerifierConfig(method="block" if g else "autoregressive", num_draft_tokens=max(g, 1)),
        sampling=SamplingConfig(temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=0),
        max_batch_size=len(prompts),
    )
    runtime = ParallelConfig(
        runtime="ray", device="cpu", backend="gloo", tp_size=args.tp_size, num_cpus_per_shard=args.num_cpus,
        num_cpus_draft=args.num_cpus,
        load_timeout_s=900, step_timeout_s=300,
    )
    with RayCoordinator(*SpecFactory.for_pair(pair, "cpu"), config, runtime) as coordinator:
        coordinator.generate(prompts)  # warm-up: first calls allocate and tune kernels
        since_us = time.time() * 1e6
        start = time.perf_counter()
        _, stats = coordinator.generate_with_stats(prompts)
        elapsed = time.perf_counter() - start
        timings = coordinator.timings
        events = ray.timeline()
    iterations = max(timings.num_iterations, 1)
    per_iteration = {
        part: 1000 * getattr(timings, f"{part}_s") / iterations
        for part in ("iteration", "draft", "target", "verify", "coordinator", "transfer")
    }
    return {
        "g": g,
        "tokens_per_s": stats.num_tokens / elapsed,
        "tokens_per_iteration": stats.num_tokens / iterations,
        "ms_per_iteration": per_iteration,
        "phases_ms": task_phases(events, since_us),
        "gaps_ms": critical_gaps(events, since_us),
    }


def report(result: dict) -> str:
    split = result["ms_per_iteration"]
    lines = [
        f"g = {result['g']}: {result['tokens_per_s']:.1f} tokens/s, {result['tokens_per_iteration']:.2f} tokens "
        f"per iteration, {split['iteration']:.1f} ms per iteration: "
        + ", ".join(f"{part} {split[part]:.1f}" for part in ("draft", "target", "verify", "coordinator", "transfer"))
        + f"; outside the target forward {split['iteration'] - split['target']:.1f}",
    ]
    names = [phase.split(":")[1] for phase in PHASES]
    rows = [
        [owner, *(f"{phases.get(name, float('nan')):.2f}" for name in names)]
        for owner, phases in sorted(result["phases_ms"].items())
        if owner != "driver"
    ]
    lines.append(markdown_table(["task", *names], rows))
    lines.append(f"driver submit_task: {result['phases_ms'].get('driver', {}).get('submit_task', float('nan')):.2f} ms")
    lines += [f"gap {pair}: {ms:.2f} ms" for pair, ms in sorted(result["gaps_ms"].items())]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--g", type=int, nargs="+", default=[0, 1], help="draft lengths (0: autoregressive)")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--num-cpus", type=int, default=1,
                        help="CPUs (and torch threads) of every actor: parallel.num_cpus_per_shard and num_cpus_draft")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    pair = ModelConfig(draft=draft_spec("auto", 4), dtype=args.dtype)
    prompts = question_prompts(load_tokenizer(pair), args.batch_size)
    costs = pickle_cost(args.batch_size)
    print(f"one StepRequest of {args.batch_size} rows, pickled and loaded: {costs['numpy']:.0f} us with its tensors "
          f"as numpy (as sent), {costs['torch']:.0f} us as torch tensors\n")
    ray.init(num_cpus=2 * args.num_cpus * (args.tp_size + 1), include_dashboard=False, log_to_driver=False)
    try:
        results = []
        for g in args.g:
            results.append(trace(pair, prompts, g, args))
            print(report(results[-1]), flush=True)
            print()
    finally:
        ray.shutdown()
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
