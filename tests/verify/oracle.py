"""Exact oracle for speculative decoding verification, by enumeration over a small vocabulary.

Independent of distributed_spec.verify: plain Python floats (float64), no torch. For a context c
and draft/target tables p(. | prefix), q(. | prefix), it enumerates every draft block and every
verification outcome, giving the exact distribution of what one iteration emits, and composes
iterations into the exact distribution of the generated sequence.
"""

from __future__ import annotations

import itertools
import random
from collections import defaultdict
from collections.abc import Callable

Dist = list[float]
Table = Callable[[tuple[int, ...]], Dist]


class RandomTable:
    """A context-dependent distribution over V tokens: a seeded Dirichlet draw per prefix."""

    def __init__(self, vocab_size: int, seed: int, concentration: float = 1.0):
        self.vocab_size = vocab_size
        self.seed = seed
        self.concentration = concentration
        self._cache: dict[tuple[int, ...], Dist] = {}

    def __call__(self, prefix: tuple[int, ...]) -> Dist:
        if prefix not in self._cache:
            rng = random.Random(hash((self.seed, prefix)))
            weights = [rng.gammavariate(self.concentration, 1.0) for _ in range(self.vocab_size)]
            total = sum(weights)
            self._cache[prefix] = [w / total for w in weights]
        return self._cache[prefix]


def constant_table(dist: Dist) -> Table:
    return lambda prefix: list(dist)


def point_mass_table(vocab_size: int, token: Callable[[tuple[int, ...]], int]) -> Table:
    """q of a proposer that names its next token outright: a point mass at token(prefix)."""
    return lambda prefix: [float(x == token(prefix)) for x in range(vocab_size)]


def block_table(vocab_size: int, context: tuple[int, ...], block: tuple[int, ...]) -> Table:
    """q of a block named outright after `context` (an n-gram proposal): a point mass at block[i]
    after context + block[:i] (block[-1] beyond the block: never read)."""
    return point_mass_table(vocab_size, lambda prefix: block[min(len(prefix) - len(context), len(block) - 1)])


def _normalise(weights: Dist) -> Dist:
    total = sum(weights)
    return [w / total for w in weights]


def block_h(p_on: list[float], q_on: list[float], p_next: list[Dist], q_next: list[Dist]) -> list[float]:
    """h_1..h_g of block verification; p_next[i], q_next[i] are p_{i+2}, q_{i+2} (0-based i < g-1)."""
    g = len(p_on)
    if g == 0:
        # No draft: tau = 0 surely and Y ~ p_1.
        return [], []
    r, rs = 1.0, []
    for i in range(g):
        r = min(1.0, r * p_on[i] / q_on[i]) if q_on[i] > 0 else (1.0 if p_on[i] > 0 and r > 0 else 0.0)
        rs.append(r)
    h = []
    for i in range(g - 1):
        z = sum(max(rs[i] * a - b, 0.0) for a, b in zip(p_next[i], q_next[i]))
        denominator = z + 1.0 - rs[i]
        h.append(z / denominator if denominator > 0 else 1.0)
    h.append(rs[-1])
    return h, rs


def _block_tau_probs(h: list[float]) -> list[float]:
    """P(tau = i), i = 0..len(h): h_i times the probability that every later h_j failed."""
    probs = []
    for i in range(len(h) + 1):
        prob = 1.0 if i == 0 else h[i - 1]
        for j in range(i + 1, len(h) + 1):
            prob *= 1.0 - h[j - 1]
        probs.append(prob)
    return probs


# A draft-side stop: given context + X_1..X_i, whether the block ends after X_i.
StopRule = Callable[[tuple[int, ...]], bool]


def iteration_outcomes(
    method: str, p: Table, q: Table, context: tuple[int, ...], g: int, stop: StopRule | None = None
) -> dict:
    """Exact distribution of one iteration: {(tau, emitted tokens tuple): probability}.

    With `stop`, the block is X_1..X_L for the first L < g at which stop(context + X_1..X_L)
    holds (else L = g), and is verified as a block of length L.
    """
    vocab_size = len(p(context))
    outcomes: dict[tuple[int, tuple[int, ...]], float] = defaultdict(float)
    for full_draft in itertools.product(range(vocab_size), repeat=g):
        # The tokens after a stop are never drafted: their probabilities sum to 1 over this loop.
        draft_prob = 1.0
        for i, x in enumerate(full_draft):
            draft_prob *= q(context + full_draft[:i])[x]
        if draft_prob == 0.0:
            continue
        length = next(
            (i for i in range(1, g) if stop is not None and stop(context + full_draft[:i])), g
        )
        draft = full_draft[:length]
        prefixes = [context + draft[:i] for i in range(length + 1)]
        p_dists = [p(pre) for pre in prefixes]  # p_1..p_{L+1}
        q_dists = [q(pre) for pre in prefixes[:length]]  # q_1..q_L
        p_on = [p_dists[i][x] for i, x in enumerate(draft)]
        q_on = [q_dists[i][x] for i, x in enumerate(draft)]
        if method == "block":
            h, rs = block_h(p_on, q_on, p_dists[1:length], q_dists[1:length])
            tau_probs = _block_tau_probs(h)
            scales = [1.0] + rs
        elif method in ("token", "lossy"):
            tau_probs, reach = [], 1.0
            for i in range(length):
                accept = min(1.0, p_on[i] / q_on[i])
                tau_probs.append(reach * (1.0 - accept))
                reach *= accept
            tau_probs.append(reach)
            scales = [1.0] * (length + 1)
        else:
            raise ValueError(method)
        for tau, tau_prob in enumerate(tau_probs):
            if tau_prob == 0.0:
                continue
            if tau == length:
                y_dist = p_dists[length]
            elif method == "lossy":
                # A control that must fail the lossless check: the correction drawn from p itself.
                y_dist = p_dists[tau]
            else:
                y_dist = _normalise(
                    [max(scales[tau] * a - b, 0.0) for a, b in zip(p_dists[tau], q_dists[tau])]
                )
            for y, y_prob in enumerate(y_dist):
                if y_prob > 0.0:
                    outcomes[(tau, draft[:tau] + (y,))] += draft_prob * tau_prob * y_prob
    return dict(outcomes)


def emitted_distribution(
    method: str, p: Table, q: Table, context: tuple[int, ...], g: int, stop: StopRule | None = None
) -> dict:
    """{emitted tokens tuple: probability} of one iteration."""
    emitted: dict[tuple[int, ...], float] = defaultdict(float)
    for (_, tokens), prob in iteration_outcomes(method, p, q, context, g, stop).items():
        emitted[tokens] += prob
    return dict(emitted)


def expected_accepted(method: str, p: Table, q: Table, context: tuple[int, ...], g: int) -> float:
    """E[tau]: expected accepted draft tokens of one iteration."""
    return sum(tau * prob for (tau, _), prob in iteration_outcomes(method, p, q, context, g).items())


def speculative_sequence_distribution(
    method: str,
    p: Table,
    q: Table,
    context: tuple[int, ...],
    g: int | Callable[[tuple[int, ...]], int],
    length: int,
    stop: StopRule | None = None,
) -> dict[tuple[int, ...], float]:
    """Exact distribution of the first `length` generated tokens over repeated iterations.

    `g` may be a function of the context so far (a draft-length schedule that depends on what
    was generated before the iteration).
    """

    def step(ctx: tuple[int, ...]) -> dict:
        block_length = g(ctx) if callable(g) else g
        return emitted_distribution(method, p, q, ctx, block_length, stop)

    return _compose_iterations(context, length, step)


def proposer_sequence_distribution(
    method: str, p: Table, context: tuple[int, ...], propose: Callable[[tuple[int, ...]], tuple[int, ...]], length: int
) -> dict[tuple[int, ...], float]:
    """Like speculative_sequence_distribution for a draft-free proposer: each iteration verifies the
    block propose(context so far) names (possibly empty: g = 0), with q its point mass."""
    vocab_size = len(p(context))

    def step(ctx: tuple[int, ...]) -> dict:
        block = tuple(propose(ctx))
        return emitted_distribution(method, p, block_table(vocab_size, ctx, block), ctx, len(block))

    return _compose_iterations(context, length, step)


def _compose_iterations(
    context: tuple[int, ...], length: int, iteration: Callable[[tuple[int, ...]], dict]
) -> dict[tuple[int, ...], float]:
    """The distribution of the first `length` generated tokens, iteration(ctx) being one iteration's
    {emitted tokens: probability} from context ctx."""
    memo: dict[tuple[int, ...], dict] = {}

    def step(ctx: tuple[int, ...]) -> dict:
        if ctx not in memo:
            memo[ctx] = iteration(ctx)
        return memo[ctx]

    result: dict[tuple[int, ...], float] = defaultdict(float)

    def expand(generated: tuple[int, ...], prob: float) -> None:
        if len(generated) >= length:
            result[generated[:length]] += prob
            return
        for tokens, tokens_prob in step(context + generated).items():
            expand(generated + tokens, prob * tokens_prob)

    expand((), 1.0)
    return dict(result)


# A draft-length policy with memory: (context so far, ((g, tau) of every past iteration)) -> g.
HistoryPolicy = Callable[[tuple[int, ...], tuple[tuple[int, int], ...]], int]


def policy_sequence_distribution(
    method: str, p: Table, q: Table, context: tuple[int, ...], policy: HistoryPolicy, length: int
) -> dict[tuple[int, ...], float]:
    """Like speculative_sequence_distribution, with g chosen from the whole history of iterations
    (their block lengths and verdicts), as a scheduler that learns acceptance rates does; g may be 0."""

    def one_proposer(ctx, history):
        return policy(ctx, tuple((g, tau) for g, tau, _ in history)), "q", q

    return sourced_policy_sequence_distribution(method, p, context, one_proposer, length)


# A policy that also picks the proposer: (context so far, ((g, tau, source) of every past iteration))
# -> (g, source's name, its q table for this context).
SourcedPolicy = Callable[[tuple[int, ...], tuple[tuple[int, int, str], ...]], tuple[int, str, Table]]


def sourced_policy_sequence_distribution(
    method: str, p: Table, context: tuple[int, ...], policy: SourcedPolicy, length: int
) -> dict[tuple[int, ...], float]:
    """Like policy_sequence_distribution, where each iteration's policy also picks what proposes the
    block (a draft model's q, or a point mass an n-gram lookup names) from the history and context."""
    memo: dict[tuple[tuple[int, ...], int, str], dict] = {}
    result: dict[tuple[int, ...], float] = defaultdict(float)

    def expand(generated: tuple[int, ...], history: tuple[tuple[int, int, str], ...], prob: float) -> None:
        if len(generated) >= length:
            result[generated[:length]] += prob
            return
        ctx = context + generated
        g, source, q = policy(ctx, history)
        if (ctx, g, source) not in memo:
            memo[(ctx, g, source)] = iteration_outcomes(method, p, q, ctx, g)
        for (tau, tokens), tokens_prob in memo[(ctx, g, source)].items():
            expand(generated + tokens, history + ((g, tau, source),), prob * tokens_prob)

    expand((), (), 1.0)
    return dict(result)


def target_sequence_distribution(
    p: Table, context: tuple[int, ...], length: int
) -> dict[tuple[int, ...], float]:
    """Exact distribution of `length` tokens sampled autoregressively from the target."""
    vocab_size = len(p(context))
    result = {}
    for seq in itertools.product(range(vocab_size), repeat=length):
        prob = 1.0
        for i, x in enumerate(seq):
            prob *= p(context + seq[:i])[x]
        result[seq] = prob
    return result


def total_variation(a: dict, b: dict) -> float:
    keys = set(a) | set(b)
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in keys)


def decide(
    method: str, p: Table, q: Table, draft: tuple[int, ...], eta: list[float], u: float
) -> tuple[int, int, float]:
    """The oracle's decision for one row given its uniforms: (tau, Y, distance of u * total to the
    nearest CDF boundary). Implementations given the same uniforms must agree where the distance
    is not tiny (float32 inputs may round a boundary either way)."""
    g = len(draft)
    prefixes = [draft[:i] for i in range(g + 1)]
    p_on = [p(prefixes[i])[x] for i, x in enumerate(draft)]
    q_on = [q(prefixes[i])[x] for i, x in enumerate(draft)]
    if method == "block":
        h, rs = block_h(p_on, q_on, [p(pre) for pre in prefixes[1:g]], [q(pre) for pre in prefixes[1:g]])
        tau = max([i + 1 for i in range(g) if eta[i] < h[i]], default=0)
        scale = ([1.0] + rs)[tau]
    elif method == "token":
        tau = 0
        while tau < g and eta[tau] < min(1.0, p_on[tau] / q_on[tau]):
            tau += 1
        scale = 1.0
    else:
        raise ValueError(method)
    p_next = p(prefixes[tau])
    weights = p_next if tau == g else [max(scale * a - b, 0.0) for a, b in zip(p_next, q(prefixes[tau]))]
    threshold = u * sum(weights)
    cdf = list(itertools.accumulate(weights))
    y = next(i for i, c in enumerate(cdf) if c > threshold)
    return tau, y, min(abs(c - threshold) for c in cdf)


# Multi-path verification (distributed_spec/verify/multipath.py): K independent draft paths, path k
# drawn from its own table qs[k]; recursive block verification over the paths.


def _multipath_stage(p: Table, qs: list[Table], context, paths, k: int, depth: int, first: Dist | None):
    """Block verification of path k from `depth` against (first, then p); first None means p itself.

    Returns h of that block and, for every verdict tau = depth..g, (tau, the weights Y would be drawn
    from, whether it is the bonus): residual max(r_tau P_{tau+1} - q_{tau+1}, 0), or p_{g+1}.
    """
    path, g = paths[k], len(paths[k])
    prefixes = [context + path[:i] for i in range(g + 1)]
    p_dists = [p(pre) for pre in prefixes]
    q_dists = [qs[k](pre) for pre in prefixes[:g]]
    target_first = p_dists[depth] if first is None else first
    p_on = [target_first[path[depth]]] + [p_dists[i][path[i]] for i in range(depth + 1, g)]
    q_on = [q_dists[i][path[i]] for i in range(depth, g)]
    h, rs = block_h(p_on, q_on, p_dists[depth + 1 : g], q_dists[depth + 1 : g])
    stages = []
    for accepted in range(g - depth + 1):
        tau = depth + accepted
        if tau == g:
            stages.append((tau, p_dists[g], True))
            continue
        base = target_first if accepted == 0 else p_dists[tau]
        scale = 1.0 if accepted == 0 else rs[accepted - 1]
        stages.append((tau, [max(scale * a - b, 0.0) for a, b in zip(base, q_dists[tau])], False))
    return h, stages


def _next_sharing(paths, k: int, tau: int) -> int | None:
    return next((j for j in range(k + 1, len(paths)) if paths[j][:tau] == paths[k][:tau]), None)


def multipath_outcomes(
    p: Table, qs: list[Table], context: tuple[int, ...], g: int, lossy: bool = False
) -> dict:
    """Exact distribution of one multi-path iteration: {(tau, emitted tokens): probability}.

    Every K-tuple of paths (path k from qs[k], independently), every verdict of every stage. `lossy`
    is a control that must fail the lossless check: the next path verified against p itself
    instead of the residual."""
    vocab_size = len(p(context))
    if g == 0:
        return {(0, (y,)): prob for y, prob in enumerate(p(context)) if prob > 0.0}
    outcomes: dict[tuple[int, tuple[int, ...]], float] = defaultdict(float)
    all_paths = list(itertools.product(range(vocab_size), repeat=g))
    for paths in itertools.product(all_paths, repeat=len(qs)):
        weight = 1.0
        for path, q in zip(paths, qs):
            for i, x in enumerate(path):
                weight *= q(context + path[:i])[x]
        if weight == 0.0:
            continue

        def run(k: int, depth: int, first: Dist | None, prob: float, paths=paths) -> None:
            h, stages = _multipath_stage(p, qs, context, paths, k, depth, first)
            for (tau, weights, bonus), tau_prob in zip(stages, _block_tau_probs(h)):
                if tau_prob == 0.0:
                    continue
                j = None if bonus else _next_sharing(paths, k, tau)
                if j is not None:
                    run(j, tau, None if lossy else _normalise(weights), prob * tau_prob)
                    continue
                for y, y_prob in enumerate(_normalise(weights)):
                    if y_prob > 0.0:
                        outcomes[(tau, paths[k][:tau] + (y,))] += prob * tau_prob * y_prob

        run(0, 0, None, weight)
    return dict(outcomes)


def multipath_sequence_distribution(
    p: Table, qs: list[Table], context: tuple[int, ...], g: int, length: int, lossy: bool = False
) -> dict[tuple[int, ...], float]:
    """Exact distribution of the first `length` tokens over repeated multi-path iterations."""
    memo: dict[tuple[int, ...], dict] = {}
    result: dict[tuple[int, ...], float] = defaultdict(float)

    def expand(generated: tuple[int, ...], prob: float) -> None:
        if len(generated) >= length:
            result[generated[:length]] += prob
            return
        ctx = context + generated
        if ctx not in memo:
            emitted: dict[tuple[int, ...], float] = defaultdict(float)
            for (_, tokens), tokens_prob in multipath_outcomes(p, qs, ctx, g, lossy).items():
                emitted[tokens] += tokens_prob
            memo[ctx] = emitted
        for tokens, tokens_prob in memo[ctx].items():
            expand(generated + tokens, prob * tokens_prob)

    expand((), 1.0)
    return dict(result)


def multipath_block_efficiency(p: Table, qs: list[Table], context: tuple[int, ...], g: int) -> float:
    """E[tau + 1]: expected output tokens of one multi-path iteration (exact)."""
    return sum((tau + 1) * prob for (tau, _), prob in multipath_outcomes(p, qs, context, g).items())


def decide_multipath(
    p: Table, qs: list[Table], paths: list[tuple[int, ...]], eta: list[list[float]], u: float
) -> tuple[int, int, int, float]:
    """The oracle's decision for one row given its uniforms (context ()): (tau, kept path, Y,
    distance of u * total to the nearest CDF boundary), as `decide` for one path."""
    k, depth, first, kept = 0, 0, None, 0
    while True:
        h, stages = _multipath_stage(p, qs, (), paths, k, depth, first)
        accepted = max([i + 1 for i in range(len(h)) if eta[k][depth + i] < h[i]], default=0)
        tau, weights, bonus = stages[accepted]
        kept = k if accepted > 0 else kept
        j = None if bonus else _next_sharing(paths, k, tau)
        if j is None:
            break
        k, depth, first = j, tau, _normalise(weights)
    threshold = u * sum(weights)
    cdf = list(itertools.accumulate(weights))
    y = next(i for i, c in enumerate(cdf) if c > threshold)
    return tau, kept, y, min(abs(c - threshold) for c in cdf)
