"""The evidence index: which validation artifact is *current*, which are *superseded*, which are *stale*.

    from skillrun.evidence.index import build_index
    ev = build_index(skill_index)              # every artifact under <kb>/validation
    for e in ev.current_entries(): print(e.path, e.summary.verdict, e.stale)
    hit = ev.measured("triton_fp8_blockscale_gemm_sm90", "prefill_default", {"M": 4096, "N": 2048, "K": 7168}, arch="sm_90")

Artifacts are never overwritten, so one (card, recipe, shape, device class, mode) can have many.
The newest (by its ``created`` time) is *current*; the older ones are *superseded* by it.

An artifact is *stale* when what the runner would run today for it is not what was measured:
the sha256 of the kernel source, or of a ``skillrun_kernels`` helper it imports, differs from the one
recorded (older artifacts recorded the kernel module alone and are judged by it), or the card no longer has the
recipe, or the recipe's kernel entry, config or the card's tolerance changed. An edit elsewhere in
the card file (prose, another recipe, the evidence written from this very run) changes the card's
sha256 without touching what was measured; that is reported as ``card_edited`` (shown beside the
stale flag) and does not make the artifact stale. One function, :func:`staleness`, holds the rule.

Only what the runner wrote is evidence: a file that the ledger of its folder (:mod:`skillrun.evidence.ledger`)
does not list, or whose bytes changed since, is *untrusted* (listed with the invalid files, never current),
and a listed file that is gone is *lost*.

Every reader of artifacts (report, plan, agent tools, lint) goes through :func:`summarize`, so a
verdict, its text and its A/A noise are derived in exactly one place. Artifacts with the
per-reference ``references`` block (written since cards name their production kernels) are read from it; older ones from
``parity``/``timing``/``speedup``.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

from skillrun.evidence import ledger
from skillrun.evidence.store import kb_relative
from skillrun.io.atomic import is_temp_name
from skillrun.errors import InputError, SkillRunError
from skillrun.evidence.kernel_sources import MAX_MODULES, locate, source_sha256
from skillrun.evidence.validation import load_artifact

# Where measured GPU evidence sorts before CPU numerics, and both before compile-only checks.
MODE_ORDER = {"gpu_measured": 0, "cpu_numerics": 1, "compile_only": 2}
FAILING = ("parity_failed", "error", "compile_failed", "invalid")


# ------------------------------------------------------------------------------------ paths (kb_relative: skillrun.evidence.store)
def _resolve(rel: str, root: Path) -> Path:
    p = Path(rel)
    return p if p.is_absolute() else root / p


# ------------------------------------------------------------------------------------ keys
def shape_key(shape: dict[str, Any] | None) -> tuple:
    return tuple(sorted((str(k), v) for k, v in (shape or {}).items()))


def short_device_name(name: str | None) -> str:
    name = (name or "").strip()
    for prefix in ("NVIDIA ", "AMD ", "Instinct "):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name


def device_class(rec: dict[str, Any]) -> str:
    """What a measurement generalises to: the GPU model and arch, or 'CPU' and the target arch."""
    d = rec.get("device") or {}
    arch = d.get("arch") or "?"
    if d.get("kind") == "cpu":
        what = {"compile_only": "compile-only", "cpu_numerics": "numerics"}.get(rec.get("mode"), rec.get("mode") or "")
        return f"CPU {what} → {arch}"
    return f"{short_device_name(d.get('name')) or d.get('kind') or '?'} ({arch})"


def parse_created(text: Any) -> _dt.datetime:
    try:
        t = _dt.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return _dt.datetime.min.replace(tzinfo=_dt.timezone.utc)
    return t if t.tzinfo else t.replace(tzinfo=_dt.timezone.utc)


def age_text(created: _dt.datetime, now: _dt.datetime | None = None) -> str:
    now = now or _dt.datetime.now(_dt.timezone.utc)
    s = max(0.0, (now - created).total_seconds())
    if s < 3600:
        return f"{int(s // 60)} min old"
    if s < 86400 * 2:
        return f"{s / 3600:.0f} h old"
    return f"{s / 86400:.0f} days old"


# ------------------------------------------------------------------------------------ summary
@dataclass
class RefView:
    """One reference slot of one artifact: what a reviewer needs about it."""

    name: str
    role: str  # baseline | alternative
    production: bool
    status: str  # ok | unavailable | unsupported | error | not_run
    parity_passed: Optional[bool]
    rel_fro: Optional[float]
    median_ms: Optional[float]
    speedup: Optional[float]
    speed: str  # faster | slower | within_noise | not_timed
    error: Optional[str] = None
    # The two clocks (skillrun.evidence.verdict.ref_speed): ``speedup`` is the ratio the speed label
    # reads, the smaller of the two where they disagree; these are each clock's own ratio.
    events_speedup: Optional[float] = None
    kernel_speedup: Optional[float] = None
    clock_note: Optional[str] = None  # why the clocks disagree (None: they agree, or no second clock)

    @property
    def parity_kind(self) -> str:
        """passes | fails | expected_miss | unsupported | ...: a key of skillrun.evidence.verdict.REF_PARITY_WORDS."""
        from skillrun.evidence.verdict import ref_parity_kind

        return ref_parity_kind(self.status, self.parity_passed, self.production)

    @property
    def fails_unexpectedly(self) -> bool:
        """A failure a reviewer must see: a production reference off the oracle, or any reference error."""
        return self.parity_kind in ("fails", "error")


@dataclass
class Summary:
    verdict: str
    verdict_text: str
    mode: str
    device: str
    device_class: str
    created: str
    commit: str
    dirty: bool
    timing_mode: Optional[str]  # "CUDA graph" | "eager" | None (not timed)
    noise_pct: Optional[float]  # the A/A noise floor the verdict used
    speedup: Optional[float]  # versus `versus`
    versus: Optional[str]  # the reference the speedup is against
    versus_production: bool
    speed: str  # faster | slower | within_noise | not_timed
    port_parity: Optional[bool]
    port_rel_fro: Optional[float]
    port_ms: Optional[float]
    refs: list[RefView] = field(default_factory=list)
    # The verdict as written in the artifact when it differs from ``verdict`` (see verdict.reconcile).
    recorded_verdict: Optional[str] = None
    # The card's production kernels today (empty when the card names none or was not consulted).
    production_names: list[str] = field(default_factory=list)
    # Which timing engine took a GPU measurement: "sustained" (held rounds, balanced positions, and a
    # sustained load before each round, so the device runs in the power state of back-to-back work),
    # "held" (held and balanced, no load: rounds after an idle gap ran at the boost clock, and ratios
    # differed from a back-to-back bench by up to 5 % on the H200) or "position_biased" (before
    # December 2026: slot order alternated after an idle gap, so whichever slot went first paid the
    # host's launch latency; ports read up to 45 % slow). None when nothing was timed on a GPU.
    engine: Optional[str] = None
    # The headline's two clocks (events, profiler kernel durations) and why they disagree, where they do.
    speedup_events: Optional[float] = None
    speedup_kernel: Optional[float] = None
    clock_note: Optional[str] = None
    # p10 and p90 of the per-round A/A ratio (quoted beside noise_pct where the artifact kept them).
    aa_ratio_p10: Optional[float] = None
    aa_ratio_p90: Optional[float] = None
    # The fastest timed oracle-correct production reference (None: none was timed).
    fastest_production: Optional[str] = None
    # The artifact's own headline ratio when today's rule reads another (recorded_verdict likewise).
    recorded_speedup: Optional[float] = None

    @property
    def failing_references(self) -> list[RefView]:
        return [r for r in self.refs if r.parity_passed is False or r.status == "error"]

    @property
    def production_ref(self) -> Optional[RefView]:
        return next((r for r in self.refs if r.production), None)

    def to_json(self) -> dict[str, Any]:
        from dataclasses import asdict

        # "—" and "unknown" are what a table shows for a missing value; JSON says null.
        return {k: (None if v in ("—", "unknown", "") else v) if isinstance(v, str) else v for k, v in asdict(self).items()}


def timing_engine(rec: dict[str, Any]) -> Optional[str]:
    """"sustained", "held" or "position_biased" for a GPU-timed record, None otherwise (see Summary.engine)."""
    t = rec.get("timing") or {}
    if rec.get("mode") != "gpu_measured" or not t.get("port_ms"):
        return None
    if not isinstance(t.get("hold"), dict):
        return "position_biased"
    sus = t.get("sustain")
    return "sustained" if isinstance(sus, dict) and (sus.get("ms") or 0) > 0 else "held"


def speed_axis(speedup: Optional[float], noise_pct: Optional[float]) -> str:
    """faster / slower / within_noise: the harness's own rule (skillrun.evidence.verdict.speed_label)."""
    from skillrun.evidence.verdict import speed_label

    return speed_label(speedup, noise_pct)


def _f(x: Any) -> Optional[float]:
    try:
        return None if x is None else float(x)
    except (TypeError, ValueError):
        return None


def _legacy_noise(t: dict[str, Any]) -> Optional[float]:
    # The harness's verdict compares against max(per-round ratio noise, noise of the medians); the
    # bare ``aa_noise_pct`` field is only the first. Quote what the verdict used (one rule: verdict.recorded_noise).
    from skillrun.evidence.verdict import recorded_noise

    return recorded_noise({"timing": t})


def _legacy_refs(rec: dict[str, Any], noise: Optional[float], production: Optional[frozenset] = None) -> list[RefView]:
    par = rec.get("parity") or {}
    t = rec.get("timing") or {}
    port_ms = _f((t.get("port_ms") or {}).get("median"))
    slots: list[tuple[str, str, bool, Any, Any]] = []
    base = par.get("baseline")
    if base is not None or t.get("baseline_ms"):
        kernel = (base or {}).get("kernel") or ""
        name = kernel.split(":")[-1].removeprefix("build_") if kernel else "baseline"
        # Before cards named their production kernels the baseline was taken to be one; with the
        # card's list at hand, only the names on it are (a per-batch loop baseline is not).
        slots.append((name, "baseline", True if production is None else name in production, base, t.get("baseline_ms")))
    for name, p in (par.get("alternatives") or {}).items():
        slots.append((name, "alternative", bool(production and name in production), p, (t.get("alternatives_ms") or {}).get(name)))
    out = []
    for name, role, prod, p, st in slots:
        p = p or {}
        med = _f((st or {}).get("median"))
        s = round(med / port_ms, 4) if med and port_ms else None
        if p.get("supported") is False:
            status = "unsupported"
        elif p.get("error") and p.get("passed") is None:
            status = "error"
        elif not p:
            status = "not_run"
        else:
            status = "ok"
        out.append(RefView(name=name, role=role, production=prod, status=status,
                           parity_passed=p.get("passed") if status == "ok" else None, rel_fro=_f(p.get("rel_fro")),
                           median_ms=med, speedup=s, speed=speed_axis(s, noise), error=p.get("error")))
    return out


def _rejudged(rec: dict[str, Any], production: Optional[Iterable[str]]):
    """(refs, verdict, text, speedup, versus, versus_production, speed, headline RefSpeed, fastest) under
    today's headline rule (skillrun.evidence.verdict.judge_record), or None where the recorded verdict stands."""
    from skillrun.evidence.verdict import decide, aa_band, record_outcomes, recorded_noise

    got = record_outcomes(rec, production)
    if got is None:
        return None
    port, outs = got
    noise = recorded_noise(rec)
    d = decide(port, outs, noise, aa_band=aa_band(rec))
    rel = {}
    for r in rec.get("references") or []:
        if isinstance(r, dict) and isinstance(r.get("parity"), dict):
            rel[str(r.get("name"))] = _f(r["parity"].get("rel_fro"))
    par = rec.get("parity") or {}
    legacy = {"baseline": par.get("baseline") or {}, **(par.get("alternatives") or {})}
    refs = []
    for o in outs:
        sp = d.speeds[o.name]
        rf = rel.get(o.name)
        if rf is None:
            src = legacy.get(o.name) if o.role != "baseline" else legacy.get("baseline")
            rf = _f((src or {}).get("rel_fro"))
        refs.append(RefView(name=o.name, role=o.role, production=o.production, status=o.status,
                            parity_passed=o.parity_passed, rel_fro=rf, median_ms=o.median_ms, speedup=sp.speedup,
                            speed=sp.speed, error=o.error, events_speedup=sp.events, kernel_speedup=sp.kernel,
                            clock_note=sp.clock_note))
    head = d.speeds.get(d.primary) if d.primary else None
    prim = next((o for o in outs if o.name == d.primary), None)
    return (refs, d.verdict, d.text, d.speedup, d.primary, bool(prim and prim.production),
            head.speed if head else "not_timed", head, d.fastest_production)


def summarize(rec: dict[str, Any], production: Optional[Iterable[str]] = None) -> Summary:
    """The reviewer's view of one artifact, judged by today's rule; new ``references`` block first,
    old fields otherwise.

    A GPU measurement whose port passed the oracle is re-judged from its recorded numbers
    (skillrun.evidence.verdict.judge_record: the headline against the fastest oracle-correct production
    kernel, both clocks, the noise the verdict used); the artifact's own verdict and ratio are kept
    in ``recorded_verdict`` / ``recorded_speedup`` when they differ. ``production``: the card's
    ``references.production`` names today, for artifacts older than the ``references`` block.
    """
    from skillrun.evidence.verdict import aa_band, reconcile, recorded_noise

    prod_set = frozenset(str(n) for n in production) if production else None
    t = rec.get("timing") or {}
    runner = rec.get("runner") or {}
    dev = rec.get("device") or {}
    par = rec.get("parity") or {}
    port = par.get("port") or {}
    verdict = str(rec.get("verdict") or "—")
    recorded = verdict
    port_ms = _f((t.get("port_ms") or {}).get("median"))
    timing_mode = None
    if t.get("port_ms"):
        timing_mode = "CUDA graph" if t.get("cuda_graph") or "graph" in str(t.get("method") or "").lower() else "eager"
    noise = recorded_noise(rec)
    band = aa_band(rec)
    recorded_speedup = _f(rec.get("speedup"))
    head = fastest = None
    judged = _rejudged(rec, prod_set)
    if judged is not None:
        refs, verdict, text, speedup, versus, versus_production, speed, head, fastest = judged
        changed = verdict != recorded or (recorded_speedup is not None and speedup is not None
                                         and abs(recorded_speedup - speedup) > 1e-9 * max(1.0, speedup))
        if changed:
            was = f"{recorded!r}" + (f" at {recorded_speedup:.4g}x" if recorded_speedup is not None else "")
            text += f" [recorded as {was}; read under today's headline rule]"
    else:
        refs_block = rec.get("references")
        if isinstance(refs_block, list) and refs_block:
            refs = []
            for r in refs_block:
                if not isinstance(r, dict):
                    continue
                p = r.get("parity") or {}
                s = _f(r.get("speedup"))
                refs.append(RefView(name=str(r.get("name") or "?"), role=str(r.get("role") or "alternative"),
                                    production=bool(r.get("production")), status=str(r.get("status") or "ok"),
                                    parity_passed=p.get("passed") if isinstance(p, dict) else None,
                                    rel_fro=_f(p.get("rel_fro")) if isinstance(p, dict) else None,
                                    median_ms=_f(r.get("median_ms")), speedup=s,
                                    speed=str(r.get("speed") or speed_axis(s, noise)), error=r.get("error")))
        else:
            refs = _legacy_refs(rec, noise, prod_set)
        speedup = recorded_speedup
        versus_text = str(t.get("versus") or "")
        versus = None
        if speedup is not None:
            if versus_text.startswith("alternative "):
                versus = versus_text.split(" ")[1]
            else:
                base = next((r for r in refs if r.role == "baseline"), None)
                versus = base.name if base else "baseline"
        prod = next((r for r in refs if r.production), None)
        versus_production = bool(prod and versus == prod.name)
        text = rec.get("verdict_text") or rec.get("reason") or ""
        if versus is not None and prod is not None and not versus_production and prod.name not in text:
            text += f" [not against the production reference {prod.name}]"
        elif versus is not None and prod is None and prod_set:
            text += f" [no production kernel was measured ({', '.join(sorted(prod_set))})]"
        speed = speed_axis(speedup, noise)
        if rec.get("mode") == "gpu_measured":
            verdict = reconcile(recorded, speed)
        if verdict != recorded:
            text = (f"{text} [recorded as {recorded!r}; the ratio read against the A/A noise floor "
                    f"({noise:.2f}%) is {speed.replace('_', ' ')}]" if noise is not None else text)
    return Summary(
        verdict=verdict, verdict_text=str(text), mode=str(rec.get("mode") or "—"),
        device=str(dev.get("name") or "—"), device_class=device_class(rec), created=str(rec.get("created") or ""),
        commit=str(runner.get("git_revision") or "unknown")[:12], dirty=bool(runner.get("dirty")),
        engine=timing_engine(rec),
        timing_mode=timing_mode, noise_pct=round(noise, 4) if noise is not None else None, speedup=speedup,
        versus=versus, versus_production=versus_production, speed=speed,
        port_parity=port.get("passed") if port else None, port_rel_fro=_f(port.get("rel_fro")), port_ms=port_ms,
        refs=refs, recorded_verdict=recorded if recorded != verdict else None,
        production_names=sorted(prod_set or ()),
        speedup_events=head.events if head is not None else None,
        speedup_kernel=head.kernel if head is not None else None,
        clock_note=head.clock_note if head is not None else None,
        aa_ratio_p10=band[0] if band else None, aa_ratio_p90=band[1] if band else None,
        fastest_production=fastest,
        recorded_speedup=recorded_speedup if judged is not None and recorded_speedup != speedup else None)


# ------------------------------------------------------------------------------------ entries
@dataclass
class E2ERecord:
    path: str
    record: dict[str, Any]

    @property
    def card_ids(self) -> list[str]:
        return [str(c) for c in self.record.get("card_ids") or []]

    def to_json(self) -> dict[str, Any]:
        r = self.record
        wall = (r.get("measured") or {}).get("wall") or {}
        return {"path": self.path, "card_ids": self.card_ids, "created": r.get("created"), "verdict": r.get("verdict"),
                "measured_gain_pct": wall.get("gain_pct"), "noise_floor_pct": wall.get("noise_floor_pct"),
                "gpu_kernel_gain_pct": ((r.get("measured") or {}).get("gpu_kernel") or {}).get("gain_pct"),
                "projected_gain_pct": (r.get("projection") or {}).get("gain_pct"),
                "outputs_passed": (r.get("outputs") or {}).get("passed"),
                "device": (r.get("device") or {}).get("name"), "reason": r.get("reason")}


@dataclass
class Entry:
    path: str  # relative to the knowledge-base root when under it
    abs_path: Path
    record: dict[str, Any]
    summary: Summary
    key: tuple  # (card, recipe, shape key, device class, mode)
    created: _dt.datetime
    status: str = "current"  # current | superseded | unreliable | invalid | untrusted (not written by the runner, or changed since)
    superseded_by: Optional[str] = None
    superseded: list["Entry"] = field(default_factory=list)  # older entries of the same key (current only)
    stale: bool = False
    stale_reasons: list[str] = field(default_factory=list)
    card_edited: bool = False
    error: Optional[str] = None
    # Why this run can never be current (its timing cannot be trusted: an ineffective hold); such an
    # entry is ``unreliable``, the newest reliable run of its key stays current, and a re-run is due.
    unreliable_reasons: list[str] = field(default_factory=list)
    # The run was judged under another tolerance than the card's today: which way it moved and how
    # ({"direction": "loosened" | "tightened" | "changed", "keys": {key: [recorded, now]}}).
    tolerance_change: Optional[dict[str, Any]] = None
    # On a current entry: an older run of the same key judged under another tolerance reached another
    # verdict (a verdict that moved with the tolerance, not with the kernel).
    tolerance_history: Optional[str] = None

    @property
    def card(self) -> str:
        return self.key[0]

    @property
    def recipe(self) -> str:
        return self.key[1]

    @property
    def shape(self) -> dict[str, Any]:
        return dict(self.record.get("shape") or {})

    @property
    def label(self) -> str:
        """current | superseded | unreliable | invalid, plus 'stale' when it is."""
        return self.status + (" · stale" if self.stale else "")

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "card": self.card, "recipe": self.recipe, "shape": self.shape,
                "device_class": self.key[3], "mode": self.key[4], "created": self.record.get("created"),
                "status": self.status, "superseded_by": self.superseded_by, "stale": self.stale,
                "stale_reasons": self.stale_reasons, "card_edited": self.card_edited, "error": self.error,
                "unreliable_reasons": self.unreliable_reasons, "tolerance_change": self.tolerance_change,
                "tolerance_history": self.tolerance_history, "summary": self.summary.to_json()}


def _sha256(path: Path) -> Optional[str]:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _source_changes(recipe_rec: dict[str, Any], kernel_ref: str, root: Path) -> list[str]:
    """Why the kernel that ran is not today's: its module's or an imported helper's sha256 moved.

    Artifacts with ``kernel_sources`` ({module: sha256} of the kernel's import closure, see
    skillrun.evidence.kernel_sources) are judged by every module in it; older ones carry only
    ``kernel_source_sha256`` and are judged by the kernel module alone, as they always were (their
    runs never recorded which helpers they used, so an edited helper cannot be charged to them).
    """
    kernel_module = kernel_ref.split(":", 1)[0]
    sources = recipe_rec.get("kernel_sources")
    if not isinstance(sources, dict) or not sources:
        recorded = recipe_rec.get("kernel_source_sha256")
        if not recorded:
            return []
        sources = {kernel_module: recorded}
    if len(sources) > MAX_MODULES:
        return [f"the artifact records {len(sources)} kernel sources, more than the {MAX_MODULES} this runner compares"]
    reasons = []
    for module, recorded in sources.items():
        src = locate(module, root)
        try:
            now = source_sha256(src) if src else None
        except SkillRunError:
            now = None
        what = "the kernel source" if module == kernel_module else "the kernel helper"
        if now is None:
            reasons.append(f"{what} {module} cannot be found to compare its sha256")
        elif now != recorded:
            via = "" if module == kernel_module else f" ({module}, imported by {kernel_module})"
            reasons.append(f"{what} {kb_relative(src, root)}{via} changed since the run (sha256 {str(recorded)[:10]}… → {now[:10]}…)")
    return reasons


_UPPER_TOL = ("rtol", "atol", "max_rel_fro")  # larger is looser; min_cosine: smaller is looser


def tolerance_change(recorded: Any, now: Any) -> Optional[dict[str, Any]]:
    """How the card's tolerance moved since a run: ``{"direction": "loosened" | "tightened" | "changed",
    "keys": {key: [recorded, now]}}``, or None when the run was judged under today's tolerance."""
    if not isinstance(recorded, dict) or not isinstance(now, dict):
        return None
    keys = {}
    for k in sorted(set(recorded) | set(now)):
        a, b = _f(recorded.get(k)), _f(now.get(k))
        if a is not None and b is not None and a != b:
            keys[k] = [a, b]
    if not keys:
        return None
    loose = {(b > a) if k in _UPPER_TOL else (b < a) for k, (a, b) in keys.items()}
    direction = "changed" if len(loose) > 1 else ("loosened" if loose == {True} else "tightened")
    return {"direction": direction, "keys": keys}


def unreliable_reasons(rec: dict[str, Any]) -> list[str]:
    """Why a GPU measurement cannot be current, whatever its verdict: the timing engine recorded that
    its device-side hold did not cover the rounds (``timing.hold.ineffective``), so launches after a slot
    that waits for the host may have started on an idle device."""
    hold = (rec.get("timing") or {}).get("hold")
    if rec.get("mode") == "gpu_measured" and isinstance(hold, dict) and hold.get("ineffective"):
        n = hold.get("unheld_rounds")
        return [f"its hold was ineffective ({n} round(s) unheld): launches after a slot that waits for the host may "
                "include idle-device gaps; re-run it"]
    return []


def staleness(rec: dict[str, Any], index: Any, root: Path) -> tuple[list[str], bool]:
    """(reasons the artifact is stale, whether the card file changed since); see the module doc."""
    card_rec = rec.get("card") or {}
    recipe_rec = rec.get("recipe") or {}
    if index is None:
        return [], False
    card = index.skills.get(card_rec.get("id"))
    if card is None:
        return [f"card {card_rec.get('id')!r} is no longer in the knowledge base"], False
    edited = bool(card_rec.get("sha256")) and card_rec.get("sha256") != _sha256(card.path)
    recipe = next((r for r in card.recipes if r.name == recipe_rec.get("name")), None)
    if recipe is None:
        return [f"the card no longer has recipe {recipe_rec.get('name')!r}"], edited
    reasons = []
    if recipe_rec.get("kernel") and recipe_rec["kernel"] != recipe.kernel:
        reasons.append(f"the recipe's kernel is now {recipe.kernel} (ran {recipe_rec['kernel']})")
    if isinstance(recipe_rec.get("config"), dict) and dict(recipe_rec["config"]) != dict(recipe.config):
        changed = sorted(k for k in set(recipe.config) | set(recipe_rec["config"])
                         if recipe.config.get(k) != recipe_rec["config"].get(k))
        reasons.append("the recipe's config changed since the run (" + ", ".join(changed[:6]) + ")")
    change = tolerance_change(rec.get("tolerance"), card.tolerance)
    if change:
        moved = ", ".join(f"{k} {a:g} → {b:g}" for k, (a, b) in change["keys"].items())
        reasons.append(f"judged under an older tolerance: the card's tolerance was {change['direction']} since the run ({moved})")
    reasons += _source_changes(recipe_rec, recipe_rec.get("kernel") or recipe.kernel, root)
    return reasons, edited


@dataclass
class EvidenceIndex:
    root: Path
    entries: list[Entry] = field(default_factory=list)  # every artifact, invalid ones included
    # `skill-run e2e` records (kind e2e_validation): a whole workload, not one card/recipe/shape, so
    # they are listed beside the isolated evidence of the cards they cover, never grouped with it.
    e2e: list[E2ERecord] = field(default_factory=list)
    # What each card of the knowledge base declares and which recipes it has (for card_status), when
    # the index was built with one.
    cards: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Ledger lines whose artifact is gone (skillrun.evidence.ledger): evidence someone deleted.
    lost: list[dict[str, Any]] = field(default_factory=list)

    # --------------------------------------------------------------- queries
    def card_status(self, card_id: str) -> tuple[str, str]:
        """(status, why) of one card from this evidence (see :func:`card_status`)."""
        c = self.cards.get(card_id) or {}
        return card_status(card_id, str(c.get("declared") or "unvalidated"), self, c.get("recipes"))

    @property
    def groups(self) -> dict[tuple, list[Entry]]:
        out: dict[tuple, list[Entry]] = {}
        for e in self.entries:
            if e.status not in ("invalid", "untrusted"):
                out.setdefault(e.key, []).append(e)
        for lst in out.values():
            lst.sort(key=lambda e: (e.created, e.path), reverse=True)
        return out

    def current_entries(self) -> list[Entry]:
        """One entry per key, measured GPU evidence first, then by card, recipe, shape."""
        cur = [e for e in self.entries if e.status == "current"]
        return sorted(cur, key=lambda e: (MODE_ORDER.get(e.key[4], 9), e.card, e.key[3], e.recipe, e.key[2]))

    def invalid_entries(self) -> list[Entry]:
        """Files that are not usable evidence: unreadable, or untrusted (skillrun.evidence.ledger)."""
        return [e for e in self.entries if e.status in ("invalid", "untrusted")]

    def untrusted_entries(self) -> list[Entry]:
        return [e for e in self.entries if e.status == "untrusted"]

    def find(self, path: str | Path) -> Optional[Entry]:
        rel = kb_relative(path, self.root)
        return next((e for e in self.entries if e.path == rel or e.abs_path == Path(path)), None)

    def measured(self, card: str, recipe: str, shape: dict[str, Any], arch: Optional[str] = None,
                 device_name: Optional[str] = None, include_stale: bool = False) -> Optional[Entry]:
        """The current GPU measurement of (card, recipe, shape) on a device of this class, if any.

        The device class matches on arch, and on the GPU model when both sides name one (an H100
        measurement is not evidence for an H200 plan). Stale entries are skipped unless asked for.
        """
        want = shape_key(shape)
        short = short_device_name(device_name) if device_name else None
        best = None
        for e in self.entries:
            if e.status != "current" or e.key[4] != "gpu_measured" or e.card != card or e.recipe != recipe:
                continue
            if e.key[2] != want or (e.stale and not include_stale):
                continue
            d = e.record.get("device") or {}
            if arch and d.get("arch") and d.get("arch") != arch:
                continue
            if short and d.get("name") and short_device_name(d.get("name")) != short:
                continue
            if best is None or e.created > best.created:
                best = e
        return best

    def to_json(self) -> dict[str, Any]:
        cur = self.current_entries()
        return {"root": str(self.root), "counts": self.counts(),
                "current": [dict(e.to_json(), superseded=[s.path for s in e.superseded]) for e in cur],
                "invalid": [e.to_json() for e in self.invalid_entries()],
                "lost": list(self.lost),
                "e2e": [x.to_json() for x in sorted(self.e2e, key=lambda x: str(x.record.get("created")), reverse=True)]}

    def counts(self) -> dict[str, int]:
        return {"artifacts": len(self.entries),
                "current": sum(e.status == "current" for e in self.entries),
                "superseded": sum(e.status == "superseded" for e in self.entries),
                "stale_current": sum(e.status == "current" and e.stale for e in self.entries),
                "unreliable": sum(e.status == "unreliable" for e in self.entries),
                "invalid": sum(e.status in ("invalid", "untrusted") for e in self.entries),
                "untrusted": sum(e.status == "untrusted" for e in self.entries), "lost": len(self.lost)}

    def unreliable_entries(self) -> list[Entry]:
        return [e for e in self.entries if e.status == "unreliable"]


def _files(paths: Iterable[Path]) -> list[Path]:
    files: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            files += sorted(f for f in p.rglob("*.yaml")
                            if not f.name.startswith(".") and not is_temp_name(f.name)
                            and not {"_analysis", "_tuning"} & set(f.relative_to(p).parts))
        elif p.is_file():
            files.append(p)
        else:
            raise InputError("no such artifact file or folder", path=str(p))
    return files


def _production_names(index: Any, card_id: str, device_kind: Optional[str] = None) -> Optional[list[str]]:
    """The card's ``references.production`` list today (None without an index or such a list); with
    ``device_kind`` (cuda, rocm, cpu) only the names that are references on that kind of device."""
    card = index.skills.get(card_id) if index is not None else None
    if card is None:
        return None
    refs = card.references or {}
    names = [str(n) for n in refs.get("production") or []]
    if device_kind and names:
        here = {str(n) for d, n in (refs.get("baseline_names") or {}).items() if d == device_kind}
        here |= {str(a.get("name")) for a in refs.get("alternatives") or [] if a.get("device") in (None, device_kind)}
        names = [n for n in names if n in here] or names
    return names or None


def build_index(index: Any = None, paths: Iterable[Path] | None = None, root: Path | None = None,
                records: Iterable[dict[str, Any]] | None = None) -> EvidenceIndex:
    """Index artifacts from files/folders (default ``<kb>/validation``) or already-loaded records.

    ``index`` (a :class:`~skillrun.kb.index.SkillIndex`) is what staleness is judged against; without
    it nothing is marked stale. A file that is not a valid artifact becomes an ``invalid`` entry
    with the reason, so one broken file never hides the others.
    """
    if root is None:
        root = Path(index.root) if index is not None else None
    if root is None:
        from skillrun.kb.paths import kb_root

        root = kb_root()
    ev = EvidenceIndex(root=Path(root))
    if index is not None:
        ev.cards = {cid: {"declared": str((c.data.get("validation") or {}).get("status") or "unvalidated"),
                          "recipes": [r.name for r in c.recipes]} for cid, c in index.skills.items()}
    loaded: list[tuple[Path, Optional[dict], Optional[str]]] = []
    if records is not None:
        for rec in records:
            bad = rec.get("verdict") == "invalid" or not isinstance(rec.get("recipe"), dict)
            loaded.append((Path(rec.get("artifact") or "(not written)"), None if bad else rec,
                           (rec.get("reason") or "not a validation record") if bad else None))
    else:
        from skillrun.evidence.cache import load_artifacts  # parsed artifacts, reused while their bytes are unchanged

        # Only what the runner wrote is evidence (skillrun.evidence.ledger): a file its folder's ledger
        # does not list, or whose bytes changed since, is untrusted, whatever it claims.
        roots = list(paths) if paths is not None else [ev.root / "validation"]
        led = ledger.load(ev.root, sorted({p.parent for r in roots if Path(r).is_dir()
                                           for p in Path(r).rglob(ledger.LEDGER_NAME)}))
        for f, rec, exc in load_artifacts(_files(roots), load_artifact, ev.root):
            if exc is not None:
                loaded.append((f, None, exc.reason + (f" (field {exc.field})" if exc.field else "")))
                continue
            why = led.check(f)
            loaded.append((f, None, "untrusted: " + why) if why else (f, rec, None))
        ev.lost = [{**x, "path": kb_relative(x["path"], ev.root)} for x in led.lost()]
    stale_cache: dict[tuple, tuple[list[str], bool]] = {}
    for f, rec, error in loaded:
        rel = kb_relative(f, ev.root)
        if rec is None:
            card_id = f.parent.name
            stub = {"verdict": "invalid", "reason": error or "unreadable", "card": {"id": card_id}}
            ev.entries.append(Entry(path=rel, abs_path=f, record=stub, summary=summarize(stub),
                                    key=(card_id, "—", (), "—", "—"), created=parse_created(None),
                                    status="untrusted" if str(error).startswith("untrusted: ") else "invalid", error=error))
            continue
        if rec.get("kind") == "e2e_validation":
            ev.e2e.append(E2ERecord(path=rel, record=rec))
            continue
        card_id = str((rec.get("card") or {}).get("id") or "—")
        recipe = str((rec.get("recipe") or {}).get("name") or "—")
        key = (card_id, recipe, shape_key(rec.get("shape")), device_class(rec), str(rec.get("mode") or "—"))
        rr = rec.get("recipe") or {}
        ck = (card_id, recipe, str((rec.get("card") or {}).get("sha256")), str(rr.get("kernel")), str(rr.get("config")),
              str(rr.get("kernel_source_sha256")), str(rr.get("kernel_sources")), str(rec.get("tolerance")))
        if ck not in stale_cache:
            stale_cache[ck] = staleness(rec, index, ev.root)
        reasons, edited = stale_cache[ck]
        card = index.skills.get(card_id) if index is not None else None
        ev.entries.append(Entry(path=rel, abs_path=f if f.is_absolute() else ev.root / f, record=rec,
                                summary=summarize(rec, _production_names(index, card_id, (rec.get("device") or {}).get("kind"))), key=key, created=parse_created(rec.get("created")),
                                stale=bool(reasons), stale_reasons=list(reasons), card_edited=edited,
                                unreliable_reasons=unreliable_reasons(rec),
                                tolerance_change=tolerance_change(rec.get("tolerance"), card.tolerance) if card is not None else None))
    for lst in ev.groups.values():
        # The newest run whose timing can be trusted is current; a newer unreliable one supersedes nothing.
        reliable = [e for e in lst if not e.unreliable_reasons]
        for e in lst:
            if e.unreliable_reasons:
                e.status = "unreliable"
        if not reliable:
            continue
        head, older = reliable[0], reliable[1:]
        head.status = "current"
        head.superseded = older
        for e in older:
            e.status = "superseded"
            e.superseded_by = head.path
        head.tolerance_history = _tolerance_history(head, [e for e in lst if e is not head and e.created <= head.created])
    return ev


def _tolerance_history(head: Entry, older: list[Entry]) -> Optional[str]:
    """A note when the run this one supersedes was judged under another tolerance and read another
    verdict: the verdict moved with the tolerance (or with it too), which a reader must see."""
    for old in older:
        change = tolerance_change(old.record.get("tolerance"), head.record.get("tolerance"))
        if change and old.summary.verdict != head.summary.verdict:
            moved = ", ".join(f"{k} {a:g} → {b:g}" for k, (a, b) in change["keys"].items())
            return (f"judged under a {change['direction']} tolerance ({moved}) than {old.path}, which read "
                    f"{old.summary.verdict!r}; the verdict moved with the tolerance")
    return None


def card_status(card_id: str, declared: str, ev: Optional[EvidenceIndex], recipes: Optional[Iterable[str]] = None
                ) -> tuple[str, str]:
    """(status, why) of one card, computed from its evidence: the one function `list`, `report`,
    `plan`, MCP and the README read (a word of skillrun.evidence.verdict.CARD_STATUSES).

    * ``validated``: a current, non-stale GPU run of the card is ``validated`` (it beat the fastest
      oracle-correct production kernel), and every recipe (shape class) has current GPU evidence;
    * ``partially_validated``: some shape is validated, some recipes have no current GPU evidence;
    * ``measured``: current GPU evidence, but no shape beats its production kernel;
    * ``stale``: every current GPU run of it is stale; ``compile_verified``: compile-only evidence alone;
    * otherwise what the card declares, if it claims no validation (``seed_claims``), else ``unvalidated``.

    ``recipes``: the card's recipe names (for ``validated`` vs ``partially_validated``).
    """
    claims_nothing = declared if declared in ("seed_claims",) else "unvalidated"
    if ev is None:
        return claims_nothing, ""
    cur = [e for e in ev.current_entries() if e.card == card_id]
    gpu = [e for e in cur if e.key[4] == "gpu_measured"]
    fresh = [e for e in gpu if not e.stale]
    unreliable = sum(e.card == card_id for e in ev.unreliable_entries())
    tail = f"; {unreliable} unreliable run(s) not counted" if unreliable else ""
    if gpu and not fresh:
        return "stale", f"all {len(gpu)} current GPU artifact(s) are stale (kernel or recipe changed since){tail}"
    if fresh:
        counts: dict[str, int] = {}
        for e in fresh:
            counts[e.summary.verdict] = counts.get(e.summary.verdict, 0) + 1
        verdicts = ", ".join(f"{n} {v}" for v, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
        why = f"{len(fresh)} current GPU artifact(s): {verdicts}" + (f"; {len(gpu) - len(fresh)} stale" if len(gpu) > len(fresh) else "") + tail
        if "validated" not in counts:
            return "measured", why
        names = set(recipes or ())
        measured = {e.recipe for e in fresh}
        if names and not names <= measured:
            return "partially_validated", why + f"; {len(names - measured)} of {len(names)} recipe(s) without GPU evidence"
        return "validated", why
    if any(e.summary.verdict == "compile_verified" for e in cur):
        return "compile_verified", f"{sum(e.summary.verdict == 'compile_verified' for e in cur)} compile-only artifact(s); no GPU run"
    return claims_nothing, ("CPU numerics only" if cur else "") + tail
