"""The verdict on two axes: correctness (port and every reference against the fp32 oracle) and speed
(the port against every reference, with the session's A/A noise floor), and the one headline rule.

One pure function, :func:`decide`, shared by the harness and by everything that re-reads recorded
numbers (:func:`judge_record` rebuilds its inputs from an artifact, so `report`, `plan`, `list`,
MCP and the README judge every artifact, old or new, by today's rule). It never touches a device
or a file; tests feed it every combination.

The headline rule (issue 34):

* the headline reference is the **fastest oracle-correct production kernel** timed on the shape
  (the one the port beats least); ``validated`` needs it, and needs the port to beat it beyond the
  A/A noise floor; ``slower`` and ``within_noise`` are read against it too;
* ``validated`` is never given when any production kernel in the same session was faster than the
  port (one that fails the oracle included: then the verdict is ``production_fails_oracle``);
* no oracle-correct production kernel timed, but production kernels that fail the oracle were:
  ``production_fails_oracle`` (the ratio is against the fastest of them, and the text says it is wrong);
* no production kernel timed at all (unsupported, unavailable, or the card names none for what ran):
  ``no_production_reference``; the ratio against the best oracle-correct alternative is context,
  never validation;
* two clocks: where the profiler's kernel durations (the second clock, recorded per slot) and the
  device events disagree beyond the noise (at least :data:`CLOCK_FLOOR_PCT`), a ratio is the smaller
  of the two, both are reported, and the text names the reason (a call that waits for the host
  inside its launch puts that wait into its events);
* a ratio inside the A/A noise floor is ``within_noise``, never faster or slower; the noise quoted
  everywhere is the one used here (the harness's max of the per-round ratio noise and the noise of
  the medians), with the p10-p90 of the A/A ratio where the artifact has it;
* a reference that fails the oracle is still timed and labelled, and a reference that could not
  run says why: ``unavailable`` (its library is not importable), ``unsupported`` (it raised for
  this shape) or ``error``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

SPEEDS = ("faster", "slower", "within_noise", "not_timed")
REF_STATUSES = ("ok", "unavailable", "unsupported", "error", "timeout", "crashed")
# Two clocks disagree when they differ by more than the A/A noise and at least this much (the
# harness's own warning uses the same floor: three profiled launches are not a precise clock).
CLOCK_FLOOR_PCT = 3.0


@dataclass(frozen=True)
class PortOutcome:
    status: str = "ok"  # ok | unsupported | error
    parity_passed: bool | None = None
    median_ms: float | None = None
    # A failure found after parity (slot integrity, a time below the physical floor, parity lost
    # after the timed rounds): the verdict becomes ``problem_verdict`` and no speed is claimed.
    problem: str | None = None
    problem_verdict: str = "error"
    error: str | None = None
    # The second clock: the profiler's kernel durations of the observed launches, and the events of
    # those same launches (None where the engine recorded no second clock).
    kernel_ms: float | None = None
    events_observed_ms: float | None = None
    syncs_host: bool = False  # its launch waited for the host inside itself (hold.self_syncing)


@dataclass(frozen=True)
class RefOutcome:
    name: str
    role: str = "alternative"  # baseline | alternative
    production: bool = False
    status: str = "ok"  # ok | unavailable | unsupported | error | timeout | crashed (the launch watchdog)
    parity_passed: bool | None = None
    median_ms: float | None = None
    # False when its slot failed the integrity check or its time is below the physical floor:
    # then its ratio is not evidence and it is labelled not_timed.
    comparable: bool = True
    why_not_comparable: str | None = None
    error: str | None = None
    kernel_ms: float | None = None  # second clock, as on PortOutcome
    events_observed_ms: float | None = None
    syncs_host: bool = False


@dataclass(frozen=True)
class RefSpeed:
    name: str
    # reference / port (> 1: the port is faster): the ratio the speed label reads, i.e. the event
    # clock's, or the smaller of the two clocks where they disagree
    speedup: float | None
    speed: str  # faster | slower | within_noise | not_timed
    events: float | None = None  # the event clock's ratio
    kernel: float | None = None  # the profiler kernel durations' ratio (None: no second clock)
    clock_note: str | None = None  # why the two clocks disagree (None: they agree, or one is missing)


@dataclass
class Decision:
    verdict: str
    text: str
    speeds: dict[str, RefSpeed] = field(default_factory=dict)
    primary: str | None = None  # the headline reference (`speedup` is against it)
    speedup: float | None = None
    # The fastest timed, comparable, oracle-correct production reference (what a user would run
    # instead of the port); the headline whenever there is one.
    fastest_production: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "verdict_text": self.text, "primary": self.primary, "speedup": self.speedup,
                "fastest_production": self.fastest_production,
                "speeds": {k: {"speedup": v.speedup, "speed": v.speed, "events": v.events, "kernel": v.kernel,
                               "clock_note": v.clock_note} for k, v in self.speeds.items()}}


def _round(x: float) -> float:
    return float(f"{x:.4g}")


def speed_label(speedup: float | None, noise_pct: float | None) -> str:
    """faster / slower / within_noise for one ratio; not_timed without one.

    Without a measured noise floor only an exact tie is within noise (the text then says that no
    A/A floor was measured); a ratio inside the floor is never faster or slower.
    """
    if speedup is None:
        return "not_timed"
    noise = max(0.0, (noise_pct or 0.0) / 100.0)
    if speedup > 1.0 + noise:
        return "faster"
    if speedup < 1.0 - noise:
        return "slower"
    return "within_noise"


def _clock_note(ref: RefOutcome, port: PortOutcome, events: float, kernel: float) -> str:
    """Why the events and the kernel durations disagree, in the words a reader can check."""
    if kernel < events:  # the events favour the port: the reference's interval holds more than its kernels
        who, syncs = ref.name, ref.syncs_host
    else:
        who, syncs = "the port", port.syncs_host
    if syncs:
        return f"{who}'s call waits for the host inside its launch, and its events include that wait"
    return f"{who}'s event interval holds time outside its kernels (launch gaps or host work inside the call)"


def ref_speed(ref: RefOutcome, port: PortOutcome | float | None, noise_pct: float | None) -> RefSpeed:
    """One reference's ratio on both clocks, and its speed label (see the module doc)."""
    if not isinstance(port, PortOutcome):
        port = PortOutcome(median_ms=port)
    port_ms = port.median_ms
    if ref.status != "ok" or not ref.comparable or ref.median_ms is None or not port_ms or port_ms <= 0:
        return RefSpeed(ref.name, None, "not_timed")
    ev = _round(ref.median_ms / port_ms)
    kernel = _round(ref.kernel_ms / port.kernel_ms) if ref.kernel_ms and port.kernel_ms and port.kernel_ms > 0 else None
    judged, note = ev, None
    if kernel is not None:
        # like for like where recorded: the events of the same observed launches the profiler timed
        like = (ref.events_observed_ms / port.events_observed_ms
                if ref.events_observed_ms and port.events_observed_ms else ev)
        if 100.0 * abs(kernel / like - 1.0) > max(noise_pct or 0.0, CLOCK_FLOOR_PCT):
            judged, note = min(ev, kernel), _clock_note(ref, port, ev, kernel)
    return RefSpeed(ref.name, judged, speed_label(judged, noise_pct), events=ev, kernel=kernel, clock_note=note)


def _noise_text(noise_pct: float | None, aa_band: tuple[float, float] | None = None) -> str:
    if noise_pct is None:
        return "no A/A noise floor measured"
    band = f", A/A ratio p10-p90 {aa_band[0]:.3f}-{aa_band[1]:.3f}" if aa_band else ""
    return f"A/A noise {noise_pct:.2f}%{band}"  # as every table prints it: one figure, one format


def _fails(ref: RefOutcome) -> bool:
    return ref.status == "ok" and ref.parity_passed is False


def _why_not_run(ref: RefOutcome, tag: str = "") -> str:
    what = {"unavailable": "unavailable", "unsupported": "unsupported for this shape", "error": "failed to run",
            "timeout": "timed out (its launch did not return: deadlock?)", "crashed": "crashed"}.get(ref.status, ref.status)
    err = (ref.error or "").strip().splitlines()[0] if ref.error else ""
    for prefix in ("unavailable: ", "ReferenceUnavailable: ", "unsupported shape: "):
        err = err[len(prefix):] if err.startswith(prefix) else err
    err = err if len(err) <= 200 else err[:199] + "…"
    return f"{ref.name}{tag} {what}" + (f" ({err})" if err else "")


def _ratio(sp: RefSpeed) -> str:
    """``1.23x``, or both clocks where they disagree: ``2.46x (events 23x, kernel durations 2.46x)``."""
    if sp.clock_note is None:
        return f"{sp.speedup:.3g}x"
    return f"{sp.speedup:.3g}x by the smaller of two clocks: events {sp.events:.3g}x, kernel durations {sp.kernel:.3g}x"


def _phrase(sp: RefSpeed, noise: str) -> str:
    lead = {"faster": "faster than", "slower": "slower than", "within_noise": "within noise of"}[sp.speed]
    return f"{lead} {sp.name} ({_ratio(sp)}, {noise})"


def _others(refs: list[RefOutcome], speeds: dict[str, RefSpeed], primary: str | None) -> list[str]:
    """One short clause per other reference: its ratio (and oracle failure), or why it did not run."""
    out = []
    for r in refs:
        if r.name == primary:
            continue
        sp = speeds[r.name]
        tag = " (production)" if r.production else ""
        if r.status != "ok":
            out.append(_why_not_run(r, tag))
        elif sp.speed == "not_timed":
            why = r.why_not_comparable or "not timed"
            out.append(f"{r.name}{tag} {'fails' if _fails(r) else 'passes'} the oracle, {why}")
        else:
            word = {"faster": "faster", "slower": "slower", "within_noise": "within noise"}[sp.speed]
            out.append(f"vs {r.name}{tag} {_ratio(sp)} ({word})" + (", which fails the oracle" if _fails(r) else ""))
    return out


def _faster_but_failing(refs: list[RefOutcome], speeds: dict[str, RefSpeed]) -> list[str]:
    """A clause per production kernel that beats the port on time but fails the oracle: the case a
    reader must not take for a loss of the port (e.g. an fp8 kernel that never promotes its
    accumulator over a deep K)."""
    out = []
    for r in refs:
        sp = speeds[r.name]
        if r.production and _fails(r) and sp.speed == "slower" and sp.speedup:
            out.append(f"the faster kernel is the production {r.name} ({1 / sp.speedup:.3g}x the port's speed), "
                       "and it fails the oracle while the port passes")
    return out


def _least(refs: list[RefOutcome], speeds: dict[str, RefSpeed]) -> RefOutcome | None:
    """The reference the port beats least (the smallest judged ratio): the fastest, by the clock that counts."""
    return min(refs, key=lambda r: speeds[r.name].speedup) if refs else None


def decide(port: PortOutcome, refs: list[RefOutcome], noise_pct: float | None, *, gpu: bool = True,
           timer: str | None = None, aa_band: tuple[float, float] | None = None) -> Decision:
    """verdict + verdict_text + per-reference speed labels for one item (the rule: see the module doc).

    ``gpu`` False means any timing came from a host timer (not GPU evidence): the labels are still
    given, the verdict stays ``cpu_numerics_passed`` for a correct port. ``timer`` only names the
    timing method in the text; ``aa_band`` (p10, p90 of the A/A ratio) is quoted beside the noise.
    """
    for r in refs:
        if r.status not in REF_STATUSES:
            raise ValueError(f"reference {r.name!r}: unknown status {r.status!r} (one of {REF_STATUSES})")
    timed_port = port if port.problem is None else PortOutcome(median_ms=None)
    speeds = {r.name: ref_speed(r, timed_port, noise_pct) for r in refs}
    correct_refs = [r.name for r in refs if r.status == "ok" and r.parity_passed]
    not_run = [_why_not_run(r) for r in refs if r.status != "ok"]
    noise = _noise_text(noise_pct, aa_band)

    def parity_words() -> str:
        parts = []
        failing = [r.name for r in refs if _fails(r)]
        if correct_refs:
            parts.append(f"{', '.join(correct_refs)} pass{'es' if len(correct_refs) == 1 else ''} the oracle")
        if failing:
            parts.append(f"{', '.join(failing)} fail{'s' if len(failing) == 1 else ''} the oracle")
        return "; ".join(parts + not_run)

    if port.status == "unsupported":
        return Decision("skipped", "the port does not support this shape" + (f": {port.error}" if port.error else ""), speeds)
    if port.status != "ok":
        return Decision("error", "the port failed to build or run" + (f": {port.error}" if port.error else ""), speeds)
    if not port.parity_passed:
        text = "port fails the oracle"
        timed = [speeds[r.name] for r in refs if speeds[r.name].speed != "not_timed"]
        if timed:  # shown for context, never a claim
            text += " (it would be " + ", ".join(f"{s.speedup:.3g}x vs {s.name}" for s in timed) + ")"
        words = parity_words()
        return Decision("parity_failed", text + (f"; {words}" if words else ""), speeds)
    if port.problem:
        return Decision(port.problem_verdict, f"port passes the oracle, but {port.problem}; no speed is claimed", speeds)

    timed = [r for r in refs if speeds[r.name].speed != "not_timed"]
    if not timed:
        if port.median_ms is None or not any(r.status == "ok" for r in refs):
            base = "port passes the oracle"
            rest = parity_words()
            if not gpu:
                verdict, base = "cpu_numerics_passed", base + "; no GPU timing was possible"
            else:
                verdict, base = "skipped", base + "; no reference could be timed against it"
            return Decision(verdict, base + (f"; {rest}" if rest else ""), speeds)
        # references ran but none is comparable (integrity / floor)
        rest = "; ".join(_others(refs, speeds, None))
        verdict = "cpu_numerics_passed" if not gpu else "skipped"
        return Decision(verdict, "port passes the oracle; no reference timing is comparable" + (f": {rest}" if rest else ""), speeds)

    prod_ok = [r for r in timed if r.production and r.parity_passed is True]
    prod_bad = [r for r in timed if r.production and r.parity_passed is not True]
    best = _least(prod_ok, speeds)
    if best is not None:
        primary = best
        sp = speeds[best.name]
        verdict = {"faster": "validated", "slower": "slower", "within_noise": "within_noise"}[sp.speed]
        head = _phrase(sp, noise) + ", the fastest oracle-correct production kernel measured"
        faster_wrong = [r for r in prod_bad if speeds[r.name].speed == "slower"]
        if verdict == "validated" and faster_wrong:
            verdict = "production_fails_oracle"  # never validated while a production kernel was faster
    elif prod_bad:
        primary = _least(prod_bad, speeds)
        sp = speeds[primary.name]
        verdict = "production_fails_oracle"
        word = {"faster": "faster than", "slower": "slower than", "within_noise": "within noise of"}[sp.speed]
        head = (f"no oracle-correct production kernel was timed: the production {primary.name} fails the oracle (the "
                f"port passes), and the port is {word} it ({_ratio(sp)}, {noise})")
        if sp.speed == "slower" and not correct_refs:
            head += ", the only oracle-correct kernel"
    else:
        correct_alts = [r for r in timed if r.parity_passed is True]
        primary = _least(correct_alts or timed, speeds)
        sp = speeds[primary.name]
        verdict = "no_production_reference"
        missing = [_why_not_run(r) for r in refs if r.production and r.status != "ok"]
        why = ("; ".join(missing)) if missing else "the card names no production kernel among those timed"
        word = {"faster": "faster than", "slower": "slower than", "within_noise": "within noise of"}[sp.speed]
        head = (f"no production kernel was compared ({why}); against the alternative {primary.name} the port is "
                f"{word} it ({_ratio(sp)}, {noise}), which is context, not validation"
                + (f", and {primary.name} fails the oracle" if _fails(primary) else ""))
    if sp.clock_note:
        head += f"; the two clocks disagree: {sp.clock_note}"
    # (a production kernel that did not run is already named in a no_production_reference head)
    said = {r.name for r in refs if r.production and r.status != "ok"} if verdict == "no_production_reference" else set()
    others = _faster_but_failing([r for r in refs if not (r is primary and prod_bad and best is None)], speeds) + _others([r for r in refs if r.name not in said], speeds, primary.name)
    text = head + ("; " + "; ".join(others) if others else "")
    name = best.name if best is not None else None
    if not gpu:
        return Decision("cpu_numerics_passed", f"port passes the oracle; host timing{f' ({timer})' if timer else ''}, "
                        f"not GPU evidence: {text}", speeds, primary.name, sp.speedup, name)
    return Decision(verdict, text, speeds, primary.name, sp.speedup, name)


def fastest_production(refs: list[RefOutcome], speeds: dict[str, RefSpeed]) -> RefOutcome | None:
    """The timed, oracle-correct production reference the port beats least (None without one)."""
    return _least([r for r in refs if r.production and r.status == "ok" and r.parity_passed is True
                   and speeds[r.name].speed != "not_timed"], speeds)


# ------------------------------------------------------------------------------------ vocabulary
# The one place the words a user reads are defined (the README's verdict table lists the same rows;
# tests/test_verdict.py checks that they agree). Every reader (list, report, plan, --json, MCP)
# shows these words and colours them by their tone, never by the word itself.
#
# tone: good (green), warn (amber), bad (red), neutral (no colour), info (blue: not GPU evidence).
VERDICTS: dict[str, tuple[str, str]] = {
    "validated": ("good", "oracle-correct and faster, beyond the A/A noise floor and by the smaller of the two clocks, "
                          "than the fastest oracle-correct production kernel measured; no production kernel in the session was faster"),
    "within_noise": ("neutral", "oracle-correct; the ratio to the fastest oracle-correct production kernel is inside the "
                                "A/A noise floor, so no difference is claimed"),
    "slower": ("warn", "oracle-correct but slower than the fastest oracle-correct production kernel measured, beyond the A/A noise floor"),
    "production_fails_oracle": ("warn", "oracle-correct where a production kernel is not: every production kernel timed fails "
                                        "the oracle, or one that fails it was faster than the port; no validation is claimed"),
    "no_production_reference": ("neutral", "oracle-correct and timed, but no production kernel was compared (unsupported, "
                                           "unavailable or none named); a ratio against an alternative is context, not validation"),
    "skipped": ("neutral", "nothing to compare: the port refuses the shape or no reference could be timed against it"),
    "parity_failed": ("bad", "the port's output is outside the card's tolerance of the fp32 oracle"),
    "error": ("bad", "the port failed to build or run, or a timing integrity check failed; no speed is claimed"),
    "cpu_numerics_passed": ("info", "oracle-correct on a CPU proxy shape; host timing only, not GPU evidence"),
    "compile_verified": ("info", "compiled on a CPU and passed the card's static gates; nothing ran"),
    "compile_failed": ("bad", "did not compile, or a static gate (spills, occupancy, LDS, opcodes) failed"),
    "invalid": ("bad", "the file is not a readable validation artifact"),
}
# Per reference: how a speed ratio reads (the port against that reference).
SPEED_WORDS = {"faster": "faster", "slower": "slower", "within_noise": "within noise", "not_timed": "not timed"}
SPEED_TONE = {"faster": "good", "slower": "warn", "within_noise": "neutral", "not_timed": "neutral"}
# Per reference: its result against the fp32 oracle. A non-production alternative (bf16 cuBLAS next
# to an fp8 kernel, a per-batch loop) is there for context; missing the oracle is what it is
# expected to do, so it is shown as expected, never as a failure.
REF_PARITY_WORDS = {
    "passes": ("ok", "neutral"),
    "fails": ("FAIL", "bad"),
    "expected_miss": ("misses oracle (expected)", "neutral"),
    "unsupported": ("unsupported", "neutral"),
    "unavailable": ("unavailable", "neutral"),
    "error": ("error", "bad"),
    "timeout": ("timed out (hang)", "bad"),
    "crashed": ("crashed", "bad"),
    "not_run": ("not run", "neutral"),
    "unknown": ("?", "neutral"),
}
# Card level (`skill-run list`, `report`, the README): computed from the evidence by
# skillrun.evidence.index.card_status, never taken from what the card declares about itself.
CARD_STATUSES: dict[str, tuple[str, str]] = {
    "validated": ("good", "a shape beats the fastest oracle-correct production kernel, and every shape class has current GPU evidence"),
    "partially_validated": ("good", "a shape beats the fastest oracle-correct production kernel; some shape classes have no GPU evidence"),
    "measured": ("neutral", "current GPU evidence, but no shape beats its production kernel (slower, no production reference, or it fails the oracle)"),
    "compile_verified": ("info", "compiled and gated on a CPU; no GPU run"),
    "seed_claims": ("neutral", "numbers from the seed authors' own runs, not re-measured here"),
    "unvalidated": ("neutral", "no evidence yet"),
    "stale": ("warn", "every current GPU artifact of it is stale (kernel or recipe changed since)"),
}
TONE_STYLE = {"good": "green", "warn": "yellow", "bad": "bold red", "neutral": "", "info": "cyan"}
TONE_COLOR = {"good": "#1a7f37", "warn": "#9a6700", "bad": "#cf222e", "neutral": "#57606a", "info": "#0969da"}
_SPEED_VERDICT = {"faster": "validated", "slower": "slower", "within_noise": "within_noise"}
# Every verdict a timed, oracle-correct port can get (judge_record re-judges records that carry one).
TIMED_VERDICTS = ("validated", "slower", "within_noise", "production_fails_oracle", "no_production_reference", "skipped")


def verdict_tone(verdict: str) -> str:
    return VERDICTS.get(verdict, ("neutral", ""))[0]


def verdict_style(verdict: str) -> str:
    """The rich style of a verdict word (by its tone)."""
    return TONE_STYLE[verdict_tone(verdict)]


def speed_style(speed: str) -> str:
    return TONE_STYLE[SPEED_TONE.get(speed, "neutral")]


def ratio_style(speedup: float | None, noise_pct: float | None) -> str:
    """Colour of a bare ratio by what it means: faster green, slower amber, within noise neutral."""
    return speed_style(speed_label(speedup, noise_pct))


def reconcile(recorded: str, speed: str) -> str:
    """The verdict a timed, oracle-correct record has under today's rule.

    Artifacts written before ``within_noise`` existed say ``slower`` (or ``validated``) for a ratio
    inside the noise floor. The speed axis is re-derived from the recorded ratio and noise, and a
    timed verdict that contradicts it is read as the speed axis says, so a row never shows
    ``slower`` beside ``within noise``. Every other verdict is kept as recorded.
    """
    if recorded in _SPEED_VERDICT.values() and speed in _SPEED_VERDICT:
        return _SPEED_VERDICT[speed]
    return recorded


def ref_parity_kind(status: str, parity_passed: bool | None, production: bool) -> str:
    """One key of REF_PARITY_WORDS for one reference slot."""
    if status in ("unsupported", "unavailable", "error", "timeout", "crashed", "not_run"):
        return status
    if parity_passed is True:
        return "passes"
    if parity_passed is False:
        return "fails" if production else "expected_miss"
    return "unknown"


# ------------------------------------------------------------------------------------ re-judging a record
def _num(x: Any) -> Optional[float]:
    try:
        return None if x is None or isinstance(x, bool) else float(x)
    except (TypeError, ValueError):
        return None


def recorded_noise(rec: dict[str, Any]) -> Optional[float]:
    """The A/A noise floor the verdict used, in percent: the ``noise_pct`` the harness wrote on each
    reference entry (max of the per-round ratio noise and the noise of the medians), else that max
    recomputed from ``timing.aa`` (older artifacts), else the bare ``timing.aa_noise_pct``."""
    for r in rec.get("references") or []:
        if isinstance(r, dict) and _num(r.get("noise_pct")) is not None:
            return _num(r.get("noise_pct"))
    t = rec.get("timing") or {}
    aa = t.get("aa") or {}
    vals = [v for v in (_num(aa.get("aa_noise_pct")), _num(aa.get("aa_medians_pct"))) if v is not None]
    return max(vals) if vals else _num(t.get("aa_noise_pct"))


def aa_band(rec: dict[str, Any]) -> Optional[tuple[float, float]]:
    """(p10, p90) of the per-round A/A ratio, where the artifact kept them."""
    aa = (rec.get("timing") or {}).get("aa") or {}
    lo, hi = _num(aa.get("aa_ratio_p10")), _num(aa.get("aa_ratio_p90"))
    return (lo, hi) if lo is not None and hi is not None else None


def _ref_status(status: Any) -> str:
    s = str(status or "ok")
    return s if s in REF_STATUSES else ("error" if s not in ("not_run",) else "unavailable")


def record_outcomes(rec: dict[str, Any], production: Optional[Iterable[str]] = None
                    ) -> Optional[tuple[PortOutcome, list[RefOutcome]]]:
    """The inputs :func:`decide` had (or would have had) for a GPU-timed artifact whose port passed the
    oracle; None for anything else (compile-only, CPU, a failing or broken port: those verdicts stand).

    Artifacts with a ``references`` block name which slot was production at run time; older ones are
    read against ``production`` (the card's list today; without it their baseline counts as production).
    """
    if rec.get("mode") != "gpu_measured" or str(rec.get("verdict")) not in TIMED_VERDICTS:
        return None
    t = rec.get("timing") or {}
    port_ms = _num((t.get("port_ms") or {}).get("median"))
    par = rec.get("parity") or {}
    if port_ms is None or (par.get("port") or {}).get("passed") is not True:
        return None
    sc = t.get("second_clock") or {}
    kernel = sc.get("median_ms") or {}
    observed = sc.get("events_median_ms") or {}
    syncing = ((t.get("hold") or {}).get("self_syncing") or {}) if isinstance(t.get("hold"), dict) else {}
    port = PortOutcome(parity_passed=True, median_ms=port_ms, kernel_ms=_num(kernel.get("port")),
                       events_observed_ms=_num(observed.get("port")), syncs_host=bool(syncing.get("port")))
    refs: list[RefOutcome] = []
    block = rec.get("references")
    if isinstance(block, list) and block:
        for r in block:
            if not isinstance(r, dict):
                continue
            p = r.get("parity") if isinstance(r.get("parity"), dict) else {}
            status = _ref_status(r.get("status"))
            slot = str(r.get("slot") or ("baseline" if r.get("role") == "baseline" else f"alt:{r.get('name')}"))
            note = r.get("timing_note")
            refs.append(RefOutcome(name=str(r.get("name") or "?"), role=str(r.get("role") or "alternative"),
                                   production=bool(r.get("production")), status=status,
                                   parity_passed=p.get("passed") if status == "ok" else None,
                                   median_ms=_num(r.get("median_ms")), comparable=not note, why_not_comparable=note,
                                   error=r.get("error"), kernel_ms=_num(kernel.get(slot)),
                                   events_observed_ms=_num(observed.get(slot)), syncs_host=bool(syncing.get(slot))))
        return port, refs
    prod = frozenset(str(n) for n in production) if production else None
    slots: list[tuple[str, str, str, Any, Any]] = []
    base = par.get("baseline")
    if base is not None or t.get("baseline_ms"):
        kname = (base or {}).get("kernel") or ""
        name = kname.split(":")[-1].removeprefix("build_") if kname else "baseline"
        slots.append((name, "baseline", "baseline", base, t.get("baseline_ms")))
    for name, p in (par.get("alternatives") or {}).items():
        slots.append((str(name), "alternative", f"alt:{name}", p, (t.get("alternatives_ms") or {}).get(name)))
    for name, role, slot, p, st in slots:
        p = p or {}
        if p.get("supported") is False:
            status = "unsupported"
        elif p.get("error") and p.get("passed") is None:
            status = "error"
        elif not p:
            status = "unavailable"
        else:
            status = "ok"
        is_prod = (role == "baseline") if prod is None else name in prod
        refs.append(RefOutcome(name=name, role=role, production=is_prod, status=status,
                               parity_passed=p.get("passed") if status == "ok" else None,
                               median_ms=_num((st or {}).get("median")), error=p.get("error"),
                               kernel_ms=_num(kernel.get(slot)), events_observed_ms=_num(observed.get(slot)),
                               syncs_host=bool(syncing.get(slot))))
    # a production kernel the card names today that this older run never measured
    seen = {name for name, *_ in slots}
    for name in sorted(prod or ()):
        if name not in seen:
            refs.append(RefOutcome(name=name, production=True, status="unavailable",
                                   error="not measured in this run (the artifact predates it)"))
    return port, refs


def judge_record(rec: dict[str, Any], production: Optional[Iterable[str]] = None) -> Optional[Decision]:
    """Today's verdict of a recorded GPU measurement (None where the recorded verdict stands: see
    :func:`record_outcomes`). Every reader of artifacts goes through this, so an artifact written
    under an older rule reads as the rule says now, and the artifact itself is never rewritten."""
    got = record_outcomes(rec, production)
    if got is None:
        return None
    port, refs = got
    return decide(port, refs, recorded_noise(rec), aa_band=aa_band(rec))
