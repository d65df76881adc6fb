"""The session's input sets: new content on every visit, one copy per slot, a pristine master.

A port is untrusted code, so the operands it is timed on are built to defeat three tricks:

* **answers reused across repetitions**: every time a set comes round again its *content* has
  changed (not only which buffer is read). A port that memoizes on ``data_ptr``, on a hash of part of
  its inputs, or returns its previous output then answers stale, and the outputs of randomly sampled
  timed calls (worker.session) disagree with the oracle of the content actually there. Half of the
  changes replace only a random block of rows (along dim 0; tensors with the same dim-0 length share
  the block, so row-aligned inputs such as ``a``/``a_scale`` or ``topk_ids``/``topk_weights`` stay
  consistent), so a key taken from a slice of the inputs keeps hitting while the answer changes.
  This assumes rows along dim 0 are independent samples of the problem's inputs, true of every
  problem in kernels/. Content seeds and the rows a refresh changes are drawn by the session's
  referee in the parent (referee.py, ``os.urandom``), which builds the same content itself: a port
  cannot precompute answers for the inputs it will be timed on while it is built, and the referee
  knows what every set held without asking the port's process.
* **inputs mutated**: each slot reads its own copy of every set, checksummed (integrity.digests)
  after it was written and again after the slot's call; a changed checksum fails that slot, the
  copy is rebuilt from the master, and no other slot ever read the changed bytes.
* **a degenerate oracle**: an all-zero, constant or non-finite oracle rejects the problem's input
  generation (parity.oracle_of); in the timed session the referee decides that, from its own copy.

Rewriting every copy and re-running each slot's ``prepare`` costs time; it happens between rounds,
outside every measured interval (timing.interleave's ``after_round``).
"""
from __future__ import annotations

import random
from typing import Any

from skillrun.execute import guard, integrity, operands
from skillrun.execute.referee import LocalSource, apply_refresh


class InputSets:
    def __init__(self, problem: Any, problem_name: str, shape: dict, device: str, launches: dict[str, Any],
                 n_sets: int, rng: random.Random | None = None, in_place: bool = False, blind: set[str] | None = None,
                 source: Any = None) -> None:
        self.problem, self.problem_name, self.shape, self.device = problem, problem_name, shape, device
        self.launches = launches
        # Where seeds and refresh plans come from: the session's referee (referee.Client), or this process.
        self.source = source if source is not None else LocalSource(rng or random.SystemRandom())
        self.in_place = in_place  # CUDA graphs hold operand addresses: prepare's results must be copied in place
        self.master: list[dict] = []
        self.copies: dict[str, list[dict]] = {n: [] for n in launches}
        self.prepared: dict[str, list[Any]] = {n: [] for n in launches}
        self.before: dict[str, list[dict]] = {n: [] for n in launches}
        self.checks = {n: 0 for n in launches}  # checksum comparisons made around each slot's calls
        self.mutations: dict[str, list[str]] = {n: [] for n in launches}
        # A reference's copy that changed although the reference, run again alone, leaves it intact was
        # written by another slot's call (a port blaming a reference): recorded here, never held against it.
        self.tampered: dict[str, list[str]] = {n: [] for n in launches}
        self.rerun: Any = None  # set by the session: rerun(slot, j) runs that slot alone on set j
        self.refreshes = 0
        # prepare() is handed a decoy's activations, never a set's own (operands.py); one decoy serves every call.
        # blind: the slots whose prepare() gets the decoy (the port and its peers; None: every slot).
        decoy = self._fresh(self.source.decoy())
        hidden = operands.activation_keys(problem, decoy)
        self.decoy = {k: decoy[k] for k in hidden}  # its weights are freed at once: they can be large
        del decoy
        self.acts = {n: (hidden if blind is None or n in blind else []) for n in launches}
        self.references = set() if blind is None else set(launches) - set(blind)
        for _ in range(n_sets):
            self.add_set()

    # -- building -----------------------------------------------------------------------------

    def _fresh(self, seed: int) -> dict:
        return self.problem.make_inputs(dict(self.shape), int(seed), self.device)

    def add_set(self) -> int:
        j = len(self.master)
        with guard.harness():
            self.master.append(self._fresh(self.source.new_set(j)))
        for n in self.launches:
            with guard.harness():
                copy = _clone(self.master[j])
            self.copies[n].append(copy)
            self.prepared[n].append(operands.prepare_blind(self.launches[n], copy, self.acts[n], self.decoy, self.master[j]))
            self.before[n].append(integrity.digests(copy))
        return j

    @property
    def n_sets(self) -> int:
        return len(self.master)

    # -- the checks around a slot's calls -------------------------------------------------------

    def check(self, slot: str, j: int, where: str) -> list[str]:
        """Names of slot's set-j inputs whose checksum changed since they were written; rebuilds them if so."""
        self.checks[slot] += 1
        bad = integrity.changed(self.before[slot][j], integrity.digests(self.copies[slot][j]))
        if bad:
            self._write(slot, j)
            # The accused's own copy changed: theirs (whoever gains from blaming them is one of them).
            if slot in self.references and self.rerun is not None and not self._writes_alone(slot, j):
                self.tampered[slot].append(f"{where}: {', '.join(bad)}")
            else:
                self.mutations[slot].append(f"{where}: {', '.join(bad)}")
        return bad

    def _writes_alone(self, slot: str, j: int) -> bool:
        """Whether slot, run once by itself on a freshly written copy of set j, changes that copy."""
        self.rerun(slot, j)
        bad = integrity.changed(self.before[slot][j], integrity.digests(self.copies[slot][j]))
        if bad:
            self._write(slot, j)
        return bool(bad)

    # -- new content ------------------------------------------------------------------------------

    def refresh(self, j: int) -> None:
        """New content for set j (master first, then every slot's copy, re-prepared), as the source plans it."""
        m = self.master[j]
        plan = self.source.refresh(j, m)
        with guard.harness():
            fresh = self._fresh(plan["seed"])
            apply_refresh(m, fresh, plan)
        del fresh
        self.refreshes += 1
        for n in self.launches:
            self._write(n, j)

    def _write(self, slot: str, j: int) -> None:
        """Slot's copy of set j := the master (bytewise), re-prepared, checksummed."""
        copy, m = self.copies[slot][j], self.master[j]
        with guard.harness():
            for k, v in m.items():
                if _is_tensor(v):
                    copy[k].copy_(v)
                else:
                    copy[k] = v
        old = self.prepared[slot][j]
        if old is not copy:
            new = operands.prepare_blind(self.launches[slot], copy, self.acts[slot], self.decoy, m)
            with guard.harness():
                fits = _copy_into(old, new)
            if not fits:
                if self.in_place:
                    raise ValueError(f"slot {slot}: prepare() returned operands of a different structure for new content; "
                                     "a captured CUDA graph cannot follow them")
                self.prepared[slot][j] = new
        self.before[slot][j] = integrity.digests(copy)


def _is_tensor(v: Any) -> bool:
    import torch

    return isinstance(v, torch.Tensor)


def _clone(inputs: dict) -> dict:
    return {k: (v.clone() if _is_tensor(v) else v) for k, v in inputs.items()}


def _copy_into(old: Any, new: Any) -> bool:
    """Copy new's tensors into old's (same structure): operand addresses stay, content follows."""
    ot, nt = integrity.tensors_in(old), integrity.tensors_in(new)
    if len(ot) != len(nt) or any(a.shape != b.shape or a.dtype != b.dtype or a.device != b.device for a, b in zip(ot, nt)):
        return False
    for a, b in zip(ot, nt):
        if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr() or a.storage_offset() != b.storage_offset():
            a.copy_(b)
    return True
