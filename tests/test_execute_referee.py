"""The timed session's referee (runner/skillrun/execute/referee.py), driven as the parent drives it.

End-to-end cheats that bend the session's checks are in test_execute_judge.py and test_execute_clock.py;
these pin the protocol: the content both sides build from the referee's seeds and plans, commitments
(SHA-256 of dtype, shape and bytes) and the output contract, the order of requests, and what the parent
takes (``fold``) from the session's result and from the referee.
"""
from __future__ import annotations

import random

import pytest
import torch

from defects import problem as toy
from skillrun.execute import integrity, judge, referee
from skillrun.execute.parity import DegenerateInput

SHAPE = {"M": 24, "N": 16, "K": 32}
SLOTS = [{"slot": "port"}, {"slot": "baseline"}]


def task(problem: str = "defects.problem", rounds: int = 8, check: int = 8) -> dict:
    return {"kind": "session", "problem": problem, "shape": SHAPE, "device": "cpu", "slots": SLOTS,
            "port_slot": "port", "peers": [], "timing": {"rounds": rounds, "check_timed": check}}


class Client:
    """What the session's processes ask the referee, relayed the way the parent relays it (session.py)."""

    def __init__(self, ref: referee.Referee) -> None:
        self.ref = ref

    def ask(self, msg: dict) -> dict:
        ans = self.ref.answer(msg)
        if ans.get("error"):
            raise (DegenerateInput if ans.get("input_error") else RuntimeError)(ans["error"])
        return ans

    def new_set(self, j: int) -> int:
        return int(self.ask({"op": "set", "j": j})["seed"])

    def refresh(self, j: int, master: dict) -> dict:
        return self.ask({"op": "refresh", "j": j})["plan"]

    def close(self) -> None:
        self.ref.done = True


@pytest.fixture
def served(tmp_path):
    made = []

    def start(t: dict | None = None):
        ref = referee.Referee(t or task(), tmp_path / f"r{len(made)}")
        made.append(ref)
        return ref, Client(ref)

    yield start
    for ref in made:
        ref.stop()


def honest(inputs: dict) -> torch.Tensor:
    return (inputs["a"].float() @ inputs["b"].float()).half()


def hand(ref: referee.Referee, slot: str, token: int, out: torch.Tensor) -> None:
    side = "accused" if slot == "port" else "references"
    judge.write_output(ref.handovers[side] / f"s{[s['slot'] for s in SLOTS].index(slot)}", token, out, {})


def test_both_sides_build_the_same_content_from_the_referees_seeds_and_plans(served):
    ref, client = served()
    mine = [toy.make_inputs(SHAPE, client.new_set(j), "cpu") for j in range(2)]
    for step in range(6):
        j = step % 2
        plan = client.refresh(j, mine[j])
        referee.apply_refresh(mine[j], toy.make_inputs(SHAPE, plan["seed"], "cpu"), plan)
        assert all(torch.equal(mine[j][k], ref.master[j][k]) for k in mine[j])
    assert ref.refreshes == 6


def test_a_checked_round_is_judged_from_the_bytes_against_the_referees_own_content(served):
    ref, client = served()
    inputs = toy.make_inputs(SHAPE, client.new_set(0), "cpu")
    right, stale = honest(inputs), torch.zeros(SHAPE["M"], SHAPE["N"], dtype=torch.float16)
    outs = {"port": stale, "baseline": right}
    ans = client.ask({"op": "round", "kind": "timed", "index": 0, "read": 0, "last": False,
                      "commits": {n: integrity.output_digest(o) for n, o in outs.items()}})
    assert ans["check"]  # every round is checked when check_timed == rounds
    for n, o in outs.items():
        hand(ref, n, ans["token"], o)
    client.ask({"op": "handed", "token": ans["token"], "foreign": []})
    s = ref.summary()["sampled"]
    assert s["baseline"] == {"checked": 1, "failed": 0, "handover_failed": 0, "failures": []}
    assert s["port"]["checked"] == 1 and s["port"]["failed"] == 1 and s["port"]["handover_failed"] == 0
    assert not [f for d in ref.handovers.values() for f in d.rglob("*.bin")]  # judged bytes do not pile up


def test_an_output_changed_after_the_round_was_chosen_fails_its_commitment(served):
    ref, client = served()
    inputs = toy.make_inputs(SHAPE, client.new_set(0), "cpu")
    stale = torch.zeros(SHAPE["M"], SHAPE["N"], dtype=torch.float16)
    ans = client.ask({"op": "round", "kind": "timed", "index": 0, "read": 0, "last": False,
                      "commits": {"port": (integrity.output_digest(stale)),
                                  "baseline": (integrity.output_digest(honest(inputs)))}})
    hand(ref, "port", ans["token"], honest(inputs))  # the right answer, computed once the round was chosen
    hand(ref, "baseline", ans["token"], honest(inputs))
    client.ask({"op": "handed", "token": ans["token"], "foreign": []})
    port = ref.summary()["sampled"]["port"]
    assert port["failed"] == port["handover_failed"] == 1 and "not the one the session committed to" in port["failures"][0]


def test_requests_out_of_order_fail_the_accused_and_are_refused(served):
    ref, client = served()
    client.new_set(0)
    with pytest.raises(RuntimeError):
        client.ask({"op": "handed", "token": 5, "foreign": []})  # no round was chosen
    with pytest.raises(RuntimeError):
        client.ask({"op": "set", "j": 7})  # sets are made in order
    with pytest.raises(RuntimeError):
        client.ask({"op": "round", "kind": "timed", "index": 0, "read": 0})  # no commitments
    client.close()
    summary = ref.summary()
    assert len(summary["problems"]) == 3 and summary["done"]
    res = {"status": "ok", "slots": {"port": {"integrity": {"passed": True}}, "baseline": {"integrity": {"passed": True}}},
           "timing": {"rounds": 0}}
    out = referee.fold(res, task(), summary)
    assert not out["slots"]["port"]["integrity"]["passed"]
    assert "broke the referee's protocol" in out["slots"]["port"]["integrity"]["reason"]


def test_a_degenerate_problem_is_rejected_by_the_referee(served):
    _, client = served(task("defects.problem_zero"))
    with pytest.raises(DegenerateInput, match="all zeros"):
        client.new_set(0)


def test_fold_takes_every_check_from_the_referee_never_from_the_session():
    claimed = {"passed": True, "cosine": 1.0}
    res = {"status": "ok", "post_timing_parity": claimed, "input_error": False, "timing": {"rounds": 8},
           "slots": {n: {"integrity": {"passed": True, "sampled_timed_outputs": {"checked": 8, "failed": 0, "failures": []}}}
                     for n in ("port", "baseline")}}
    summary = {"sampled": {"port": {"checked": 2, "failed": 0, "failures": []},
                           "baseline": {"checked": 2, "failed": 0, "failures": []}},
               "timed_rounds": 5, "checked_rounds": 2, "post": {}, "problems": [], "input_error": None, "done": True}
    out = referee.fold(res, task(), summary)
    port = out["slots"]["port"]["integrity"]
    assert port["sampled_timed_outputs"]["checked"] == 2  # the referee's count, not the session's 8
    assert not port["passed"] and "the referee was told of 5" in port["reason"]
    assert out["post_timing_parity"]["passed"] is False  # claimed, never handed over
    assert out["slots"]["baseline"]["integrity"]["passed"]  # a reference is not blamed for the session's protocol


def test_the_referee_chooses_about_check_timed_of_the_rounds(served):
    ref, client = served(task(rounds=40, check=4))
    inputs = toy.make_inputs(SHAPE, client.new_set(0), "cpu")
    out = honest(inputs)
    commit = (integrity.output_digest(out))
    chosen = []
    for i in range(40):
        ans = client.ask({"op": "round", "kind": "timed", "index": i, "read": 0, "last": i == 39,
                          "commits": {"port": commit, "baseline": commit}})
        if ans["check"]:
            chosen.append(i)
            hand(ref, "port", ans["token"], out)
            hand(ref, "baseline", ans["token"], out)
            client.ask({"op": "handed", "token": ans["token"], "foreign": []})
    assert len(chosen) == 4 and ref.summary()["sampled"]["port"] == {"checked": 4, "failed": 0, "handover_failed": 0, "failures": []}


def test_local_source_plans_keep_row_aligned_groups_together():
    src = referee.LocalSource(random.Random(3))
    master = {"x": torch.zeros(64, 4), "s": torch.zeros(64, 1), "w": torch.zeros(8, 8), "n": 3}
    for _ in range(20):
        plan = src.refresh(0, master)
        assert set(plan["groups"]) == {"64", "8"}
        assert all(v in ("full", "keep") or (isinstance(v, list) and len(v) == 2) for v in plan["groups"].values())
        assert any(v != "keep" for v in plan["groups"].values())


def test_a_reference_wrong_on_some_timed_calls_fails_the_oracle_but_stays_comparable():
    from skillrun.execute.harness import _parity_summary

    wrong = {"checked": 16, "failed": 5, "handover_failed": 0, "failures": ["timed round 5: 1/7168 elements outside"]}
    summary = {"sampled": {"port": {"checked": 16, "failed": 0, "handover_failed": 0, "failures": []}, "baseline": wrong},
               "timed_rounds": 16, "post": {"port": {"passed": True}}, "problems": [], "input_error": None, "done": True}
    res = {"status": "ok", "timing": {"rounds": 16}, "slots": {n: {"integrity": {"passed": True}} for n in ("port", "baseline")}}
    gates = {n: s["integrity"] for n, s in referee.fold(res, task(), summary)["slots"].items()}
    assert gates["port"]["passed"] and gates["baseline"]["passed"]  # a correctness fact, not an integrity one
    assert "5 of 16 sampled timed calls fail the oracle although its isolated calls passed" in gates["baseline"]["sampled_timed_outputs"]["note"]
    shown = _parity_summary({"passed": True, "cosine": 1.0}, gates["baseline"])
    assert shown["passed"] is False and shown["sampled_failed"] == 5 and shown["sampled_checked"] == 16
    # the accused get no such benefit of the doubt, and a reference whose bytes did not arrive is not trusted
    summary["sampled"]["port"] = wrong
    summary["sampled"]["baseline"] = {**wrong, "handover_failed": 1}
    gates = {n: s["integrity"] for n, s in referee.fold(res, task(), summary)["slots"].items()}
    assert not gates["port"]["passed"] and not gates["baseline"]["passed"]


def test_a_session_cannot_make_the_referee_hold_more_sets_than_it_may_use(served):
    t = task()
    t["timing"]["max_sets"] = 3
    ref, client = served(t)
    for j in range(3):
        client.new_set(j)
    with pytest.raises(RuntimeError):
        client.new_set(3)
    assert len(ref.master) == 3 and "beyond the session's 3" in ref.summary()["problems"][0]


def test_the_oracle_is_real_fp32_and_the_callers_settings_are_put_back(served):
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True  # a user's process that allows TF32
    try:
        seen = []
        ref, client = served()
        real = ref.problem.oracle

        def spy(inputs):
            seen.append(torch.backends.cuda.matmul.allow_tf32)
            return real(inputs)

        ref.problem = type("P", (), {"oracle": staticmethod(spy), "make_inputs": staticmethod(toy.make_inputs)})
        client.new_set(0)
        assert seen == [False] and torch.backends.cuda.matmul.allow_tf32 is True
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def test_an_output_of_another_dtype_breaks_the_contract_even_when_right_and_committed(served):
    ref, client = served()
    inputs = toy.make_inputs(SHAPE, client.new_set(0), "cpu")
    wide = (inputs["a"].float() @ inputs["b"].float()).double()  # the right values, float64 (the problem says float16)
    outs = {"port": wide, "baseline": honest(inputs)}
    ans = client.ask({"op": "round", "kind": "timed", "index": 0, "read": 0, "last": False,
                      "commits": {n: integrity.output_digest(o) for n, o in outs.items()}})
    for n, o in outs.items():
        hand(ref, n, ans["token"], o)
    client.ask({"op": "handed", "token": ans["token"], "foreign": []})
    port = ref.summary()["sampled"]["port"]
    assert port["failed"] == port["handover_failed"] == 1 and "contract" in port["failures"][0] and "float64" in port["failures"][0]
    assert ref.summary()["sampled"]["baseline"]["failed"] == 0


def test_every_profiled_round_is_checked(served):
    ref, client = served(task(rounds=40, check=1))
    inputs = toy.make_inputs(SHAPE, client.new_set(0), "cpu")
    commit = integrity.output_digest(honest(inputs))
    for i in range(3):
        ans = client.ask({"op": "round", "kind": "observed", "index": i, "read": 0, "last": False,
                          "commits": {"port": commit, "baseline": commit}})
        assert ans["check"]
        for n in ("port", "baseline"):
            hand(ref, n, ans["token"], honest(inputs))
        client.ask({"op": "handed", "token": ans["token"], "foreign": []})
    assert ref.summary()["observed_checked"] == 3 and ref.summary()["sampled"]["port"]["checked"] == 3


def test_the_commitment_binds_where_a_linear_checksum_did_not():
    """Four words moved by +1/-1 in a rectangle keep every row sum and column sum (the word-sum checksum
    the session used to commit with); the SHA-256 commitment tells the two outputs apart."""
    out = torch.randn(64, 2048).to(torch.float16)
    forged = out.clone()
    w = forged.view(-1).view(torch.int32).view(64, 1024)  # the old checksum's rows of 1024 int32 words
    w[2, 5] += 1
    w[2, 9] -= 1
    w[7, 5] -= 1
    w[7, 9] += 1
    old = lambda t: (int(t.sum()), int((t.sum(1) * torch.arange(1, 65)).sum()), int((t.sum(0) * torch.arange(1, 1025)).sum()))  # noqa: E731
    assert old(out.view(-1).view(torch.int32).view(64, 1024).long()) == old(w.long())
    assert not torch.equal(out, forged)
    assert integrity.output_digest(out) != integrity.output_digest(forged)
    assert integrity.output_digest(out) == integrity.output_digest(out.clone())
