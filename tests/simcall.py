"""A simulated device call: what one measured shape costs the GPU, phase by phase.

The timed phase is the real engine as the integrated runner runs it: the parent's timing loop
(timing.interleave over session.ParentClock, the stop rule of confidence.py, the sustained load) making
every launch a request to its slot's process, which times it as a round of its own behind its own hold
(timing.LaunchTimers) on the simulated GPU of simgpu.py, with graph-replay samples of about 8 ms and
run-to-run jitter; the references' canary is a slot of every round. Each request costs the host its round
trip and the launch's commitment (the output copied to the host and hashed, SHA-256: ``commit_s_per_mib``
of a 32 MiB output, a 4096x4096 bf16 product; the largest block-scale shape's is 128 MiB). Everything around it is a cost model (the table below): seconds for a process
to start and import torch, for a Triton compile, for the in-process work of a shape's tasks. The
numbers are assumptions, not measurements; the model is checked against what the H200 logs do show
(50-78 s per GEMM shape when every task started a process of its own: benchmarks/results/
validate_0d3d55c.json, validate_fc67a32.json), and the tests ask what the same model says of a
session that serves many shapes and stops on confidence.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from simgpu import SimGPU
from skillrun.evidence.verdict import speed_label
from skillrun.execute import confidence, session, timing
from skillrun.execute.stats import aa_noise, percentile

# Seconds; a model of an H200 host. Where a number comes from a log it says so; the rest are guesses.
COSTS = {
    # a fresh process: interpreter and runner modules, then torch, a CUDA context, the problem and kernel
    # modules; together ~4.5 s (the bench's watchdog probed 2 variants in a fresh child in 4.5-5.5 s,
    # benchmarks/results/device_timing_0d3d55c.log)
    "process_start": 1.0,
    "imports": 3.5,
    "compile_cold": 5.0,      # a Triton port variant compiled with nothing cached (same log: 4 variants, 4.9 s, in parallel)
    # the port's kernel from Triton's on-disk cache in a process that already runs Triton (guess; a fresh
    # probe child's first port launch took 0.68-0.83 s, its launcher stub and driver start included:
    # watchdog.probes in validation/triton_fp8_blockscale_gemm_sm90/20261202T0357*, T0658*)
    "compile_cached": 0.3,
    "task_on_server": 0.05,   # a task handed to a running server (measured on the CPU: 30-50 ms round trip)
    # one parity seed of one candidate: inputs, poisoned output, run, hand-over (guess; the runs themselves
    # took 0.1-2 ms in the same artifacts, parity.*.seeds.run_s)
    "seed": 0.05,
    "judge": 0.2,             # guess: one judge task (the fp32 oracle of the seeds, the comparison)
    "probe_slot": 0.05,       # guess: the watchdog's two launches of one warm slot
    "session_setup": 0.9,     # guess: builds, input sets (>= 2x L2), output aliasing, graph capture
    "profile_slot": 0.1,      # guess: one profiler session around a slot's launch (names check, observed rounds)
    # between timed rounds: checksums, commitments and new input content every round, and the outputs of
    # the rounds the referee checks handed over and judged; fitted to the GEMM artifacts' notes (1-4.6 s,
    # about 2 s, for 42 rounds with 16 checked: validation/triton_fp8_*_sm90/20261202T0*)
    "between_rounds": 0.03,
    "checked_round": 0.05,
    # Per launch on the integrated engine (guesses: it has not run on a GPU yet): the parent's request and reply
    # over a Unix socket, freezing the port's process around a reference's launch, and the commitment (a device
    # to host copy and a SHA-256 of the output on 8 threads, about 4 GiB/s together).
    "request": 0.0008,
    "commit_s_per_mib": 0.00025,
    "output_mib": 32.0,
}


@dataclass
class ShapeCost:
    phases: dict[str, float] = field(default_factory=dict)
    verdict: str = ""
    ratio: float = 0.0
    rounds: int = 0
    escalated: bool = False
    why: str | None = None

    @property
    def total(self) -> float:
        return sum(self.phases.values())

    def add(self, phase: str, s: float) -> None:
        self.phases[phase] = self.phases.get(phase, 0.0) + s


# The block-scale card's references on the H200, as times relative to cuBLAS block-wise (the baseline) and
# whether a verdict reads them (production): cuBLAS with padded scales (~1.0x, context), MSLK groupwise
# (~1.3x, production), bf16 cuBLAS (~1.6x, context; it misses the fp8 oracle). README, H200 tables.
BLOCKSCALE_REFS = {"alt:padded": (1.0, False), "alt:mslk": (1.3, True), "alt:bf16": (1.6, False)}


class _Child:
    def __init__(self, role: str) -> None:
        self.role = role


class SimSession:
    """What session.ParentClock asks of session.Session, on the simulated GPU: every launch a request to its
    slot's process (the accused's for the port, the references' for the rest), timed there by that slot's own
    timer (timing.LaunchTimers), committed, and answered."""

    def __init__(self, gpu: SimGPU, fns: dict) -> None:
        self.gpu, self.fns = gpu, fns
        self.children = {"accused": _Child("accused"), "references": _Child("references")}
        self.timers = timing.LaunchTimers.like(timing.EventTimer(device=gpu, sustain_ms=0.0))
        self.observer = None
        self.request_us = 1e6 * (COSTS["request"] + COSTS["commit_s_per_mib"] * COSTS["output_mib"])

    def child_of(self, slot: str) -> _Child:
        return self.children["accused" if slot == "port" else "references"]

    def untimed(self, child: _Child, calls: list) -> None:
        for slot, _ in calls:
            self.fns[slot]()
        self.gpu.synchronize()
        self.gpu.host_work(1e6 * COSTS["request"])

    def timed(self, slot: str, j: int, observe: bool = False) -> dict:
        ms, info = self.timers.launch(slot, self.fns[slot])
        # the request's round trip; the commitment, for every slot but the canary (whose output is not judged)
        self.gpu.host_work(1e6 * COSTS["request"] if slot == "canary" else self.request_us)
        return {"sample": ms, "held": info.get("held"), "clock_mhz": info.get("clock_mhz"), "hold_us": info.get("hold_us"),
                "self_synced": info["self_synced"], "unspun": info["unspun"], "launch_hold": info["launch_hold"]}


def timed_phase(ratio: float, *, stop: bool, seed: int, refs: dict = BLOCKSCALE_REFS, jitter: float = 0.015,
                rounds: int = 40, warmup: int | None = None, check_timed: int = 16, claim: float | None = None):
    """The timed session on the simulated GPU: port (``ratio`` = baseline time / port time), baseline and
    its A/A copy, ``refs`` (name -> (time relative to the baseline, decisive)) and the canary; graph samples of
    ~8 ms; driven by the parent's ParentClock (see the module doc)."""
    gpu = SimGPU(launch_us=20.0, jitter=jitter, seed=seed)
    base = 8000.0
    fns = {"port": lambda: gpu.kernel(base / ratio), "baseline": lambda: gpu.kernel(base),
           "baseline#aa": lambda: gpu.kernel(base), "canary": lambda: gpu.kernel(2000.0)}
    for name, (f, _) in refs.items():
        fns[name] = lambda f=f: gpu.kernel(base * f)
    sim = SimSession(gpu, fns)
    clock = session.ParentClock(sim, "device events (simulated)", True, 50.0)
    slots = {n: [session.RemoteCall(clock, n, 0)] for n in ["port", "baseline", *refs, "baseline#aa", "canary"]}
    decisive = ["baseline"] + [n for n, (_, d) in refs.items() if d]
    rule = confidence.StopRule(port="port", decisive=decisive, aa="baseline", claim=claim) if stop else None
    block = len(slots)
    plan = rule.horizon(block) if rule else max(block, -(-rounds // block) * block)
    rng = random.Random(seed + 7)
    seen = {"timed": 0, "checked": 0}

    def after(info):
        gpu.host_work(COSTS["between_rounds"] * 1e6)
        if info["kind"] != "timed":
            return
        seen["timed"] += 1
        # the referee's draw (referee.Referee._round): k checks over the planned rounds, the same rate past them
        if seen["timed"] > plan:
            check = rng.random() * plan < check_timed
        else:
            need, left = check_timed - seen["checked"], plan - seen["timed"] + 1
            check = need > 0 and rng.random() * left < need
        if check:
            seen["checked"] += 1
            gpu.host_work(COSTS["checked_round"] * 1e6)

    if warmup is None:  # the harness's defaults (ExecOptions.warmup_rounds)
        warmup = 3 if stop else 10
    h0 = gpu.h
    # the rule's seconds: the simulated host's clock (what the parent's perf_counter would read on the H200)
    t = timing.interleave(slots, _Timed(clock, gpu), 400 if stop else rounds, warmup, after_round=after,
                          rng=random.Random(seed), stop=rule, horizon=plan if rule else None)
    s = t["samples"]
    aa = aa_noise(s["baseline"], s["baseline#aa"])
    noise = max(aa["aa_noise_pct"], aa["aa_medians_pct"])
    r = percentile(s["baseline"], 50) / percentile(s["port"], 50)
    return (gpu.h - h0) / 1e6, t, rule, speed_label(r, noise), r


class _Timed:
    """ParentClock, with the simulated host's clock as the engine's ``now`` (timing.interleave reads
    ``timer.dev.host_us`` where there is one)."""

    def __init__(self, clock: session.ParentClock, gpu: SimGPU) -> None:
        self._clock, self.dev = clock, gpu

    def __getattr__(self, name: str):
        return getattr(self._clock, name)


def shape_cost(ratio: float, *, engine: str, seed: int = 0, refs: dict = BLOCKSCALE_REFS, first_of_card: bool = False,
               compiled_ahead: bool = True, claim: float | None = None) -> ShapeCost:
    """One shape's device seconds by phase. ``engine``: "per-task" (a process per task, a fixed 40
    rounds: the engine of the committed H200 logs) or "session" (the card's three servers, stop on
    confidence); ``first_of_card``: this shape starts the session's servers."""
    c = ShapeCost()
    n_refs = 1 + len(refs)
    slots = 1 + n_refs
    candidates = 1 + n_refs
    tasks = 2 * candidates + 2  # each candidate and its judge, the probe, the timed session
    if engine == "per-task":
        c.add("process_start", tasks * COSTS["process_start"])
        c.add("imports", tasks * COSTS["imports"])
        # the port compiles in its parity child; the probe and the session find it in the call's disk cache
        c.add("compile", COSTS["compile_cold"] + 2 * COSTS["compile_cached"])
    else:
        if first_of_card:
            c.add("process_start", 3 * COSTS["process_start"])
            c.add("imports", 3 * COSTS["imports"])
        # each shape's own specialisation of the port: from the cache compiled ahead, else on the device's clock
        c.add("compile", COSTS["compile_cached"] if compiled_ahead else COSTS["compile_cold"])
        c.add("other", tasks * COSTS["task_on_server"])
    c.add("reference_setup", n_refs * 3 * COSTS["seed"])
    c.add("checks", 3 * COSTS["seed"] + candidates * COSTS["judge"] + slots * COSTS["profile_slot"])
    c.add("compile", slots * COSTS["probe_slot"])
    c.add("inputs", COSTS["session_setup"])
    secs, t, rule, verdict, r = timed_phase(ratio, stop=engine == "session", seed=seed, refs=refs, claim=claim)
    c.add("rounds", secs)
    c.add("checks", 3 * slots * COSTS["profile_slot"])  # the observed rounds
    c.verdict, c.ratio, c.rounds = verdict, r, t["rounds"]
    if rule is not None:
        c.escalated = any(h["close"] for h in rule.history)
        c.why = (rule.decision or {}).get("why")
    return c
