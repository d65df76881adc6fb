"""Summaries of timing samples and the A/A noise floor (pure Python: usable in parent and child)."""
from __future__ import annotations

import math
from typing import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100] (numpy's default method)."""
    if not values:
        raise ValueError("percentile of no samples")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(samples: Sequence[float]) -> dict[str, float | int]:
    """median/min/max/p10/p90 and spread = (p90 - p10) / median in percent."""
    med = percentile(samples, 50)
    p10, p90 = percentile(samples, 10), percentile(samples, 90)
    return {
        "median": med,
        "min": min(samples),
        "max": max(samples),
        "p10": p10,
        "p90": p90,
        "spread_pct": 100.0 * (p90 - p10) / med if med > 0 else 0.0,
        "samples": len(samples),
    }


def aa_noise(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """The same kernel timed in two interleaved slots: how far apart two identical things look.

    ``aa_noise_pct`` is |1 - median of the per-round ratios| in percent (what the schema records);
    the p10/p90 of the per-round ratio say how much a single round can wander.
    """
    ratios = [x / y for x, y in zip(a, b) if y > 0]
    if not ratios:
        raise ValueError("A/A noise needs paired samples")
    med = percentile(ratios, 50)
    return {
        "aa_noise_pct": abs(1.0 - med) * 100.0,
        "aa_ratio_median": med,
        "aa_ratio_p10": percentile(ratios, 10),
        "aa_ratio_p90": percentile(ratios, 90),
        "aa_medians_pct": abs(1.0 - percentile(a, 50) / percentile(b, 50)) * 100.0,
    }


def engine_facts(t: dict) -> dict:
    """What the timing engine recorded beyond the kept samples, for the artifact (raw samples,
    per-round facts, the hold, position effect, the profiler's second clock). Empty for sessions
    from an engine that recorded none of it."""
    out: dict = {}
    if "raw" in t:
        out["raw_samples"] = {slot: {"ms": [round(x, 6) for x in cols["ms"]], "round": cols["round"],
                                     "position": cols["position"], "set": cols["set"], "kept": cols["kept"]}
                              for slot, cols in t["raw"].items()}
    ri = t.get("round_info")
    if ri:
        clocks = [c for c in ri.get("clock_mhz") or [] if isinstance(c, (int, float))]
        out["rounds_info"] = {"held": ri.get("held"), "throttled": ri.get("throttled"),
                              "clock_mhz": ri.get("clock_mhz") if clocks else None,
                              "queue_us": ri.get("queue_us"), "load_ms": ri.get("load_ms")}
    if "unheld_rounds" in t:
        out["hold"] = {"used": bool(t.get("held")), "final_us": round(t["hold_us"], 1) if t.get("hold_us") else None,
                       "unheld_rounds": t.get("unheld_rounds", 0), "throttled_rounds": t.get("throttled_rounds", 0),
                       "ineffective": bool(t.get("hold_ineffective")),
                       "per_launch": bool(t.get("launch_hold")),
                       "self_syncing": dict(t.get("self_syncing") or {}),
                       "unspun": list(t.get("unspun") or []),
                       "how": ("a device-side spin (torch.cuda._sleep, calibrated in SM cycles) queued before each round, "
                               "sized to outlast the host's queuing of the round; a round whose spin had ended before "
                               "the last launch was queued is not kept")
                       if t.get("held") else "none (host timer or hold disabled)"}
        if t.get("unspun"):
            out["hold"]["unspun_how"] = (
                "these slots synchronize inside their launch (the host waits for the device mid-call), so once seen "
                "doing so in two rounds they get no spin before their launches (the host would only wait through it): "
                "their events time the call as the device saw it, host round trips included, and second_clock gives "
                "their kernel durations from the profiled rounds")
    if t.get("sustain_ms") is not None:
        out["sustain"] = {"ms": t["sustain_ms"],
                          "how": ("before each timed round, about this many ms of the round's own launches (other input "
                                  "sets, untimed) are queued ahead of the hold, so every round starts in the power state of "
                                  "back-to-back work; the SM clock is read once the hold ends") if t["sustain_ms"] else
                                 "none: rounds start in whatever power state the gap before them left"}
    if t.get("position_effect"):
        out["position_effect"] = t["position_effect"]
    if t.get("stop"):
        out["stop"] = t["stop"]  # why the session ended where it did (confidence.StopRule.record)
    prof = {k: v for k, v in (t.get("profiler_ms") or {}).items() if v}
    if prof:
        out["second_clock"] = {"method": "torch.profiler device activity: busy time of the slot's kernels in each observed launch",
                               "median_ms": {k: round(percentile(v, 50), 6) for k, v in prof.items()},
                               # the same launches by the events: the two clocks compared like for like
                               "events_median_ms": {k: round(percentile(v, 50), 6)
                                                    for k, v in (t.get("observed") or {}).items() if v and k in prof},
                               "launches": {k: len(v) for k, v in prof.items()}}
    return out


def timing_warnings(timing: dict, stats: dict, noise_pct: float | None) -> list[str]:
    """Named warnings a reviewer must see: a position effect above the noise floor, unheld or throttled
    rounds, and a second clock that disagrees with the events beyond the noise."""
    out = []
    floor = max(noise_pct or 0.0, 1.0)
    pe = timing.get("position_effect") or {}
    if pe.get("max_pct", 0) > floor:
        out.append(f"position effect: {pe['slot']}'s median differs by {pe['max_pct']:.1f}% between positions in the round "
                   f"(noise floor {floor:.1f}%); positions are balanced, so no slot is favoured, but the spread is real")
    hold = timing.get("hold") or {}
    if hold.get("ineffective"):
        out.append(f"the hold did not cover {hold['unheld_rounds']} of the rounds: a slot waits for the host inside its "
                   "launch (eager code that synchronizes), so launches after it in a round may include idle-device "
                   "gaps; those rounds were kept (positions are balanced) rather than losing the slot")
    elif hold.get("per_launch"):
        sync = ", ".join(f"{k} ({v} rounds)" for k, v in sorted((hold.get("self_syncing") or {}).items())) or "none seen"
        out.append("a launch waited for the host inside itself, so every launch was then held on its own (a spin before "
                   f"each start event) and no slot after it started on an idle device; synchronizing inside the launch: {sync} "
                   "(their times include that host round trip, their own cost"
                   + ("; " + ", ".join(hold["unspun"]) + " then ran with no spin before it, timed by events around the call"
                      if hold.get("unspun") else "") + ")")
    if hold.get("unheld_rounds") and hold.get("per_launch"):
        out.append(f"{hold['unheld_rounds']} round(s) before every launch was held on its own were left out")
    elif hold.get("unheld_rounds") and not hold.get("ineffective"):
        out.append(f"{hold['unheld_rounds']} round(s) started before the round was fully queued (hold too short) "
                   "and were left out; the hold was lengthened")
    if hold.get("throttled_rounds"):
        out.append(f"{hold['throttled_rounds']} round(s) ran with the SM clock below 75% of the session's median and were left out")
    sc = (timing.get("second_clock") or {}).get("median_ms") or {}
    # Events of the same observed launches where recorded: the observed rounds run without the
    # sustained load, so the plain rounds' events sit in another power state than the profiler's.
    same = (timing.get("second_clock") or {}).get("events_median_ms") or {}
    port_k = sc.get("port")
    if port_k and "port" in stats:
        for slot, k in sc.items():
            if slot == "port" or slot.endswith("#aa") or slot not in stats or not k:
                continue
            if same.get(slot) and same.get("port"):
                ev = same[slot] / same["port"]
            else:
                ev = stats[slot]["median"] / stats["port"]["median"]
            kr = k / port_k
            diff = 100.0 * abs(kr / ev - 1.0)
            if diff > max(floor, 3.0):
                out.append(f"second clock disagrees for {slot}: events say {ev:.3f}x, profiler kernel durations "
                           f"{kr:.3f}x ({diff:.1f}% apart)")
    return out
