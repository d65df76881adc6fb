"""Stopping a timed session on confidence (runner/skillrun/execute/confidence.py), on the simulated GPU.

The simulation (tests/simgpu.py) gives every kernel a known duration with run-to-run jitter, so a
test can compare what the rule decides with the truth and with what a fixed count of rounds says.
"""
from __future__ import annotations

import random

import pytest

from simgpu import SimGPU
from skillrun.evidence.verdict import speed_label
from skillrun.execute import confidence, referee, timing
from skillrun.execute.stats import aa_noise, percentile

SAMPLE_US = 8000.0  # a graph-replay sample of about 8 ms, as the runner takes on the H200


def _session(ratio: float, *, seed: int, stop: bool, jitter: float = 0.015, claim: float | None = None,
             rounds: int = 40, observe: int = 0, observer=None):
    """Port, its production baseline (and the A/A copy) and one other reference, held and loaded as the
    runner times them; ``ratio`` = baseline time / port time (the speedup)."""
    gpu = SimGPU(launch_us=20.0, jitter=jitter, seed=seed)
    slots = {"port": [lambda: gpu.kernel(SAMPLE_US / ratio)], "baseline": [lambda: gpu.kernel(SAMPLE_US)],
             "baseline#aa": [lambda: gpu.kernel(SAMPLE_US)], "alt:slow": [lambda: gpu.kernel(SAMPLE_US * 1.6)]}
    rule = confidence.StopRule(port="port", decisive=["baseline", "alt:slow"], aa="baseline", claim=claim) if stop else None
    h0 = gpu.h
    t = timing.interleave(slots, timing.EventTimer(device=gpu, sustain_ms=50.0), 400 if stop else rounds, 10,
                          after_round=lambda info: gpu.host_work(20_000.0), rng=random.Random(seed), stop=rule,
                          horizon=rule.horizon(len(slots)) if rule else None, observe=observe, observer=observer)
    s = t["samples"]
    aa = aa_noise(s["baseline"], s["baseline#aa"])
    noise = max(aa["aa_noise_pct"], aa["aa_medians_pct"])
    r = percentile(s["baseline"], 50) / percentile(s["port"], 50)
    return {"t": t, "rule": rule, "seconds": (gpu.h - h0) / 1e6, "verdict": speed_label(r, noise), "ratio": r}


def test_t_quantiles_match_the_table():
    for df, want in [(1, 12.706), (2, 4.303), (3, 3.182), (5, 2.571), (10, 2.228), (30, 2.042), (40, 2.021), (120, 1.980)]:
        assert confidence.t975(df) == pytest.approx(want, rel=0.005)


@pytest.mark.parametrize("ratio", [0.78, 0.87, 1.19, 2.1])
def test_a_clear_shape_stops_early_with_the_verdict_of_the_fixed_count(ratio):
    for seed in (0, 1):
        fixed = _session(ratio, seed=seed, stop=False)
        conf = _session(ratio, seed=seed, stop=True)
        assert conf["verdict"] == fixed["verdict"]
        assert conf["t"]["rounds"] < fixed["t"]["rounds"] and conf["seconds"] < fixed["seconds"]
        assert conf["t"]["rounds"] % conf["t"]["block"] == 0  # whole blocks: positions stay balanced
        assert not conf["rule"].decision["close"]


def test_a_quiet_shape_stops_as_soon_as_the_interval_is_narrow():
    conf = _session(0.8, seed=3, stop=True, jitter=0.002)
    rule = conf["rule"]
    assert rule.decision["why"] == "confident"
    assert conf["t"]["rounds"] == rule.horizon(conf["t"]["block"])  # at its minimum
    iv = rule.decision["refs"]["baseline"]
    assert iv["half_width_pct"] <= rule.decision["target_pct"] and iv["low"] < 0.8 < iv["high"]


def test_a_close_call_escalates_and_runs_longer_than_a_clear_one():
    clear = _session(0.8, seed=1, stop=True)
    close = _session(1.003, seed=1, stop=True)
    rec = close["rule"].record(close["t"]["block"])
    assert rec["escalated"] and close["rule"].history[0]["close"] == ["baseline"]
    assert close["t"]["rounds"] > clear["t"]["rounds"]
    assert close["rule"].decision["why"] in ("confident", "cap on a close call")
    # it ran on past the ordinary cap, and no further than the close-call cap allows (one block over)
    assert close["rule"].decision["seconds"] > close["rule"].cap_s
    assert close["rule"].decision["seconds"] < close["rule"].cap_close_s + 2.0


def test_the_cards_claim_is_a_threshold_too():
    plain = _session(1.15, seed=2, stop=True)
    claimed = _session(1.15, seed=2, stop=True, claim=1.15)
    assert not plain["rule"].record(plain["t"]["block"])["escalated"]
    assert claimed["rule"].record(claimed["t"]["block"])["escalated"]
    assert 1.15 in claimed["rule"].history[0]["refs"]["baseline"]["straddles"]


def test_the_profiled_rounds_all_fall_inside_the_minimum_when_the_session_stops_early():
    from contextlib import contextmanager

    @contextmanager
    def observer(slot):
        yield

    conf = _session(0.8, seed=5, stop=True, jitter=0.002, observe=3, observer=observer)
    t, rule = conf["t"], conf["rule"]
    assert rule.decision["why"] == "confident"
    assert len(t["observed_rounds"]) == 3
    assert max(t["observed_rounds"]) < rule.horizon(t["block"]) + 3


def test_the_referee_plans_its_checks_over_the_rounds_a_confident_session_is_sure_to_run():
    slots = [{"slot": "port"}, {"slot": "baseline"}, {"slot": "alt:x"}]
    task = {"slots": slots, "port_slot": "port", "aa_slot": "baseline",
            "timing": {"rounds": 200, "check_timed": 16, "stop": {"rule": "confidence", "decisive": ["baseline"]}}}
    # 3 slots, the A/A copy and the references' canary: blocks of 5; at least 3 blocks and 12 rounds
    assert confidence.plan_rounds(task) == 15
    # a session with no reference (the port and its peers only) has no canary: blocks of 3
    lone = {"slots": [{"slot": "port"}, {"slot": "peer"}], "port_slot": "port", "peers": ["peer"], "aa_slot": "port",
            "timing": {"rounds": 200, "stop": {"rule": "confidence", "decisive": ["peer"]}}}
    assert confidence.plan_rounds(lone) == 12
    assert confidence.plan_rounds({**task, "timing": {"rounds": 200}}) is None  # a fixed count: the referee's old plan
    assert confidence.plan_rounds({**task, "timing": {**task["timing"], "rounds": 8}}) == 8


def test_a_referee_of_a_confident_session_checks_all_its_rounds_early_and_keeps_checking_past_them(tmp_path):
    import torch

    from skillrun.execute import integrity

    t = {"kind": "session", "problem": "defects.problem", "shape": {"M": 8, "N": 8, "K": 16}, "device": "cpu",
         "slots": [{"slot": "port"}, {"slot": "baseline"}], "port_slot": "port", "aa_slot": "baseline", "peers": [],
         "timing": {"rounds": 400, "check_timed": 6, "stop": {"rule": "confidence", "decisive": ["baseline"]}}}
    ref = referee.Referee(t, tmp_path)  # in the parent, answering the session's requests (session.py)
    try:
        assert ref.rounds == 12 and ref.k_target == 6  # blocks of 4 (the canary too), at least 12 rounds
        assert "seed" in ref.answer({"op": "set", "j": 0})
        out = torch.zeros(8, 8, dtype=torch.float16)
        checked = []
        for i in range(60):
            ans = ref.answer({"op": "round", "kind": "timed", "index": i, "read": 0, "last": False,
                              "commits": {"port": integrity.output_digest(out), "baseline": integrity.output_digest(out)}})
            assert "error" not in ans, ans
            if ans["check"]:
                checked.append(i)
                ref.answer({"op": "handed", "token": ans["token"], "foreign": ["port", "baseline"]})
        assert len([i for i in checked if i < 12]) == 6  # all six within the rounds it was sure to see
        late = [i for i in checked if i >= 12]
        assert 5 <= len(late) <= 45  # and at about the same rate (6 in 12) after them: late rounds are not safe
    finally:
        ref.stop()


def test_a_slot_that_synchronizes_inside_its_call_gets_no_spin_and_the_host_waits_through_none():
    """Most slots of a MoE shape read routing back inside their call: each per-launch spin then grew to
    its 200 ms cap and the host waited through every one (26-44 s per shape on the H200). A slot seen
    synchronizing twice gets no spin; the others keep theirs, and their times stay true."""
    gpu = SimGPU()
    slots = _synced_interleave_slots(gpu)
    timer = timing.EventTimer(device=gpu, sustain_ms=0.0)
    t = timing.interleave(slots, timer, 40, 2, after_round=lambda info: gpu.host_work(500.0), rng=random.Random(2))
    assert timer.launch_hold and set(t["unspun"]) == {"mslk", "loop", "loop#aa"}
    assert timer.hold_us < 5_000  # never grown towards the 200 ms cap
    assert percentile(t["samples"]["port"], 50) * 1e3 == pytest.approx(100.0, rel=0.01)
    # the last 20 rounds cost the host about their own work, not spins: ~0.5 ms gap + ~1 ms of kernels
    spins_late = gpu.spins
    h = gpu.h
    timing.interleave(slots, timer, 20, 0, after_round=lambda info: gpu.host_work(500.0), rng=random.Random(3))
    assert (gpu.h - h) / 20 < 3_000
    assert gpu.spins - spins_late <= 2 * 20 + 2  # the round's hold and the port's own spin, nothing per synchronizing slot


def test_before_the_fix_the_spins_before_synchronizing_slots_grew_to_their_cap():
    """The teeth of the test above: the same slots with the per-slot exemption turned off."""
    gpu = SimGPU()
    slots = _synced_interleave_slots(gpu)
    timer = timing.EventTimer(device=gpu, sustain_ms=0.0)
    timer.UNSPIN_AFTER = 10 ** 9
    timing.interleave(slots, timer, 40, 2, after_round=lambda info: gpu.host_work(500.0), rng=random.Random(2))
    assert timer.hold_us >= 100_000


def _synced_interleave_slots(gpu) -> dict:
    """_syncing_slots as timing.interleave takes them (a list of calls per slot), without the canary."""
    return {n: [fn] for n, fn in _syncing_slots(gpu).items() if n != "canary"}


def _syncing_slots(gpu):
    def syncing(us):
        def fn():
            gpu.kernel(us / 2)
            gpu.synchronize()  # a count read back on the host
            gpu.kernel(us / 2)
        return fn

    return {"port": lambda: gpu.kernel(100.0), "mslk": syncing(300.0), "loop": syncing(400.0),
            "loop#aa": syncing(400.0), "canary": lambda: gpu.kernel(200.0)}


def _as_the_session_does(gpu, launch, rounds: int, seed: int = 2):
    """The parent's order (balanced blocks), each launch a request to its slot's process: timed there as a
    round of its own, with the request's round trip on the host between launches."""
    slots = _syncing_slots(gpu)
    orders = timing.balanced_orders(list(slots), random.Random(seed))
    ms: dict[str, list[float]] = {n: [] for n in slots}
    for _ in range(rounds):
        for n in next(orders):
            gpu.host_work(300.0)  # the request's round trip, the commitment
            ms[n].append(launch(n, slots[n]))
    return ms


def test_in_the_sessions_slot_processes_a_synchronizing_slot_loses_its_spin_and_no_other_slot_waits():
    """On main's engine every launch is a round of its own in its slot's process (slot_server.py). With one
    timer per process, a reference that reads counts back grew the hold before every launch of every slot
    of the references' process; with a timer per slot (timing.LaunchTimers) only its own steps change."""
    gpu = SimGPU()
    timers = timing.LaunchTimers.like(timing.EventTimer(device=gpu, sustain_ms=0.0))
    _as_the_session_does(gpu, lambda n, fn: timers.launch(n, fn)[0], 40)
    assert {n for n, t in timers.timers.items() if t.unspun} == {"mslk", "loop", "loop#aa"}
    assert all(n in timers.timers[n].unspun for n in ("mslk", "loop", "loop#aa"))
    assert max(t.hold_us for t in timers.timers.values()) < 5_000  # no hold grew towards the 200 ms cap
    assert not timers.timers["port"].launch_hold and not timers.timers["canary"].launch_hold
    # the next 20 rounds: a spin before each launch of the port and the canary, none before the others,
    # and the host's time per round is the work and the round trips, not spins
    spins, h = gpu.spins, gpu.h
    ms = _as_the_session_does(gpu, lambda n, fn: timers.launch(n, fn)[0], 20, seed=3)
    assert gpu.spins - spins == 2 * 20
    assert (gpu.h - h) / 20 < 5 * 300.0 + 2_500
    assert percentile(ms["port"], 50) * 1e3 == pytest.approx(100.0, rel=0.01)
    _, info = timers.launch("mslk", _syncing_slots(gpu)["mslk"])
    assert info["unspun"] and info["self_synced"] and info["launch_hold"]
    _, info = timers.launch("port", _syncing_slots(gpu)["port"])
    assert not info["unspun"] and not info["self_synced"] and info["held"]


def test_with_one_timer_for_a_process_the_synchronizing_reference_grew_every_slots_hold():
    """The teeth of the test above: main's slot process before the integration, one timer for all its slots."""
    gpu = SimGPU()
    timer = timing.EventTimer(device=gpu, sustain_ms=0.0)

    def launch(n, fn):
        timer.begin_round()
        read = timer.measure(fn)
        timer.end_round()
        return read()

    _as_the_session_does(gpu, launch, 40)
    h = gpu.h
    _as_the_session_does(gpu, launch, 20, seed=3)
    assert timer.hold_us >= 100_000 and (gpu.h - h) / 20 > 100_000  # 2 s a round against 3.7 ms above
