"""Stop a timed session on confidence, not on a count of rounds.

The timing engine (timing.interleave) runs rounds in blocks of one round per slot, every slot in
every position once per block. After each whole block, :class:`StopRule` asks whether the ratio a
verdict will read (a reference's median over the port's, timing.py's kept samples) is known well
enough:

* **the interval**: each block gives one position-balanced ratio (the mean over its rounds of the
  reference's time over the port's in the same round); the blocks are close to independent, so the spread of their
  logarithms gives a Student-t interval around the session's median ratio. Its half-width must be
  below ``max(target_pct, A/A floor)``: nothing finer than the noise floor can change a verdict;
* **the thresholds**: a verdict changes where the ratio crosses ``1 - floor``, ``1 + floor``
  (evidence/verdict.speed_label) or the card's claim. While the interval straddles one of them
  the call is close, and the session may run on until ``cap_close_s``; otherwise it stops at
  ``cap_s`` even if the interval is still wide (a noisy shape: more rounds would not change its
  verdict, and the spread is on record);
* **a minimum** before any of this: ``min_blocks`` whole blocks and ``min_rounds`` rounds, so the
  A/A floor and the interval rest on more than a handful of samples.

GPU MODE's harness stops at 0.1 % standard error after 100 ms and re-measures only close calls;
nvbench stops when the relative noise is below 0.5 % (capped at 15 s). Both ideas are here, on the
quantity this runner's verdicts are made of: a ratio against the A/A floor, in balanced blocks.

Pure Python (the session child imports it beside the timing engine).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from skillrun.execute.stats import aa_noise, percentile

TARGET_PCT = 0.5
MIN_BLOCKS = 3
MIN_ROUNDS = 12
CAP_S = 3.0
CAP_CLOSE_S = 10.0


# The two-sided 95 % Student-t quantiles for 1-30 degrees of freedom (the printed table).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: int) -> float:
    """The two-sided 95 % Student-t quantile: the table to 30 degrees of freedom, then the
    Cornish-Fisher series from the normal's 1.96 (within 0.1 % there)."""
    if df < 1:
        return math.inf
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def block_log_ratios(raw: dict[str, dict[str, list]], port: str, ref: str, block: int) -> list[float]:
    """Per whole block: the mean over its rounds of ln(ref / port), both timed in the same round (what
    moves a whole round, a clock step, cancels); rounds with a sample left out are skipped."""
    def by_round(slot: str) -> dict[int, float]:
        cols = raw.get(slot) or {}
        return {int(r): ms for ms, r, k in zip(cols.get("ms", []), cols.get("round", []), cols.get("kept", [])) if k and ms > 0}

    p, r = by_round(port), by_round(ref)
    blocks: dict[int, list[float]] = {}
    for rnd in sorted(set(p) & set(r)):
        blocks.setdefault(rnd // block, []).append(math.log(r[rnd] / p[rnd]))
    return [sum(v) / len(v) for _, v in sorted(blocks.items())]


def interval(raw: dict[str, dict[str, list]], port: str, ref: str, block: int) -> dict[str, Any] | None:
    """The ratio (median of ref's kept samples over the port's) and the relative half-width of its 95 %
    interval from the blocks' spread; None with fewer than two whole blocks."""
    xs = block_log_ratios(raw, port, ref, block)
    if len(xs) < 2:
        return None
    kept = lambda s: [m for m, k in zip(raw[s]["ms"], raw[s]["kept"]) if k]  # noqa: E731
    pm, rm = kept(port), kept(ref)
    if not pm or not rm:
        return None
    ratio = percentile(rm, 50) / percentile(pm, 50)
    n = len(xs)
    mean = sum(xs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = math.expm1(t975(n - 1) * sd / math.sqrt(n))
    return {"ratio": ratio, "half_width_pct": 100.0 * half, "blocks": n, "low": ratio / (1 + half), "high": ratio * (1 + half)}


@dataclass
class StopRule:
    """Asked after every whole block (timing.interleave ``stop=``); see the module doc."""

    port: str
    decisive: list[str]                 # reference slots whose ratio a verdict reads
    aa: str | None = None               # the slot whose "#aa" copy gives the A/A floor
    claim: float | None = None          # the card's claimed speedup: a threshold too
    target_pct: float = TARGET_PCT
    min_blocks: int = MIN_BLOCKS
    min_rounds: int = MIN_ROUNDS
    cap_s: float = CAP_S
    cap_close_s: float = CAP_CLOSE_S
    history: list[dict[str, Any]] = field(default_factory=list)
    decision: dict[str, Any] | None = None

    @classmethod
    def from_config(cls, cfg: dict[str, Any] | None, port: str, slots: list[str], aa: str | None) -> "StopRule | None":
        """The session's rule from the task's ``timing.stop`` block (None: stop on the count)."""
        if not cfg or cfg.get("rule") != "confidence":
            return None
        decisive = [s for s in cfg.get("decisive") or [] if s in slots and s != port]
        if not decisive:
            decisive = [aa] if aa in slots and aa != port else []
        if not decisive:
            return None  # nothing to compare the port with: the count decides
        num = lambda k, d: float(cfg[k]) if isinstance(cfg.get(k), (int, float)) else d  # noqa: E731
        return cls(port=port, decisive=decisive, aa=aa if (aa and f"{aa}#aa" in slots) else None,
                   claim=num("claim", None), target_pct=num("target_pct", TARGET_PCT),
                   min_blocks=int(num("min_blocks", MIN_BLOCKS)), min_rounds=int(num("min_rounds", MIN_ROUNDS)),
                   cap_s=num("cap_s", CAP_S), cap_close_s=num("cap_close_s", CAP_CLOSE_S))

    def horizon(self, block: int) -> int:
        """The rounds every session runs at least (whole blocks): the referee and the observed rounds
        plan their draws over it, so a session that stops there has had all of them."""
        return block * max(self.min_blocks, math.ceil(self.min_rounds / max(1, block)))

    def floor_pct(self, raw: dict[str, dict[str, list]]) -> float | None:
        if not self.aa:
            return None
        a = [m for m, k in zip(raw[self.aa]["ms"], raw[self.aa]["kept"]) if k]
        b = [m for m, k in zip(raw[f"{self.aa}#aa"]["ms"], raw[f"{self.aa}#aa"]["kept"]) if k]
        if not a or not b:
            return None
        n = aa_noise(a, b)
        return max(n["aa_noise_pct"], n["aa_medians_pct"])

    def __call__(self, raw: dict[str, dict[str, list]], rounds: int, block: int, seconds: float) -> bool:
        """True to stop after this block. ``rounds``: timed rounds so far; ``seconds``: wall time of the
        timed phase so far (the device is held all along)."""
        if rounds < self.horizon(block):
            return False
        floor = self.floor_pct(raw)
        target = max(self.target_pct, floor or 0.0)
        band = (floor or 0.0) / 100.0
        thresholds = [1.0 - band, 1.0 + band] + ([self.claim] if self.claim else [])
        per: dict[str, Any] = {}
        converged, close = True, []
        for ref in self.decisive:
            iv = interval(raw, self.port, ref, block)
            if iv is None:
                converged = False
                continue
            per[ref] = {k: round(v, 5) if isinstance(v, float) else v for k, v in iv.items()}
            if iv["half_width_pct"] > target:
                converged = False
            straddled = [t for t in thresholds if iv["low"] < t < iv["high"]]
            if straddled:
                close.append(ref)
                per[ref]["straddles"] = [round(t, 5) for t in straddled]
        state = {"rounds": rounds, "seconds": round(seconds, 3), "floor_pct": round(floor, 4) if floor is not None else None,
                 "target_pct": round(target, 4), "refs": per, "close": close}
        self.history.append(state)
        why = None
        if converged and not close:
            why = "confident"
        elif close and seconds >= self.cap_close_s:
            why = "cap on a close call"
        elif not close and seconds >= self.cap_s:
            why = "cap"
        if why:
            self.decision = {**state, "why": why}
            return True
        return False

    def record(self, block: int) -> dict[str, Any]:
        """What the artifact keeps (timing.stop): the rule, its settings, and why the session ended."""
        return {"rule": "confidence", "target_pct": self.target_pct, "min_rounds": self.horizon(block),
                "cap_s": self.cap_s, "cap_close_s": self.cap_close_s, "claim": self.claim, "decisive": list(self.decisive),
                "checks": len(self.history), "escalated": any(h["close"] for h in self.history),
                "ended": self.decision or {"why": "round cap or time limit", **(self.history[-1] if self.history else {})},
                "how": ("blocks of one round per slot (every slot in every position); after each block, the 95 % interval of "
                        "each decisive reference's ratio to the port (Student t over the blocks' log mean ratios) is compared "
                        "with max(target, A/A floor); the session stops once every interval is that narrow and none straddles "
                        "1 +/- the A/A floor or the card's claim, runs on to cap_close_s while one straddles, and stops at cap_s "
                        "otherwise")}


def plan_rounds(task: dict[str, Any]) -> int | None:
    """The timed rounds a session task stopping on confidence runs at least (StopRule.horizon, with the
    session's block: its slots, the A/A copy and the canary); None when it stops on the count. The referee draws its
    checks over these rounds (and past them at the same rate), so a session that stops at its minimum
    still has all of them."""
    tcfg = task.get("timing") or {}
    slots = [s["slot"] for s in task.get("slots") or []]
    accused = {task.get("port_slot", "port"), *(task.get("peers") or [])}
    # the session's block (session.py): every slot, the A/A copy, and the canary the references' process
    # times in every round (there is a references' process when any slot is not the accused's)
    canary = 1 if any(s not in accused for s in slots) else 0
    block = len(slots) + (1 if task.get("aa_slot") in slots else 0) + canary
    rule = StopRule.from_config(tcfg.get("stop"), task.get("port_slot", "port"), slots + [f"{task.get('aa_slot')}#aa"],
                                task.get("aa_slot"))
    if rule is None or block < 1:
        return None
    return min(rule.horizon(block), max(1, int(tcfg.get("rounds", 100))))
