"""The timed session's referee: the session's checks decided where no port can reach.

The timed session runs in two child processes, the accused's (the port and its peers) and the
references' (session.py); the parent, which never imports a kernel module, drives every round and
holds this referee. Everything that *decides* about the session is here:

* **input content.** Every input set's content comes from a seed and a refresh plan (which rows
  change, and how) that the referee draws (``os.urandom``) and keeps. It holds its own copy of
  every set's content, built from the same seeds, so it knows what each set held in every round
  without asking the accused.
* **which rounds are checked**, drawn after the round, once every slot has *committed* to its
  output (a SHA-256 digest of its dtype, shape and bytes, integrity.output_digest, returned with the
  launch itself). Only then does the referee say whether this round is checked; if it is, the
  session's processes hand the outputs over as bytes (judge.write_output) and the referee rebuilds
  each as a plain tensor, verifies it against the commitment and the problem's output contract
  (dtype and shape of ``output_like``), and compares it with the fp32 oracle of the content it
  holds. A port cannot wait to learn the choice and then compute the right answer: its answer was
  committed first, and a collision-resistant digest cannot be met by other bytes. Every profiled
  round is checked: a port that knows it is watched is judged on what it did then.
* **the counters and the result**: sampled checks, failures, the post-timing check and whether the
  problem's inputs are degenerate live here, and the parent takes them from here only
  (:func:`fold`); what the session's processes say about them is dropped.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from skillrun.execute import confidence, integrity, judge, parity

_MODES = ("full", "block", "block", "keep")


# ------------------------------------------------------------------------------------------------
# input content: one plan, applied the same way by the session and the referee


def groups_of(master: dict) -> dict[str, list[str]]:
    """Tensors of a set by their dim-0 length (``"none"`` for 0-d): a group changes rows together."""
    out: dict[str, list[str]] = {}
    for k, v in master.items():
        if _is_tensor(v):
            out.setdefault(str(int(v.shape[0])) if v.dim() else "none", []).append(k)
    return out


def draw_refresh(groups: dict[str, list[str]], rng: random.Random) -> dict[str, Any]:
    """A refresh plan: a content seed, and per group ``full`` / ``keep`` or a ``[start, length]`` block."""
    plan: dict[str, Any] = {"seed": rng.randrange(1, 2**62), "groups": {}}
    modes = {g: rng.choice(_MODES) for g in sorted(groups)}
    if modes and all(v == "keep" for v in modes.values()):
        modes[rng.choice(sorted(modes))] = "block"
    for g, mode in modes.items():
        rows = int(g) if g != "none" else None
        if mode == "block" and (rows is None or rows < 2):
            mode = "full"
        if mode == "block":
            length = rng.randint(1, max(1, rows // 4))
            plan["groups"][g] = [rng.randint(0, rows - length), length]
        else:
            plan["groups"][g] = mode
    return plan


def apply_refresh(master: dict, fresh: dict, plan: dict) -> None:
    """Write a refresh plan into ``master`` in place, its new content taken from ``fresh``."""
    for k, v in master.items():
        if not _is_tensor(v):
            master[k] = fresh[k]
    groups = groups_of(master)
    for g, how in plan["groups"].items():
        for k in groups.get(g, ()):
            if how == "full":
                master[k].copy_(fresh[k])
            elif isinstance(how, list):
                start, length = int(how[0]), int(how[1])
                master[k][start:start + length].copy_(fresh[k][start:start + length])


def _is_tensor(v: Any) -> bool:
    import torch

    return isinstance(v, torch.Tensor)


class LocalSource:
    """Seeds and refresh plans drawn in this process (unit tests of InputSets; no referee)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def new_set(self, j: int) -> int:
        return self.rng.randrange(1, 2**62)

    def decoy(self) -> int:
        return self.rng.randrange(1, 2**62)

    def refresh(self, j: int, master: dict) -> dict:
        return draw_refresh(groups_of(master), self.rng)


class Referee:
    """Decides about one session (see the module doc); ``summary()`` once its processes have ended."""

    def __init__(self, task: dict, folder: str | Path, handover: dict[str, str | Path] | None = None) -> None:
        import torch  # noqa: F401  (the referee computes oracles: the parent imports torch only now)

        self.task, self.folder = task, Path(folder)
        # Each side of the session hands over into a folder of its own (the accused cannot write the
        # references'): ``handover`` names them (a card's servers write only their own folders, sessions.py),
        # else they are made here.
        if handover is None:
            handover = {side: self.folder / "handover" / side for side in ("accused", "references")}
            for d in handover.values():
                d.mkdir(parents=True)
        self.handovers = {side: Path(d) for side, d in handover.items()}
        # The problem module as the parent pinned it before any port ran (judge.load_problem), never as
        # the file (or an earlier import) is now: a port that appended code to it changes nothing here.
        self.pin = task.get("problem_pin") or judge.pin_problem(task["problem"])
        self.problem = judge.load_problem(task["problem"], self.pin)
        self.shape, self.device = dict(task["shape"]), task["device"]
        self.tol = parity.tolerance_of(task.get("tolerance"))
        self.slots = [s["slot"] for s in task["slots"]]
        self.accused = {task["port_slot"], *(task.get("peers") or [])}
        self.contract = output_contract(self.problem, self.shape, self.device)
        tcfg = task.get("timing") or {}
        self.rounds = max(1, int(tcfg.get("rounds", 100)))
        # A session that stops on confidence (confidence.py) runs at least plan_rounds and at most
        # ``rounds``: the checks are drawn over the rounds it is sure to run, and past them at the same
        # rate, so stopping early never leaves a port with fewer checks, nor unchecked late rounds.
        planned = confidence.plan_rounds(task)
        self.open_ended = planned is not None
        if planned is not None:
            self.rounds = planned
        self.k_target = max(1, min(int(tcfg.get("check_timed", 16)), self.rounds))
        # The session makes at most max_sets input sets (timing.rotation_sets); the referee holds a copy
        # of each, so a session asking for more is refused before it can fill this process's memory.
        self.max_sets = max(2, int(tcfg.get("max_sets", 32)))
        self.rng = random.SystemRandom()
        self.master: list[dict] = []
        self.oracles: dict[int, Any] = {}
        # failed: every failed check; handover_failed: those not even judged (no plain tensor, no bytes,
        # bytes other than committed, another dtype or shape), which say more than numerics do
        self.sampled = {n: {"checked": 0, "failed": 0, "handover_failed": 0, "failures": []} for n in self.slots}
        self.post: dict[str, dict] = {}
        self.timed = self.checked = self.observed = self.refreshes = 0
        self.problems: list[str] = []
        self.input_error: str | None = None
        self.pending: dict | None = None  # the round whose outputs were asked for
        self.done = False

    def answer(self, msg: Any) -> dict:
        """One request of the session's protocol, as the parent relays it: the answer, or ``{"error",
        "input_error"?}`` when refused; a malformed request is a problem held against the accused."""
        try:
            if not isinstance(msg, dict):
                raise ValueError("a request that is not a JSON object")
            return self._answer(msg)
        except _Refused as exc:
            return {"error": str(exc), **({"input_error": True} if exc.input_error else {})}
        except Exception as exc:  # noqa: BLE001 - a malformed request fails the session, not the parent
            self.problems.append(f"the session broke the referee's protocol: {type(exc).__name__}: {str(exc)[:300]}")
            return {"error": "protocol error"}

    def stop(self) -> None:
        """After the session's processes have ended: the referee's device memory is freed."""
        self.master.clear()
        self.oracles.clear()
        if str(self.device).startswith("cuda"):
            import torch

            torch.cuda.empty_cache()

    def _answer(self, msg: dict) -> dict:
        op = msg.get("op")
        if self.done:
            raise ValueError(f"{op!r} after the session said it was done")
        if op == "set":
            return {"seed": self._new_set(int(msg["j"]))}
        if op == "decoy":
            return {"seed": self.rng.randrange(1, 2**62)}
        if op == "refresh":
            return {"plan": self._refresh(int(msg["j"]))}
        if op == "round":
            return self._round(msg)
        if op == "handed":
            return self._handed(msg)
        if op == "done":
            self.done = True
            return {"ok": True}
        raise ValueError(f"unknown request {str(op)[:40]!r}")

    # -- content ----------------------------------------------------------------------------

    def _set(self, j: int) -> dict:
        if not 0 <= j < len(self.master):
            raise ValueError(f"input set {j} does not exist")
        return self.master[j]

    def _new_set(self, j: int) -> int:
        if j != len(self.master):
            raise ValueError(f"input set {j} asked for out of order")
        if j >= self.max_sets:
            raise ValueError(f"input set {j} asked for, beyond the session's {self.max_sets}")
        seed = self.rng.randrange(1, 2**62)
        self.master.append(self.problem.make_inputs(dict(self.shape), seed, self.device))
        if j == 0:
            self._oracle(0)  # a degenerate problem is rejected before any candidate is timed
        return seed

    def _refresh(self, j: int) -> dict:
        if self.pending is not None:
            raise ValueError("new content asked for before the checked round's outputs were handed over")
        master = self._set(j)
        plan = draw_refresh(groups_of(master), self.rng)
        apply_refresh(master, self.problem.make_inputs(dict(self.shape), plan["seed"], self.device), plan)
        self.oracles.pop(j, None)
        self.refreshes += 1
        return plan

    def _oracle(self, j: int) -> Any:
        if j not in self.oracles:
            try:
                with _real_fp32():
                    ref = parity.oracle_of(self.problem, self.task["problem"], self.shape, self._set(j))
            except parity.DegenerateInput as exc:
                self.input_error = str(exc)
                raise _Refused(self.input_error, input_error=True) from None
            self.oracles = {j: ref}  # one at a time: they can be large
        return self.oracles[j]

    # -- rounds and checks ------------------------------------------------------------------

    def _round(self, msg: dict) -> dict:
        """A timed round has ended and every slot committed to its output: is it checked? A profiled
        round always is (the port may know it is watched: it is judged on what it did then)."""
        if self.pending is not None:
            raise ValueError("a round reported before the checked round's outputs were handed over")
        if msg.get("kind") not in ("timed", "observed"):
            return {"check": False}
        commits = msg.get("commits")
        if not isinstance(commits, dict):
            raise ValueError("a timed round without its outputs' commitments")
        if msg.get("kind") == "observed":
            self.observed += 1
            token = self.rng.randrange(1, 2**62)
            self.pending = {"token": token, "set": int(msg["read"]), "round": int(msg.get("index", -1)),
                            "commits": commits, "what": f"profiled round {int(msg.get('index', -1))}"}
            return {"check": True, "token": token}
        self.timed += 1
        left = max(1, self.rounds - (self.timed - 1))
        need = self.k_target - self.checked
        check = need > 0 and (self.rng.random() * left < need or (bool(msg.get("last")) and self.checked == 0))
        if self.open_ended and self.timed > self.rounds:
            check = self.rng.random() * self.rounds < self.k_target  # past the planned rounds: the same rate
        if not check:
            return {"check": False}
        self.checked += 1
        token = self.rng.randrange(1, 2**62)
        self.pending = {"token": token, "set": int(msg["read"]), "round": int(msg.get("index", -1)),
                        "commits": commits, "what": f"timed round {int(msg.get('index', -1))}"}
        return {"check": True, "token": token}

    def _handed(self, msg: dict) -> dict:
        """The outputs of the round just chosen (or of the post-timing call), judged here."""
        what = msg.get("what", "round")
        if what == "post":
            slot = str(msg.get("slot"))
            if slot not in self.slots or slot in self.post:
                raise ValueError(f"a post-timing output for slot {slot[:40]!r}")
            self.post[slot] = self._judge_one(slot, 0, int(msg.get("token", 0)), msg.get("commit"))
            return {"ok": True}
        p, self.pending = self.pending, None
        if p is None or msg.get("token") != p["token"]:
            raise ValueError("outputs handed over for a round that was not chosen")
        excused = set(msg.get("foreign") or []) - self.accused  # only a reference is excused: its inputs were written by another slot
        for n in self.slots:
            if n in excused:
                continue
            m = self._judge_one(n, p["set"], p["token"], p["commits"].get(n))
            s = self.sampled[n]
            s["checked"] += 1
            if not m["passed"]:
                s["failed"] += 1
                s["handover_failed"] += int(bool(m.get("handover")))
                if len(s["failures"]) < 3:
                    s["failures"].append(f"{p['what']}: {str(m.get('error', 'failed'))[:200]}")
        return {"ok": True}

    def _judge_one(self, slot: str, j: int, token: int, commit: Any) -> dict:
        ref = self._oracle(j)
        # each side of the session hands over into its own folder: the accused cannot write a reference's
        folder = self.handovers["accused" if slot in self.accused else "references"] / f"s{self.slots.index(slot)}"
        try:
            out, _meta = judge.read_output(folder, token, max_bytes=max(1, ref.numel()) * 16)
        except ValueError as exc:
            return {"passed": False, "handover": True, "error": f"not judged: {exc}"}
        finally:
            for f in judge.output_files(folder, token):
                f.unlink(missing_ok=True)
        if not isinstance(commit, str) or commit != integrity.output_digest(out):
            return {"passed": False, "handover": True,
                    "error": "the output handed over is not the one the session committed to when the round ended "
                             "(it changed after the round was chosen for a check)"
                             + (f"; the session could not commit to it: {commit[len('refused: '):][:300]}"
                                if isinstance(commit, str) and commit.startswith("refused: ") else "")}
        broken = contract_breach(out, self.contract)
        if broken:
            return {"passed": False, "handover": True, "error": f"the output breaks the problem's contract: {broken}"}
        return parity.compare(out.to(ref.device), ref, self.tol)

    # -- the result -------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        try:
            judge.check_pin(self.pin)
        except judge.ProblemChanged as exc:
            if str(exc) not in self.problems:
                self.problems.append(str(exc))
        return {"sampled": self.sampled, "timed_rounds": self.timed, "checked_rounds": self.checked,
                "observed_checked": self.observed, "refreshes": self.refreshes, "post": self.post, "problems": list(self.problems),
                "input_error": self.input_error, "done": self.done}


def output_contract(problem: Any, shape: dict, device: str) -> dict:
    """What every output of this problem must be, from its ``output_like``: dtype, shape and strides."""
    try:
        t = problem.output_like(dict(shape), "meta")
    except Exception:  # noqa: BLE001 - a problem that cannot build on the meta device: the real one
        t = problem.output_like(dict(shape), device)
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": [int(x) for x in t.shape],
            "strides": [int(x) for x in t.stride()]}


def contract_breach(out: Any, contract: dict, strides: bool = False) -> str | None:
    """Why ``out`` is not what the problem's ``output_like`` says an output is (None when it is)."""
    dtype = str(out.dtype).removeprefix("torch.")
    if dtype != contract["dtype"]:
        return f"dtype {dtype}, the problem's output is {contract['dtype']}"
    if [int(x) for x in out.shape] != contract["shape"]:
        return f"shape {list(out.shape)}, the problem's output is {contract['shape']}"
    if strides and [int(x) for x in out.stride()] != contract["strides"]:
        return f"strides {list(out.stride())}, the problem's output has {contract['strides']}"
    return None


class _real_fp32:
    """The oracle in real fp32 on a GPU (TF32 off), as in the judge child; this process's own settings (it
    may be a user's, calling the API) are put back afterwards. Only the two TF32 switches are touched:
    reading the matmul precision after they were set raises on torch >= 2.9 (mixed legacy and new APIs)."""

    def __enter__(self) -> None:
        import torch

        self.saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    def __exit__(self, *exc: Any) -> None:
        import torch

        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self.saved


class _Refused(Exception):
    def __init__(self, msg: str, input_error: bool = False) -> None:
        super().__init__(msg)
        self.input_error = input_error


# The session's own claims the parent never takes: every one of them is the referee's.
NOT_TAKEN = ("post_timing_parity", "post_timing_parity_peers", "input_error")


def fold(res: dict[str, Any], task: dict, summary: dict[str, Any]) -> dict[str, Any]:
    """The session's result with every check taken from the referee's ``summary``."""
    for k in NOT_TAKEN:
        res.pop(k, None)
    if summary.get("input_error"):
        return {**res, "status": "error", "input_error": True, "error": summary["input_error"]}
    if res.get("status") != "ok":
        return res
    port, peers = task["port_slot"], [n for n in task.get("peers") or []]
    accused = {port, *peers}
    timed = isinstance(res.get("timing"), dict)
    inexact = {s["slot"] for s in task["slots"] if s.get("isolated_parity") is False}
    referee_problems = list(summary.get("problems") or [])
    if timed:
        said = int(res["timing"].get("rounds") or 0)
        if summary.get("timed_rounds") != said or not summary.get("done"):
            referee_problems.append(f"the session reports {said} timed rounds, the referee was told of "
                                    f"{summary.get('timed_rounds')}" + ("" if summary.get("done") else " and the session never said it was done"))
        post = summary.get("post") or {}
        res["post_timing_parity"] = post.get(port) or {"passed": False, "error": "no post-timing output was handed over"}
        if peers:
            res["post_timing_parity_peers"] = {n: post.get(n) or {"passed": False, "error": "no post-timing output was handed over"}
                                               for n in peers}
    for n, slot in (res.get("slots") or {}).items():
        gate = slot.setdefault("integrity", {"name": f"slot_integrity:{n}", "passed": False, "reason": "not checked"})
        gate.pop("sampled_timed_outputs", None)
        if not timed:
            continue
        problems = []
        sampled = (summary.get("sampled") or {}).get(n) or {"checked": 0, "failed": 0, "failures": []}
        gate["sampled_timed_outputs"] = {**sampled, "timed_rounds": res["timing"].get("rounds"),
                                         "chosen": "by the referee in the parent, after the round ended and the session had "
                                                   "committed to each output (os.urandom)",
                                         "judged_by": "the referee (a process that never imported the port), from the output bytes"}
        tampered = (gate.get("input_checksums") or {}).get("written_by_another_slot")
        numeric = sampled["failed"] - int(sampled.get("handover_failed") or 0)
        if sampled["failed"] and n not in accused and not sampled.get("handover_failed"):
            # A reference (production code) wrong on some timed calls is a correctness fact about it:
            # its parity says so (harness: it "fails the oracle") and its time stays comparable. The
            # accused get no such benefit of the doubt.
            gate["sampled_timed_outputs"]["note"] = (
                f"{numeric} of {sampled['checked']} sampled timed calls fail the oracle"
                + (", as its isolated calls did" if n in inexact else
                   " although its isolated calls passed (numerics near the tolerance on some content)")
                + ": recorded in its parity, its timing stays comparable")
        elif sampled["failed"]:
            problems.append(f"{sampled['failed']} of {sampled['checked']} sampled timed calls fail the oracle of the inputs "
                            f"they were given ({sampled['failures'][0]}): a cached, stale or different result during "
                            "timing than in isolation")
        elif not sampled["checked"] and not tampered:
            problems.append("no timed call's output was checked")
        if n in accused:
            problems.extend(referee_problems)
        if problems:
            first = gate.get("reason") if not gate.get("passed", False) else None
            gate["passed"] = False
            gate["reason"] = "; ".join(([first] if first else []) + problems)
    return res
