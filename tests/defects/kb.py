"""A throw-away knowledge base whose cards point at the seeded-defect kernels."""
from __future__ import annotations

import copy
import shutil
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
K = "defects.kernels"

_CARD = {
    "title": "Seeded-defect card for harness tests",
    "kind": "expert_skill",
    "authors": ["tests"],
    "scope": "kernel",
    "role": "experimental",
    "match": {
        "operator": ["dense_gemm"],
        "gens": ["*"],
        "dtypes": ["fp16"],
        "regimes": ["prefill"],
        "from_backend": "torch",
        "to_backend": "torch",
        "profile_signature": {"op_name_regex": "toy_gemm_never_in_a_trace", "min_pct_gpu": 1.0},
    },
    "expects": {"isolated_speedup_min": 1.01, "parity": "required"},
    "tolerance": {"rtol": 0.01, "atol": 0.01, "min_cosine": 0.999},
    "recipes": [],
    "default_recipe": "only",
    "tests": {"must_match": ["toy_gemm_never_in_a_trace"], "must_not_match": [], "selects": []},
    "validation": {"status": "unvalidated"},
}


def card(card_id: str, port: str, *, backend: str = "torch", baseline: dict | None = None,
         alternatives: list | None = None) -> dict:
    c = copy.deepcopy(_CARD)
    c["id"] = card_id
    c["references"] = {
        "problem": "defects.problem",
        "oracle": f"{K}:build_oracle",
        "baseline": baseline or {"cpu": f"{K}:build_baseline", "cuda": f"{K}:build_baseline"},
    }
    if alternatives:
        c["references"]["alternatives"] = alternatives
    c["recipes"] = [{"name": "only", "when": "M >= 1", "kernel": port, "backend": backend, "config": {},
                     "lever": "none (test fixture)"}]
    return c


CARDS = [
    card("defect_ok", f"{K}:build_port_ok"),
    card("defect_wrong_values", f"{K}:build_port_wrong"),
    card("defect_unwritten", f"{K}:build_port_partial"),
    card("defect_calls_baseline", f"{K}:build_port_calls_baseline"),
    card("defect_returns_baseline_out", f"{K}:build_port_returns_baseline_out"),
    card("defect_returns_input", f"{K}:build_port_returns_input"),
    card("defect_abort", f"{K}:build_port_abort"),
    card("defect_segfault", f"{K}:build_port_segfault"),
    card("defect_hang", f"{K}:build_port_hang"),
    card("defect_alt_deadlock", f"{K}:build_port_ok",
         alternatives=[{"name": "deadlocks", "kernel": f"{K}:build_alt_relaunch_deadlock", "device": "cpu"},
                       {"name": "padded", "kernel": f"{K}:build_alt_padded", "device": "cpu"}]),
    card("defect_port_deadlock", f"{K}:build_port_relaunch_deadlock"),
    card("defect_baseline_wrong", f"{K}:build_port_ok",
         baseline={"cpu": f"{K}:build_baseline_wrong", "cuda": f"{K}:build_baseline_wrong"},
         alternatives=[{"name": "padded", "kernel": f"{K}:build_alt_padded", "device": "cpu"},
                       {"name": "padded_gpu", "kernel": f"{K}:build_alt_padded", "device": "cuda"}]),
    card("defect_baseline_off_when_timed", f"{K}:build_port_ok",
         baseline={"cpu": f"{K}:build_baseline_off_when_timed", "cuda": f"{K}:build_baseline_off_when_timed"},
         alternatives=[{"name": "padded", "kernel": f"{K}:build_alt_padded", "device": "cpu"}]),
    card("defect_baseline_unsupported", f"{K}:build_port_ok",
         baseline={"cpu": f"{K}:build_baseline_unsupported", "cuda": f"{K}:build_baseline_unsupported"},
         alternatives=[{"name": "padded", "kernel": f"{K}:build_alt_padded", "device": "cpu"}]),
    card("defect_no_correct_reference", f"{K}:build_port_ok",
         baseline={"cpu": f"{K}:build_baseline_wrong"}),
    card("toy_triton", "defects.toy_triton:build", backend="triton"),
    card("toy_triton_cheat", "defects.toy_triton:build_cheat", backend="triton"),
    card("defect_flydsl_only", f"{K}:build_port_ok", backend="flydsl"),
]


def make_defect_kb(root: Path, cards: list[dict] | None = None) -> Path:
    (root / "facts").mkdir(parents=True, exist_ok=True)
    shutil.copytree(REPO / "schemas", root / "schemas", dirs_exist_ok=True)
    for c in cards or CARDS:
        d = root / "skills" / c["id"]
        d.mkdir(parents=True, exist_ok=True)
        (d / "SKILL.md").write_text("---\n" + yaml.safe_dump(c, sort_keys=False) + "---\n## When to use\nTests only.\n")
    return root
