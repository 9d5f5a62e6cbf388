"""What the goodput schedule chooses, step by step, in one real job on the default pair.

    python -m scripts.trace_goodput --batch-size 16 --temperature 0 --num-records 64
    python -m scripts.trace_goodput --batch-size 16 --idle-draft --repeats 3 --no-trace
    python -m scripts.trace_goodput --batch-size 16 --proposer model+ngram --seed 1

The job is bench_throughput's (the same length-skewed records, bf16, --runtime local or Ray, goodput up to
--max-draft-len), run beside the autoregressive job on the same loaded pair, taking turns
(--repeats times). Each goodput step prints the batch size, the g chosen, the predicted seconds
T(B, g) and expected tokens per row of every g, the acceptance rates goodput chooses with (optimistic
prior) and their means, the rows' mean own factor, and the draft's debt as priced
(c_catch x the sum of D_r / R_r: ms added per token a drafting step makes), and at the end, per g, its
predicted seconds over the measured ones for full-batch steps without prompts: what
docs/RESULTS.md's diagnosis of goodput at B = 16 reads. --idle-draft adds a third job: goodput's
choice replaced by g = 0 at every step, so the draft is loaded but never drafts; its tokens/s over
the autoregressive job's is what merely having the draft costs. --proposer model+ngram runs goodput
with n-gram blocks beside the draft: each step then says its kind (model, n-gram blocks alone, or
plain), and the end sums, per kind of drafting step, the tokens goodput expected it to keep against
those kept, and counts the steps in which the draft caught up (its forwards for work owed by earlier
steps) with their seconds.
"""

from __future__ import annotations

import argparse
import collections
import logging
import tempfile
from dataclasses import replace
from pathlib import Path

from scripts.bench_throughput import Policy, write_records
from scripts.common import RUNTIMES, base_job, measure


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0, help="sampling.seed (each record's draws)")
    parser.add_argument("--num-records", type=int, default=64)
    parser.add_argument("--max-draft-len", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument(
        "--runtime", default="local", choices=RUNTIMES, help="ray<N>: Ray at TP = N as the job runs it; -in-shard / -draft-actor: the draft placed so; -packed: model.cpu_prepack"
    )
    parser.add_argument("--idle-draft", action="store_true", help="also run goodput held at g = 0")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--no-trace", action="store_true", help="print tokens/s only")
    parser.add_argument("--proposer", default="model", choices=("model", "model+ngram"), help="verifier.proposer of goodput")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from distributed_spec.engine.goodput import GoodputPolicy
    from distributed_spec.engine.scheduler import Scheduler
    from distributed_spec.jobs.runner import build_generator

    trace = []
    choose_step = GoodputPolicy.choose_step
    mode = {"idle": False}

    def traced(policy: GoodputPolicy, rows, num_rows: int, debt_per_token: float = 0.0) -> int:
        g = 0 if mode["idle"] else choose_step(policy, rows, num_rows, debt_per_token)
        if mode["idle"]:
            return g
        widths = range(policy.max_draft_len + 1)
        seconds = [policy.cost.predict(num_rows, width) for width in widths]
        tokens = [policy.expected_tokens(rows, width) / max(len(rows), 1) for width in widths]
        factor = sum(row[1].factor() for row in rows) / max(len(rows), 1)
        # The draft's debt priced per token a drafting step makes (goodput.py: c_catch x sum D_r / R_r).
        debt_ms = policy.catch_up.seconds_per_token * debt_per_token * 1e3
        optimistic = policy.acceptance.rates(policy.optimism, policy.optimistic_positions)
        rates = policy.acceptance.rates()
        kind = "plain" if g == 0 else "model" if policy.model_drafts else "n-gram"
        trace.append((num_rows, g, kind, seconds, tokens, optimistic, rates, factor, debt_ms))
        # Draft tokens the chosen step is expected to keep (the optimistic prior included).
        expected[0] = (kind, policy.expected_tokens(rows, g, policy.model_drafts) - len(rows))
        return g

    GoodputPolicy.choose_step = traced
    # Each step's predicted seconds T(B, g) against its measured ones (prompt forwards run apart taken
    # off), for full-batch steps that fed no prompt: how well goodput's cost model predicts its steps.
    checks = []
    # Per kind of step: [steps, draft tokens expected to be kept, kept]; and the draft's catch-ups.
    kept_by_kind: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0])
    catch_ups = [0, 0.0, 0]
    expected: list[tuple[str, float] | None] = [None]
    observe = Scheduler._observe

    def checked(scheduler, rows, plan, outcome, seconds):
        if scheduler.goodput is not None and expected[0] is not None:
            kind, tokens = expected[0]
            counts = kept_by_kind[kind]
            counts[0] += 1
            counts[1] += tokens
            counts[2] += int(outcome.accepted_counts[plan.decoding].sum())
            expected[0] = None
            if outcome.num_catch_up_tokens > 0:
                catch_ups[0] += 1
                catch_ups[1] += outcome.catch_up_s
                catch_ups[2] += outcome.num_catch_up_tokens
        if scheduler.goodput is not None and plan.num_prompt_slots == 0 and len(rows) == args.batch_size:
            predicted = scheduler.goodput.cost.predict(len(rows), plan.g, model=plan.num_model_drafts > 0)
            if predicted is not None:
                checks.append((plan.g, predicted / max(seconds - outcome.prefill_s, 1e-9)))
        return observe(scheduler, rows, plan, outcome, seconds)

    Scheduler._observe = checked
    results: dict[str, list[float]] = collections.defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_records(work / "records.jsonl", args.num_records)
        job = base_job(argparse.Namespace(tiny=False, dtype=args.dtype), args.runtime, work / "records.jsonl")
        job = replace(
            job,
            sampling=replace(job.sampling, temperature=args.temperature, seed=args.seed),
            data=replace(job.data, batch_size=args.batch_size),
        )
        goodput = Policy(
            "goodput", draft_len_schedule="goodput", g=1, max_draft_len=args.max_draft_len, proposer=args.proposer
        )
        autoregressive = Policy("autoregressive", method="autoregressive", g=1, max_draft_len=1)
        runs = [("autoregressive", autoregressive, False), ("goodput", goodput, False)]
        if args.idle_draft:
            runs.append(("goodput held at g = 0", goodput, True))
        generator = build_generator(job)
        for repeat in range(args.repeats):
            for name, policy, idle in runs:
                mode["idle"] = idle
                if name == "goodput":
                    trace.clear()  # the last repeat's steps are printed
                    checks.clear()
                    kept_by_kind.clear()
                    catch_ups[:] = [0, 0.0, 0]
                out = work / f"out-{repeat}-{len(results[name])}-{idle}-{name[:4]}"
                summary = measure(generator, replace(job, verifier=policy.verifier()), out)
                results[name].append(summary["tokens_per_s"])
                if name == "goodput":
                    steps_per_g = summary.get("steps_per_draft_len")

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1e3:.1f}"

    if not args.no_trace:
        print("B  g  kind   | T(B, g) ms per g (model) | tokens per row per g | rates (optimistic) | rates (mean) | row factor | debt ms")
        for num_rows, g, kind, seconds, tokens, optimistic, rates, factor, debt_ms in trace:
            print(
                f"{num_rows:<2} {g}  {kind:<6} | {' '.join(ms(value) for value in seconds)} | "
                f"{' '.join(f'{value:.2f}' for value in tokens)} | {' '.join(f'{r:.2f}' for r in optimistic)} | "
                f"{' '.join(f'{r:.2f}' for r in rates)} | {factor:.2f} | {debt_ms:.1f}"
            )
        steps = collections.Counter((num_rows, g) for num_rows, g, *_ in trace)
        print("steps per (B, g):", dict(sorted(steps.items())))
        for kind in ("model", "n-gram"):
            if kind in kept_by_kind:
                num_steps, tokens, kept = kept_by_kind[kind]
                print(f"{kind} steps: {num_steps}, draft tokens expected kept {tokens:.1f}, kept {kept}")
        print(f"steps in which the draft caught up: {catch_ups[0]} ({catch_ups[1]:.2f} s, {catch_ups[2]} tokens)")
        print(f"goodput steps per g (last repeat): {steps_per_g}")
        for width in sorted({g for g, _ in checks}):
            ratios = [ratio for g, ratio in checks if g == width]
            print(f"g = {width}: predicted / measured seconds {sum(ratios) / len(ratios):.3f} over {len(ratios)} full-batch steps without prompts")
    baseline = results["autoregressive"]
    for name, values in results.items():
        ratios = " ".join(f"{value / base:.2f}" for value, base in zip(values, baseline))
        print(f"{name}: tokens/s {' '.join(f'{value:.1f}' for value in values)}; x autoregressive {ratios}")


if __name__ == "__main__":
    main()
