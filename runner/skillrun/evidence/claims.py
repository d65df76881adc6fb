"""A card's numbers against its current evidence: does a measurement refute what the card claims?

A recipe claims ``expected_speedup`` and lists ``evidence`` entries with a ``speedup`` per shape;
those were written by hand from some run. When the current, non-stale GPU artifact of the same
card, recipe and shape (measured against a production reference, on the GPU the entry names) puts
the headline ratio (against the fastest oracle-correct production kernel, by the smaller of the two
clocks) outside its own A/A noise band, the number contradicts the evidence, and lint says so with
both numbers and the artifact. An evidence entry names the reference it was measured against, so
it stands when it matches the ratio of any reference timed in that artifact; the recipe's
``expected_speedup`` is the prior the planner uses, so it must match the headline itself. The
artifact is never wrong by assumption either: the warning asks for one of the two to change
(re-measure, or correct the card).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from skillrun.evidence.index import Entry, EvidenceIndex, shape_key, short_device_name


@dataclass(frozen=True)
class Refuted:
    field: str  # where in the card, e.g. "recipes.2.evidence.0.speedup"
    reason: str


def _band(e: Entry) -> Optional[tuple[float, float, float, float]]:
    """(measured ratio, noise %, low, high) of a comparable measurement, else None."""
    s = e.summary
    if s.speedup is None or s.noise_pct is None or not s.versus_production:
        return None
    n = s.noise_pct / 100.0
    return s.speedup, s.noise_pct, s.speedup * (1 - n), s.speedup * (1 + n)


def _shape_dict(shape: Any, keys: tuple[str, ...]) -> Optional[dict[str, Any]]:
    if isinstance(shape, dict):
        return dict(shape)
    if isinstance(shape, (list, tuple)) and len(shape) == len(keys):
        return dict(zip(keys, shape))
    return None


def _same_gpu(entry_gpu: Any, e: Entry) -> bool:
    if not entry_gpu:
        return True
    measured = short_device_name((e.record.get("device") or {}).get("name")).lower()
    return bool(measured) and str(entry_gpu).strip().lower() in measured


def _why(claim: float, e: Entry, band: tuple[float, float, float, float]) -> str:
    s, noise, lo, hi = band
    return (f"claims {claim:g}x, but the current measurement {e.path} reads {s:.3f}x vs {e.summary.versus} "
            f"(A/A noise {noise:.2f}%: {lo:.3f}-{hi:.3f}x); correct the card or re-measure")


def _matches_a_reference(claim: float, e: Entry) -> bool:
    """Does ``claim`` match the port's ratio against some reference timed in ``e`` (within its noise)?"""
    n = (e.summary.noise_pct or 0.0) / 100.0
    ratios = [r.speedup for r in e.summary.refs if r.speedup is not None]
    ratios += [r.events_speedup for r in e.summary.refs if r.events_speedup is not None]
    return any(x * (1 - n) - 5e-4 <= claim <= x * (1 + n) + 5e-4 for x in ratios)


def refuted_claims(card: Any, ev: EvidenceIndex, keys: tuple[str, ...]) -> list[Refuted]:
    """Every claimed ratio of ``card`` that its current GPU evidence refutes."""
    current = [e for e in ev.current_entries()
               if e.card == card.id and e.key[4] == "gpu_measured" and not e.stale and _band(e) is not None]
    out: list[Refuted] = []
    for i, r in enumerate(card.recipes):
        mine = [e for e in current if e.recipe == r.name]
        if not mine:
            continue
        for j, ent in enumerate(r.evidence or []):
            if not isinstance(ent, dict) or not isinstance(ent.get("speedup"), (int, float)):
                continue
            shape = _shape_dict(ent.get("shape"), keys)
            if shape is None:
                continue
            for e in mine:
                band = _band(e)
                if e.key[2] == shape_key(shape) and _same_gpu(ent.get("gpu"), e) and not band[2] <= ent["speedup"] <= band[3] \
                        and not _matches_a_reference(float(ent["speedup"]), e):
                    out.append(Refuted(f"recipes.{i}.evidence.{j}.speedup", _why(float(ent["speedup"]), e, band)))
        # The recipe's headline number stands for the whole shape class: refuted only when every
        # current measurement of the class lies outside it.
        exp = r.expected_speedup
        if isinstance(exp, (int, float)):
            bands = [(e, _band(e)) for e in mine]
            if all(not b[2] <= exp <= b[3] for _, b in bands):
                e, b = bands[0]
                more = f" (and {len(bands) - 1} more measurement(s) of this recipe)" if len(bands) > 1 else ""
                out.append(Refuted(f"recipes.{i}.expected_speedup", _why(float(exp), e, b) + more))
    return out
