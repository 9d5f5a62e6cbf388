"""The "goodput" draft-length schedule: each step, the g that maximises expected tokens per second.

    from distributed_spec.engine.goodput import GoodputPolicy, GoodputRow
    policy = GoodputPolicy(max_draft_len=4)
    g = policy.choose_step(rows, num_rows)                 # before the step; rows: GoodputRow per row
    policy.model_drafts, policy.ngram_rows(rows, g)        # which blocks serve the rows
    policy.observe_step(num_rows, g, seconds, model=...)   # after it (wall clock of the whole step)
    policy.observe_acceptance(num_draft_tokens, accepted_counts, from_ngram)

goodput(g) = sum over decoding rows of E[tokens of the row | g] / T(B, g), for g in {0, ..., max}:
- T(B, g) is the wall-clock time of a whole step with B rows in the batch and g draft tokens per
  row (draft forwards, the target's forward over g + 1 positions, verification, bookkeeping), measured
  online on this device: an exponential moving average per (B, g) cell (`StepCostModel`), times a
  drift all cells share (steps slow down as contexts grow, whatever g). A cell not
  measured yet is predicted from the nearest batch size that has it, scaled by the ratio of a cell
  both batch sizes share. A longer block never costs less than a shorter one measured at the same
  batch size (it does that step's work and more): where two cells disagree, the dearer reading
  stands, so a longer block measured low by noise does not win on it (capping the shorter cells
  instead tied them to the low reading, and ties went to the longer block). A step that also fed
  prompt chunks (rows joining the batch) costs more by about c x its prompt slots (rows x the
  longest chunk: a chunk pads every row of the forward to its length, so two rows joining together
  cost what one does); c is estimated within cells (`StepCostModel`), so every step updates its
  cell, also where rows join at nearly every step. Counted in prompt tokens, steps where several
  rows joined at once looked cheap per token (Ray, B = 4: c read 1.26 ms a token where one row's
  prompt cost ~1.8), and the cells that fed the most prompts were priced low (T(4, 3) 104 ms
  against 121 measured).
- E[tokens | g] = 1 + sum_{i <= g} a_i * f_row, with a_i the running fraction of rows that kept draft
  position i among those that verified it (`AcceptanceEstimate`, decayed so it follows the text),
  and f_row a per-row factor (the row's accepted tokens over what a_i predicted for it, shrunk to 1
  and decayed every step, so a row that stopped drafting after bad luck tries again later).
  Block verification keeps a prefix, so the expected kept length is the sum of these marginals.
  The choice counts `optimism` extra kept verdicts at each of the first two positions (an
  optimistic prior; deeper ones keep so little that the lift made the longest block win): with
  greedy choices on the mean, a few unlucky early rejections kept a B = 1 run at g = 0 for good
  (docs/RESULTS.md). Its lift shrinks as 1 / (verdicts): large while a rate rests on a few verdicts
  or old ones (the counts decay while nothing is drafted, so a rate at g = 0 regains it), a fraction
  of a percent once a batch verifies every step. The standard-error bound it replaces lifted a rate
  by ~0.04 on ~140 verdicts, and that tipped every near-tie towards drafting (Ray, B = 4).
- g = 0 is a plain decoding step (no draft forward at all); it wins where verification is dear
  (large batches on a CPU). The target scores a rectangular [B, g+1] block whatever each row uses,
  so every decoding row verifies the step's g (clipped to its budget): a longer block never lowers a
  row's expected tokens, and one g per step is the whole decision.
- The draft's debt: the draft does not run in g = 0 steps, so it falls behind (rows that joined,
  tokens kept since it last ran) and catches up before it next drafts (sides.DraftSide.catch_up).
  That catch-up is timed apart (the cells stay the steps' own cost) and priced here instead: a
  row's debt D_r (draft tokens owed) is paid once and lets it draft for its remaining R_r tokens,
  so each token it makes carries D_r / R_r of it. A drafting step therefore costs
  T(B, g) + c_catch x sum_r D_r E_r(g) / R_r, with c_catch the measured seconds per catch-up token
  (`CatchUpCost`). Without it a large batch that decodes without the draft paid a whole batch's
  prompts through the draft at each exploration step, and a row near its end paid for its whole
  prompt to draft its last few tokens.
- Exploration: a g never measured is tried first (a few steps at start-up: the probe), climbing
  from g = 0 and stopping once goodput falls from one g to the next (the longer blocks, the dearest
  steps at a large batch, are then not probed); every `explore_every` steps the best g's neighbour
  or a g measured too seldom at this batch size (any g), whichever has the oldest measurement, is
  re-measured, if it is predicted within `explore_margin` of the best (or too seldom measured to tell).
  Neither measures a g that could not win even at the least its step can cost (the next shorter
  block's cost, plus the draft's debt): where the draft owes a large batch its prompts, a g = 1 step
  cannot pay whatever it costs, and measuring it again only costs.
  Such a measurement step (`measuring`) drafts for `probe_rows` rows only (the scheduler picks the
  rows owing the draft least): the target's forward is [B, g + 1] whatever each row verifies, so it
  measures T(B, g) without making the draft catch up the whole batch (docs/design.md section 3).

- Two proposers (`verifier.proposer=model+ngram`, engine/proposers.py): each row is offered as a
  `GoodputRow` (its model limit and the length of its n-gram proposal). The n-gram blocks' verdicts
  have rates of their own (`ngram_acceptance`: a point mass keeps its token with the target's
  probability of it), and a step of n-gram blocks alone (no draft forward) has cost cells of its own,
  (B, g, False) beside the model's (B, g, True). Until one is measured at some batch size, it is
  priced as the model's step of its g less the draft's measured share of it (`StepCostModel.
  _without_draft`), so no probe measures an n-gram step that cannot pay. The options are g = 0,
  (g, the model drafts) and (g, n-gram blocks alone), each kind with its own climbing probe (which
  skips a g priced so); in a model step each row with a proposal takes whichever block it is
  expected to keep more of (`ngram_rows`).

Exact for every verifier: the choice depends on past steps only (their timings and verdicts), never
on the current block's target probabilities or uniforms, and on the rows' n-gram proposals (functions of
their tokens so far); tests/verify/test_oracle.py enumerates both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple


def cell_key(num_rows: int, g: int, model: bool) -> tuple[int, int, bool]:
    """A cost cell's key: (B, g, whether the draft model drafts); a g = 0 step drafts nothing."""
    return (num_rows, g, bool(model) and g > 0)


@dataclass
class _Cell:
    # Running means of the cell's steps: wall clock (net of the drift; robust, `StepCostModel`) and
    # their prompt slots.
    mean_seconds: float
    mean_prompt_slots: float
    count: int
    last_step: int
    # The first steps, (net seconds, prompt slots): the mean starts as their median.
    first_steps: list[tuple[float, float]] = field(default_factory=list)
    # Of a model cell: the running share of its steps' seconds the draft's forwards for the block
    # took (what an n-gram step of the same g skips; None: not reported).
    draft_share: float | None = None


class StepCostModel:
    """Seconds per step as a function of (rows in the batch B, draft tokens per row g), measured.

    A step that feeds prompt chunks (rows joining) costs more: seconds = T(B, g) + c x prompt slots
    (rows x the longest chunk of the forward). c is shared by all cells and estimated within cells
    (each step's deviation from its cell's running means, x against y: a fixed-effects regression),
    so every step, with or without prompts, updates its cell, and T(B, g) = mean seconds - c x mean
    prompt slots.

    Every step also grows slower as the rows' contexts lengthen, whatever its g. That drift is one
    factor shared by all cells (`log_drift`, moved first by each step's surprise against its cell);
    the cells hold costs net of it. The cell exploited every step and a cell last measured long ago
    are thus compared at today's drift: without it the fresh cell had drifted up and the stale one
    not, and a draft length that lost became the choice (docs/RESULTS.md, the batch drain).
    Only a cell measured within the last `fresh_steps` steps moves the drift: the drift since a stale
    cell's last step is already in `log_drift`, so what surprises in it is the cell's own error (two
    noisy start-up steps, say), and it goes to the cell. Split with the drift instead, half of each
    correction was undone by the exploited cell's next steps, and a cell measured twice at start-up
    kept its error through every re-measurement.

    A cell's mean is robust to a single slow step (the host's: a prompt joining, a slow spell; 3x a
    step's cost now and then): it starts as the median of its first `robust_samples` steps, and after
    that a step moves it by at most `clip_ratio` x what the cell predicts for that step. A plain mean
    let one such step in a cell's first few price it out of reach for good, or pull the drift that
    every other cell shares (`python -m scripts.simulate_goodput --outliers 0.03 3`, docs/RESULTS.md).
    """

    def __init__(
        self,
        smoothing: float = 0.05,
        decay: float = 0.98,
        drift_rate: float = 0.5,
        max_drift_step: float = 0.2,
        fresh_steps: int = 2,
        robust_samples: int = 6,
        clip_ratio: float = 1.3,
    ) -> None:
        self.smoothing = smoothing
        self.decay = decay
        self.drift_rate = drift_rate
        self.fresh_steps = fresh_steps
        self.robust_samples = robust_samples
        self.clip_ratio = clip_ratio
        # A step moves the drift by at most this much in log (22%): one slow step (the first of a run,
        # which feeds every prompt) must not rescale every cell.
        self.max_drift_step = max_drift_step
        # (B, g, whether the draft model drafted): an n-gram-only step of width g skips the draft's
        # forwards, so it is its own cell (g = 0 steps are always (B, 0, False)).
        self.cells: dict[tuple[int, int, bool], _Cell] = {}
        # log of the factor all cells share (1 at the start).
        self.log_drift = 0.0
        # Decayed sums of (prompt slots - cell mean) x (seconds - cell mean) and its square, seconds
        # net of the drift.
        self._within_xy = 0.0
        self._within_xx = 0.0

    @property
    def seconds_per_prompt_slot(self) -> float:
        """c: seconds per prompt slot a step feeds (0 until steps with different prompt loads)."""
        return self._net_seconds_per_slot * math.exp(self.log_drift)

    @property
    def _net_seconds_per_slot(self) -> float:
        if self._within_xx <= 1e-9:
            return 0.0
        return max(self._within_xy / self._within_xx, 0.0)

    def observe(
        self,
        num_rows: int,
        g: int,
        seconds: float,
        step: int,
        num_prompt_slots: int = 0,
        model: bool = True,
        draft_seconds: float | None = None,
    ) -> None:
        """A step's wall clock; num_prompt_slots: rows x the longest prompt chunk it fed (0: none);
        model: whether the draft model drafted in it (False: n-gram blocks only); draft_seconds: of
        those, the draft's forwards for the block (None: not measured)."""
        key = cell_key(num_rows, g, model)
        cell = self.cells.get(key)
        share = None
        if key[2] and draft_seconds is not None:
            share = min(max(draft_seconds / max(seconds, 1e-9), 0.0), 1.0)
        if cell is not None and step - cell.last_step <= self.fresh_steps:
            expected = self.seconds(cell) + self.seconds_per_prompt_slot * num_prompt_slots
            surprise = math.log(max(seconds, 1e-9) / max(expected, 1e-9))
            self.log_drift += self.drift_rate * min(max(surprise, -self.max_drift_step), self.max_drift_step)
        net = seconds / math.exp(self.log_drift)
        if cell is None:
            self.cells[key] = _Cell(
                net, float(num_prompt_slots), 1, step, [(net, float(num_prompt_slots))], draft_share=share
            )
            return
        dx = num_prompt_slots - cell.mean_prompt_slots
        if cell.count >= self.robust_samples:
            # What the cell predicts at this step's prompt load; a surprise beyond clip_ratio is cut.
            expected = max(cell.mean_seconds + self._net_seconds_per_slot * dx, 1e-9)
            net = min(max(net, expected / self.clip_ratio), expected * self.clip_ratio)
        dy = net - cell.mean_seconds
        self._within_xy = self.decay * self._within_xy + dx * dy
        self._within_xx = self.decay * self._within_xx + dx * dx
        # A running mean over the cell's first steps, then an exponential one: a cell's net cost is
        # steady (the drift carries the trend), so it may move slowly once known.
        rate = max(1.0 / (cell.count + 1), self.smoothing)
        cell.mean_prompt_slots += rate * dx
        cell.mean_seconds += rate * dy
        if share is not None:
            # The draft's share moves at the cell's own rate.
            cell.draft_share = share if cell.draft_share is None else cell.draft_share + rate * (share - cell.draft_share)
        if cell.count < self.robust_samples:
            cell.first_steps.append((net, float(num_prompt_slots)))
            cell.mean_seconds = self._median_of_first_steps(cell)
        cell.count += 1
        cell.last_step = step

    def _median_of_first_steps(self, cell: _Cell) -> float:
        """The median of a cell's first steps, each moved to the cell's mean prompt load (with c as
        known now): T(B, g) = mean seconds - c x mean slots is then their median net of prompts."""
        slope = self._net_seconds_per_slot
        ordered = sorted(net - slope * (slots - cell.mean_prompt_slots) for net, slots in cell.first_steps)
        middle = len(ordered) // 2
        return ordered[middle] if len(ordered) % 2 else 0.5 * (ordered[middle - 1] + ordered[middle])

    def seconds(self, cell: _Cell) -> float:
        """T(B, g) of a cell at today's drift: its mean step without the prompt slots' share."""
        net = max(cell.mean_seconds - self._net_seconds_per_slot * cell.mean_prompt_slots, 1e-9)
        return net * math.exp(self.log_drift)

    def measured(self, num_rows: int, g: int, model: bool = True) -> _Cell | None:
        return self.cells.get(cell_key(num_rows, g, model))

    def predict(self, num_rows: int, g: int, model: bool = True) -> float | None:
        """Predicted seconds of a (B, g) step (model: the draft model drafts in it); None when that
        kind of step was never measured at any B. At least every shorter block of its kind measured
        at this B (module docstring): a step's cost does not fall with g."""
        key = cell_key(num_rows, g, model)
        seconds = self._predict_cell(key)
        if seconds is None:
            return None
        shorter = [
            self.seconds(cell)
            for (rows, width, drafts), cell in self.cells.items()
            if rows == num_rows and width < g and (drafts == key[2] or width == 0)
        ]
        return max([seconds, *shorter])

    def _predict_cell(self, key: tuple[int, int, bool]) -> float | None:
        """The cell's own estimate, or one from the nearest batch size that measured its (g, kind); an
        n-gram step never measured at any batch size is the model's step of its g without the draft's
        share (`_without_draft`)."""
        cell = self.cells.get(key)
        if cell is not None:
            return self.seconds(cell)
        num_rows, g, model = key
        others = [rows for (rows, width, drafts) in self.cells if (width, drafts) == (g, model)]
        if not others:
            return None if model or g == 0 else self._without_draft(num_rows, g)
        nearest = min(others, key=lambda rows: (abs(math.log(rows / num_rows)), rows))
        base = self.seconds(self.cells[(nearest, g, model)])
        shared = [
            (width, drafts)
            for (rows, width, drafts) in self.cells
            if rows == num_rows and (nearest, width, drafts) in self.cells
        ]
        if not shared:
            # No cell at this B: every g scales alike, so the choice is the nearest B's.
            return base
        width, drafts = min(shared, key=lambda kind: (abs(kind[0] - g), kind[1] != model))
        return base * self.seconds(self.cells[(num_rows, width, drafts)]) / self.seconds(self.cells[(nearest, width, drafts)])

    def _without_draft(self, num_rows: int, g: int) -> float | None:
        """An n-gram step of width g priced as the model's step of that g less the draft's share of it
        (measured in the model's cell at this batch size, or at the nearest one that has it): the
        target's forward is [B, g + 1] in both. Without it each kind of step needed its own probe, two
        steps at each g that cost what a model step does at a large batch, where n-gram blocks seldom
        pay either (docs/RESULTS.md)."""
        model_seconds = self._predict_cell((num_rows, g, True))
        shares = [
            (rows, cell.draft_share)
            for (rows, width, drafts), cell in self.cells.items()
            if drafts and width == g and cell.draft_share is not None
        ]
        if model_seconds is None or not shares:
            return None
        _, share = min(shares, key=lambda item: (abs(math.log(item[0] / num_rows)), item[0]))
        return model_seconds * (1.0 - share)


class CatchUpCost:
    """c_catch: seconds per token the draft feeds when it catches up (decayed sums of measured
    catch-ups; 0 until one is seen)."""

    def __init__(self, decay: float = 0.9) -> None:
        self.decay = decay
        self._seconds = 0.0
        self._tokens = 0.0

    def observe(self, seconds: float, num_tokens: int) -> None:
        if num_tokens > 0:
            self._seconds = self.decay * self._seconds + seconds
            self._tokens = self.decay * self._tokens + num_tokens

    @property
    def seconds_per_token(self) -> float:
        return self._seconds / self._tokens if self._tokens > 0 else 0.0


class AcceptanceEstimate:
    """Decayed counts per draft position i: rows that verified position i, rows that kept it."""

    def __init__(self, max_draft_len: int, decay: float = 0.995, prior_weight: float = 1.0) -> None:
        self.decay = decay
        self.prior_weight = prior_weight
        self.num_verified = [0.0] * max_draft_len
        self.num_kept = [0.0] * max_draft_len

    def observe(self, num_draft_tokens: list[int], accepted_counts: list[int]) -> None:
        self.num_verified = [count * self.decay for count in self.num_verified]
        self.num_kept = [count * self.decay for count in self.num_kept]
        for num_drafted, num_accepted in zip(num_draft_tokens, accepted_counts):
            for position in range(min(num_drafted, len(self.num_verified))):
                self.num_verified[position] += 1.0
                self.num_kept[position] += float(position < num_accepted)

    def rates(self, optimism: float = 0.0, optimistic_positions: int | None = None) -> list[float]:
        """[max_draft_len] a_i: P(position i kept | verified). Unseen positions lean on the last
        seen rate (a weak prior: half of the previous position's). optimism > 0 counts that many more
        kept verdicts at each of the first `optimistic_positions` positions (None: all): few or old
        verdicts then favour drafting, so a run of early rejections cannot stop a policy from ever
        drafting again, while many recent ones barely move (a lift of (1 - a_i) x optimism / verdicts)."""
        rates, previous = [], 0.5
        for position, (verified, kept) in enumerate(zip(self.num_verified, self.num_kept)):
            prior = 0.5 * previous if rates else previous
            lift = optimism if optimistic_positions is None or position < optimistic_positions else 0.0
            rate = (kept + self.prior_weight * prior + lift) / (verified + self.prior_weight + lift)
            rates.append(min(rate, previous if rates else 1.0))
            previous = rates[-1]
        return rates


@dataclass
class RowAcceptance:
    """A row's own record: accepted draft tokens against what the global rates predicted for it."""

    num_accepted: float = 0.0
    num_predicted: float = 0.0
    # Pseudo-tokens pulling the row's factor towards 1 while it has little history.
    shrinkage: float = 4.0
    # Per step, old evidence fades: a row at g = 0 gathers none, so its factor drifts back to 1.
    decay: float = 0.9

    def factor(self) -> float:
        return (self.num_accepted + self.shrinkage) / (self.num_predicted + self.shrinkage)

    def observe(self, num_accepted: int, num_predicted: float) -> None:
        self.num_accepted = self.decay * self.num_accepted + num_accepted
        self.num_predicted = self.decay * self.num_predicted + num_predicted


class GoodputRow(NamedTuple):
    """A decoding row as the policy sees it (a plain (max_drafts, record) pair is one too)."""

    # Draft tokens the draft model may propose for it (its token budget; 0 without a draft model).
    max_drafts: int
    record: RowAcceptance
    # Tokens of its n-gram proposal this step (0: no match, or no n-gram proposer).
    max_ngram: int = 0


Option = tuple[int, bool]


def _cumulative(rates: list[float]) -> list[float]:
    """[n + 1]: 0, a_1, a_1 + a_2, ...: the expected kept length of a block of each length."""
    cumulative = [0.0]
    for rate in rates:
        cumulative.append(cumulative[-1] + rate)
    return cumulative


@dataclass
class GoodputPolicy:
    """Picks each step's draft length g in {0, ..., max_draft_len} to maximise tokens per second."""

    max_draft_len: int
    # Re-measure a neighbour of the best g every this many steps (0: never after start-up), if its
    # predicted goodput is within this fraction of the best's.
    explore_every: int = 24
    explore_margin: float = 0.05
    # Measurements of a cell before it counts as known at start-up.
    min_samples: int = 2
    # A neighbour measured at this batch size, but fewer times than this, is re-measured whatever its
    # predicted goodput: two start-up steps (~15% noise each in Ray) can misprice a cell by 20%,
    # and explore_margin alone then kept it out of reach for good.
    confident_samples: int = 6
    # Rows that draft in a measurement step (the probe, exploration); the others verify no draft, so
    # the draft catches up these rows alone (scheduler.Scheduler._probe_rows).
    probe_rows: int = 4
    # Extra kept verdicts per draft position when choosing (AcceptanceEstimate.rates). With 1, six
    # early rejections at B = 1 kept two thirds of a 300-step run at g = 0 (tests/engine/test_goodput.py).
    optimism: float = 2.0
    # Only the first positions get it: they decide whether drafting pays at all. Deeper ones keep
    # little (this pair: 0.02-0.07 of rows at position 3), and a lift of the rate's own size there
    # made the longest block look best (g = 3 read 1.66-1.72 tokens per row against a true 1.48 at
    # B = 1; docs/RESULTS.md).
    optimistic_positions: int | None = 2
    cost: StepCostModel = field(default_factory=StepCostModel)
    catch_up: CatchUpCost = field(default_factory=CatchUpCost)
    # Kept draft positions of the draft model's blocks, and of n-gram blocks (a point mass keeps
    # its token with the target's probability of it: a rate of its own).
    acceptance: AcceptanceEstimate | None = None
    ngram_acceptance: AcceptanceEstimate | None = None
    num_steps: int = 0
    # The last exploitation step's choice, (g, whether the draft model drafts): the neighbour
    # exploration moves around it.
    best_option: Option = (0, False)
    # Whether the last choice measures a cell (the probe, exploration) rather than exploits the best.
    measuring: bool = False
    # Whether the draft model drafts in the chosen step (False: n-gram blocks only, or g = 0).
    model_drafts: bool = True

    def __post_init__(self) -> None:
        if self.acceptance is None:
            self.acceptance = AcceptanceEstimate(self.max_draft_len)
        if self.ngram_acceptance is None:
            self.ngram_acceptance = AcceptanceEstimate(self.max_draft_len)

    @property
    def best(self) -> int:
        """The g of the last exploitation step."""
        return self.best_option[0]

    def _row_choices(self, rows: list[GoodputRow], g: int, model: bool) -> list[tuple[float, bool]]:
        """Per row, for a g step (model: the draft model drafts in it): its expected tokens, and
        whether its n-gram block serves it (where it keeps more than the model's block is expected
        to; without the model, wherever it has one). If no row would take the model's block in a
        model step, every row takes it: such a step must run the model, or it is an n-gram step."""
        model_cumulative = _cumulative(self.acceptance.rates(self.optimism, self.optimistic_positions))
        ngram_cumulative = _cumulative(self.ngram_acceptance.rates(self.optimism, self.optimistic_positions))

        def tokens(num_drafts: int, cumulative: list[float], record: RowAcceptance) -> float:
            return 1.0 + min(float(num_drafts), record.factor() * cumulative[num_drafts])

        choices = []
        for row in rows:
            from_model = tokens(min(g, row.max_drafts) if model else 0, model_cumulative, row.record)
            num_ngram = min(g, row.max_ngram)
            from_ngram = tokens(num_ngram, ngram_cumulative, row.record)
            use_ngram = num_ngram > 0 and from_ngram >= from_model
            choices.append((from_ngram if use_ngram else from_model, use_ngram))
        if model and g > 0 and all(use_ngram for _, use_ngram in choices):
            return [(tokens(min(g, row.max_drafts), model_cumulative, row.record), False) for row in rows]
        return choices

    def expected_tokens(self, rows: list[tuple], g: int, model: bool = True) -> float:
        """Expected tokens of a step over `rows` (GoodputRow, or (max_drafts, record) pairs), with
        the acceptance rates' optimistic prior (`optimism`); model: the draft model drafts."""
        return sum(tokens for tokens, _ in self._row_choices([GoodputRow(*row) for row in rows], g, model))

    def ngram_rows(self, rows: list[tuple], g: int) -> list[bool]:
        """Per row of the step just chosen (choose_step's rows and g): whether its n-gram block serves it."""
        return [use for _, use in self._row_choices([GoodputRow(*row) for row in rows], g, self.model_drafts)]

    def goodput(
        self, rows: list[tuple], num_rows: int, g: int, debt_per_token: float = 0.0, model: bool = True
    ) -> float | None:
        """Expected tokens per second of a g step; debt_per_token: sum over rows of D_r / R_r;
        model: the draft model drafts in it (False: n-gram blocks only)."""
        return self._goodput_at(rows, g, self.cost.predict(num_rows, g, model), debt_per_token, model)

    def _goodput_at(
        self, rows: list[tuple], g: int, seconds: float | None, debt_per_token: float, model: bool = True
    ) -> float | None:
        """Expected tokens per second of a g step that costs `seconds` before the draft's debt."""
        if seconds is None:
            return None
        tokens = self.expected_tokens(rows, g, model)
        if g > 0 and model and rows:
            # The rows' share of the draft's catch-up (module docstring), E_r taken as the mean.
            seconds += self.catch_up.seconds_per_token * debt_per_token * tokens / len(rows)
        return tokens / max(seconds, 1e-9)

    def _could_win(
        self, rows: list[tuple], num_rows: int, option: Option, best_score: float | None, debt_per_token: float
    ) -> bool:
        """Whether the option could beat best_score even at the least its step can cost: no less than
        the next shorter block of its kind at this batch size (a longer block does that step's work and
        more), plus the draft's debt. A cell that cannot is not worth a measurement step, however few
        times it was measured: at B = 32 the draft owes every row its prompt, and the probe's second
        g = 1 step and the re-measurements are steps at ~1.8x a plain one's cost (docs/RESULTS.md)."""
        g, model = option
        if g == 0 or best_score is None:
            return True
        bound = self._goodput_at(rows, g, self.cost.predict(num_rows, g - 1, model), debt_per_token, model)
        return bound is None or bound >= best_score

    def choose_step(self, rows: list[tuple], num_rows: int, debt_per_token: float = 0.0) -> int:
        """The step's g. rows: per decoding row, a GoodputRow (or a (max_drafts, record) pair: the
        draft model alone); num_rows: rows in the forward (decoding or not); debt_per_token: sum over
        the decoding rows of (draft tokens the row owes) / (tokens it has left), the draft's debt
        (module docstring). Sets `model_drafts` (whether the draft model drafts; `ngram_rows` says
        which rows an n-gram block serves) and `measuring`."""
        self.num_steps += 1
        self.measuring = False
        self.model_drafts = False
        if not rows:
            return 0
        rows = [GoodputRow(*row) for row in rows]
        options: list[Option] = [(0, False)]
        for model, longest in self._kinds(rows):
            to_measure, ladder = self._climb(rows, num_rows, model, longest, debt_per_token)
            if to_measure is not None:
                return self._take((to_measure, model), measuring=True)
            options += [(g, model) for g in ladder]
        scores = {option: self.goodput(rows, num_rows, option[0], debt_per_token, option[1]) for option in options}
        best = max(options, key=lambda option: (scores[option] or 0.0, -option[0], not option[1]))
        self.best_option = best
        if self.explore_every and self.num_steps % self.explore_every == 0:
            # Re-measure a neighbour of the best, so a peak that moves is followed step by step; not one
            # predicted to lose by more than explore_margin (the draft's debt included): at a large batch
            # each such step cost a whole step's worth of tokens, and the optimistic acceptance prior
            # already brings a neighbour back into reach once its verdicts grow old. Any g measured here
            # fewer than confident_samples times is a candidate too, neighbour or not: a g = 0 cell
            # priced high by its two start-up steps was never re-measured while the best sat at g = 3,
            # and the run stayed there (docs/RESULTS.md).
            pool = [
                option
                for option in options
                if option != best and (_neighbours(option, best) or self._seldom_measured(num_rows, option))
            ]
            to_measure = [
                option for option in pool if self._within_reach(rows, num_rows, option, scores[best], debt_per_token)
            ]
            if to_measure:
                return self._take(min(to_measure, key=self._last_measured(num_rows)), measuring=True)
        return self._take(best)

    def _kinds(self, rows: list[GoodputRow]) -> list[tuple[bool, int]]:
        """The kinds of drafting step open to these rows, each with its longest g: (True, ...) where
        the draft model may draft (its rows' n-gram blocks may still serve them), (False, ...) where
        some row has an n-gram block (the model stays idle)."""
        longest_model = max(row.max_drafts for row in rows)
        longest_ngram = max(row.max_ngram for row in rows)
        kinds = []
        if longest_model > 0:
            kinds.append((True, min(self.max_draft_len, max(longest_model, longest_ngram))))
        if longest_ngram > 0:
            kinds.append((False, min(self.max_draft_len, longest_ngram)))
        return kinds

    def _climb(
        self, rows: list[GoodputRow], num_rows: int, model: bool, longest: int, debt_per_token: float
    ) -> tuple[int | None, list[int]]:
        """The probe of one kind of step: (a g to measure now, []) or (None, the g >= 1 to choose
        from). g is measured (min_samples steps at this batch size) only while goodput still rises
        from g - 2 to g - 1: goodput in g rises to one peak and falls, so past a fall the longer
        blocks, the dearest steps to probe, are not tried at this batch size."""
        for g in range(longest + 1):
            if self._known(num_rows, (g, model)):
                continue
            if g >= 2 and not self._rising(rows, num_rows, g - 1, model, debt_per_token):
                return None, list(range(1, g))
            shorter = [self.goodput(rows, num_rows, width, debt_per_token, model) for width in range(g)]
            best_shorter = max((score for score in shorter if score is not None), default=None)
            if not self._could_win(rows, num_rows, (g, model), best_shorter, debt_per_token):
                return None, list(range(1, g))
            return g, []
        return None, list(range(1, longest + 1))

    def _take(self, option: Option, measuring: bool = False) -> int:
        self.measuring = measuring
        self.model_drafts = option[1] and option[0] > 0
        return option[0]

    def _seldom_measured(self, num_rows: int, option: Option) -> bool:
        """Whether the option was measured at this batch size, but fewer than confident_samples times."""
        cell = self.cost.measured(num_rows, *option)
        return cell is not None and cell.count < self.confident_samples

    def _known(self, num_rows: int, option: Option) -> bool:
        """Whether the option's cost at this batch size counts as known (predicted from another batch
        size, or measured here min_samples times)."""
        cell = self.cost.measured(num_rows, *option)
        if cell is not None:
            return cell.count >= self.min_samples
        return self.cost.predict(num_rows, *option) is not None

    def _within_reach(
        self, rows: list[GoodputRow], num_rows: int, option: Option, best_score: float, debt_per_token: float
    ) -> bool:
        """Whether the option's predicted goodput is within explore_margin of the best's, or measured
        at this batch size too seldom to tell (confident_samples) while it could still win
        (`_could_win`). A g never measured at this B is judged on its prediction: a draining batch
        meets a new B at every finish, and re-measuring each one made goodput draft in a fifth of the
        steps at B = 16 and 32."""
        cell = self.cost.measured(num_rows, *option)
        if cell is not None and cell.count < self.confident_samples:
            return self._could_win(rows, num_rows, option, best_score, debt_per_token)
        score = self.goodput(rows, num_rows, option[0], debt_per_token, option[1])
        return score is None or score >= (1.0 - self.explore_margin) * best_score

    def _rising(self, rows: list[GoodputRow], num_rows: int, g: int, model: bool, debt_per_token: float) -> bool:
        """Whether goodput rises from g - 1 to g (both known), for steps of one kind."""
        upper = self.goodput(rows, num_rows, g, debt_per_token, model)
        lower = self.goodput(rows, num_rows, g - 1, debt_per_token, model)
        return upper is not None and lower is not None and upper >= lower

    def _last_measured(self, num_rows: int):
        def key(option: Option) -> int:
            cell = self.cost.measured(num_rows, *option)
            return -1 if cell is None else cell.last_step

        return key

    def observe_step(
        self,
        num_rows: int,
        g: int,
        seconds: float,
        num_prompt_slots: int = 0,
        model: bool = True,
        draft_seconds: float | None = None,
    ) -> None:
        """Wall-clock seconds of a step; num_prompt_slots: rows x the longest prompt chunk it fed;
        model: whether the draft model drafted in it; draft_seconds: its forwards for the block."""
        self.cost.observe(num_rows, g, seconds, self.num_steps, num_prompt_slots, model, draft_seconds)

    def observe_catch_up(self, seconds: float, num_tokens: int) -> None:
        """A step's catch-up forwards of the draft: seconds and the tokens they fed."""
        self.catch_up.observe(seconds, num_tokens)

    def observe_acceptance(
        self, num_draft_tokens: list[int], accepted_counts: list[int], from_ngram: list[bool] | None = None
    ) -> None:
        """Verdicts of a step's decoding rows; from_ngram: rows whose block an n-gram proposal made."""
        if from_ngram is None or not any(from_ngram):
            self.acceptance.observe(num_draft_tokens, accepted_counts)
            return
        for estimate, source in ((self.acceptance, False), (self.ngram_acceptance, True)):
            chosen = [index for index, ngram in enumerate(from_ngram) if ngram == source]
            estimate.observe([num_draft_tokens[index] for index in chosen], [accepted_counts[index] for index in chosen])

    def predicted_accepted(self, num_drafts: int, ngram: bool = False) -> float:
        """What the global rates predict a row keeps of num_drafts (for its record); ngram: of an
        n-gram block."""
        return sum((self.ngram_acceptance if ngram else self.acceptance).rates()[:num_drafts])


def _neighbours(option: Option, other: Option) -> bool:
    """Whether two options are one draft token apart in the same kind of step (g = 0 neighbours both)."""
    return abs(option[0] - other[0]) == 1 and (option[1] == other[1] or 0 in (option[0], other[0]))
