"""The verdict on two axes: correctness (port and every reference against the fp32 oracle) and speed
(the port against every reference, with the session's A/A noise floor).

One pure function, :func:`decide`, shared by the harness and by anything that re-reads recorded
numbers (tests feed it every combination). It never touches a device or a file.

Rules a reviewer can rely on:

* a ratio inside the A/A noise floor is ``within_noise``, never faster or slower;
* a reference that fails the oracle is still timed and labelled (the ratio against the production
  kernel is always reported), and the verdict says that it fails, instead of hiding the result
  behind ``skipped``;
* the headline reference (the one ``speedup`` and ``timing.versus`` refer to) is the first timed
  oracle-correct reference in the order baseline, production alternatives, other alternatives; when
  none is oracle-correct it is the first timed one in that order, and the text says it fails;
* a production kernel that is faster than the port but fails the oracle is named as such in words
  ("the faster kernel is the production X ..., and it fails the oracle while the port passes"),
  whichever reference leads the text;
* a reference that could not run says why: ``unavailable`` (its library is not importable),
  ``unsupported`` (it raised for this shape) or ``error``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SPEEDS = ("faster", "slower", "within_noise", "not_timed")
REF_STATUSES = ("ok", "unavailable", "unsupported", "error", "timeout", "crashed")


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


@dataclass(frozen=True)
class RefSpeed:
    name: str
    speedup: float | None  # reference median / port median (> 1: the port is faster)
    speed: str  # faster | slower | within_noise | not_timed


@dataclass
class Decision:
    verdict: str
    text: str
    speeds: dict[str, RefSpeed] = field(default_factory=dict)
    primary: str | None = None  # the reference `speedup` is against
    speedup: float | None = None
    # The fastest timed, comparable, oracle-correct production reference (what a user would run
    # instead of the port), named whether or not it is the headline reference.
    fastest_production: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "verdict_text": self.text, "primary": self.primary, "speedup": self.speedup,
                "speeds": {k: {"speedup": v.speedup, "speed": v.speed} for k, v in self.speeds.items()}}


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


def ref_speed(ref: RefOutcome, port_ms: float | None, noise_pct: float | None) -> RefSpeed:
    if ref.status != "ok" or not ref.comparable or ref.median_ms is None or not port_ms or port_ms <= 0:
        return RefSpeed(ref.name, None, "not_timed")
    s = _round(ref.median_ms / port_ms)
    return RefSpeed(ref.name, s, speed_label(s, noise_pct))


def _noise_text(noise_pct: float | None) -> str:
    return f"A/A noise {noise_pct:.1f}%" if noise_pct is not None else "no A/A noise floor measured"


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


def _primary(refs: list[RefOutcome], speeds: dict[str, RefSpeed]) -> RefOutcome | None:
    """The headline reference: the first timed oracle-correct one, else the first timed one, in the
    order baseline, production alternatives, other alternatives."""
    order = ([r for r in refs if r.role == "baseline"] + [r for r in refs if r.role != "baseline" and r.production]
             + [r for r in refs if r.role != "baseline" and not r.production])
    timed = [r for r in order if speeds[r.name].speed != "not_timed"]
    return next((r for r in timed if r.parity_passed is True), timed[0] if timed else None)


def _phrase(sp: RefSpeed, noise_pct: float | None) -> str:
    if sp.speed == "faster":
        return f"faster than {sp.name} ({sp.speedup:.3g}x, {_noise_text(noise_pct)})"
    if sp.speed == "slower":
        return f"slower than {sp.name} ({sp.speedup:.3g}x, {_noise_text(noise_pct)})"
    return f"within noise of {sp.name} ({sp.speedup:.3g}x, {_noise_text(noise_pct)})"


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
            out.append(f"vs {r.name}{tag} {sp.speedup:.3g}x ({word})" + (", which fails the oracle" if _fails(r) else ""))
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


def decide(port: PortOutcome, refs: list[RefOutcome], noise_pct: float | None, *, gpu: bool = True,
           timer: str | None = None) -> Decision:
    """verdict + verdict_text + per-reference speed labels for one item.

    ``gpu`` False means any timing came from a host timer (not GPU evidence): the labels are still
    given, the verdict stays ``cpu_numerics_passed`` for a correct port. ``timer`` only names the
    timing method in the text.
    """
    for r in refs:
        if r.status not in REF_STATUSES:
            raise ValueError(f"reference {r.name!r}: unknown status {r.status!r} (one of {REF_STATUSES})")
    speeds = {r.name: ref_speed(r, port.median_ms if port.problem is None else None, noise_pct) for r in refs}
    correct_refs = [r.name for r in refs if r.status == "ok" and r.parity_passed]
    not_run = [_why_not_run(r) for r in refs if r.status != "ok"]

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

    primary = _primary(refs, speeds)
    if primary is None:
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

    sp = speeds[primary.name]
    only_correct = not correct_refs
    head = _phrase(sp, noise_pct)
    if _fails(primary):
        if sp.speed == "slower":
            head += (f", but the only oracle-correct kernel ({primary.name} fails the oracle)" if only_correct
                     else f", and {primary.name} fails the oracle")
        elif sp.speed == "within_noise":
            head += f", and {primary.name} fails the oracle" + (" (the port is the only oracle-correct kernel)" if only_correct else "")
        else:
            head += f", and {primary.name} fails the oracle"
    others = _faster_but_failing(refs, speeds) + _others(refs, speeds, primary.name)
    text = head + ("; " + "; ".join(others) if others else "")
    best = fastest_production(refs, speeds)
    if best is not None:
        text += f"; fastest oracle-correct production kernel: {best.name} (port {speeds[best.name].speedup:.3g}x vs it)"
    name = best.name if best is not None else None
    if not gpu:
        return Decision("cpu_numerics_passed", f"port passes the oracle; host timing{f' ({timer})' if timer else ''}, "
                        f"not GPU evidence: {text}", speeds, primary.name, sp.speedup, name)
    verdict = {"faster": "validated", "slower": "slower", "within_noise": "within_noise"}[sp.speed]
    return Decision(verdict, text, speeds, primary.name, sp.speedup, name)


def fastest_production(refs: list[RefOutcome], speeds: dict[str, RefSpeed]) -> RefOutcome | None:
    """The production reference with the lowest comparable median among those that pass the oracle."""
    ok = [r for r in refs if r.production and r.status == "ok" and r.parity_passed is True
          and speeds[r.name].speed != "not_timed" and r.median_ms is not None]
    return min(ok, key=lambda r: r.median_ms) if ok else None


# ------------------------------------------------------------------------------------ vocabulary
# The one place the words a user reads are defined (the README's verdict table lists the same rows;
# tests/test_verdict.py checks that they agree). Every reader (list, report, plan, --json, MCP)
# shows these words and colours them by their tone, never by the word itself.
#
# tone: good (green), warn (amber), bad (red), neutral (no colour), info (blue: not GPU evidence).
VERDICTS: dict[str, tuple[str, str]] = {
    "validated": ("good", "oracle-correct and faster than the headline reference by more than the A/A noise floor"),
    "within_noise": ("neutral", "oracle-correct; the ratio is inside the A/A noise floor, so no difference is claimed"),
    "slower": ("warn", "oracle-correct but slower than the headline reference by more than the A/A noise floor"),
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
# Card level (`skill-run list`): the status a card declares, unless its evidence says otherwise.
CARD_STATUSES: dict[str, tuple[str, str]] = {
    "validated": ("good", "every claimed shape class has current GPU evidence"),
    "partially_validated": ("good", "some shape classes have current GPU evidence; the rest are the card's prior"),
    "compile_verified": ("info", "compiled and gated on a CPU; no GPU run"),
    "seed_claims": ("neutral", "numbers from the seed authors' own runs, not re-measured here"),
    "unvalidated": ("neutral", "no evidence yet"),
    "stale": ("warn", "the card claims validation, but every GPU artifact of it is stale (kernel or recipe changed since)"),
}
TONE_STYLE = {"good": "green", "warn": "yellow", "bad": "bold red", "neutral": "", "info": "cyan"}
TONE_COLOR = {"good": "#1a7f37", "warn": "#9a6700", "bad": "#cf222e", "neutral": "#57606a", "info": "#0969da"}
_SPEED_VERDICT = {"faster": "validated", "slower": "slower", "within_noise": "within_noise"}


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
