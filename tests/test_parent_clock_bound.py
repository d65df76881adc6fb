"""The parent's clock around every timed launch request, judged against the references' requests: the numbers
of the first H200 run (a 512 MiB output, ~480 ms of every request its commitment) refused an honest port
because the canary's tiny requests were pooled with the references' own; a port that hides work outside its
timed interval must still be refused."""
from __future__ import annotations

import random
from types import SimpleNamespace

from skillrun.execute import session

# Per slot on the H200 at b7d9c8c (benchmarks/results/refused_honest_port_b7d9c8c_*.yaml): median claim, and the
# low quantile of the parent's time beyond the claim.
H200 = {"baseline": (7.01, 486.8), "baseline#aa": (7.01, 486.1), "alt:cublas_blockwise_padded": (7.01, 496.4),
        "alt:mslk_groupwise": (8.47, 477.3), "alt:bf16_cublas": (10.69, 487.8), "canary": (1.36, 1.33)}


def _session(port_claim: float, port_unaccounted: float) -> SimpleNamespace:
    rng = random.Random(7)
    bounds = {}
    for n, (c, u) in {**H200, "port": (port_claim, port_unaccounted)}.items():
        # 16 launches: the low quantile is the value itself, the rest only ever later (scheduling delays)
        bounds[n] = [(c, c + u + (0.0 if k < 4 else rng.uniform(0, 30))) for k in range(16)]
    roles = {n: ("accused" if n == "port" else "references") for n in bounds}
    return SimpleNamespace(bounds=bounds, impossible={}, accused={"port"}, contract={}, use_device=True, guard={},
                           child_of=lambda n: SimpleNamespace(role=roles[n]))


def _judge(s) -> dict:
    res = {"slots": {"port": {"integrity": {"passed": True}}},
           "timing": {"parent_clock": session._parent_clock(s), "canary": {"ratio": 1.0}}}
    session._accused_facts(s, res, "port", {})
    return res


def test_the_canary_is_not_pooled_with_the_references_output_requests():
    pc = session._parent_clock(_session(8.35, 503.1))
    assert 480 < pc["reference_overhead_ms"] < 495  # the median of the references' slots, not the canary-dragged 451
    assert abs(pc["reference_spread_ms"] - (496.4 - 477.3)) < 0.5


def test_the_honest_port_of_the_h200_run_passes():
    gate = _judge(_session(8.35, 503.1))["slots"]["port"]["integrity"]
    assert gate["passed"], gate.get("reason")


def test_a_port_that_works_outside_its_timed_interval_is_still_refused():
    # 8.35 ms claimed, 60 ms more work per request than any reference's commitment costs: beyond claim + spread
    gate = _judge(_session(8.35, 560.0))["slots"]["port"]["integrity"]
    assert not gate["passed"] and "works outside the timed interval" in gate["reason"]
