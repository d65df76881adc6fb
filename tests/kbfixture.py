"""A tiny, self-contained knowledge base for lint/match/select tests (independent of the real cards)."""
from __future__ import annotations

import shutil
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]

CARD = {
    "id": "toy_blockscale",
    "title": "Toy block-scale GEMM card for tests",
    "kind": "expert_skill",
    "authors": ["tests"],
    "scope": "kernel",
    "role": "advisory_prior",
    "supersedes": [],
    "match": {
        "operator": ["dense_gemm", "scaled_quant_gemm"],
        "arch_class": ["*"],
        "gens": ["gfx950"],
        "dtypes": ["fp8_e4m3", "fp8_e4m3_fnuz"],
        "regimes": ["prefill", "decode"],
        "from_backend": "ck",
        "to_backend": "flydsl",
        "profile_signature": {
            "op_name_regex": "(?i)kernel_gemm_xdl_cshuffle_v3.*(blockscale|ABScale)|gemm_a8w8_blockscale",
            "min_pct_gpu": 1.0,
            "ops": [{"name": "aten::_scaled_mm", "scale_recipe": ["blockwise_1x128_128x128"]}],
        },
    },
    "expects": {"isolated_speedup_min": 1.05, "parity": "required"},
    "tolerance": {"rtol": 0.01, "atol": 0.01, "min_cosine": 0.999},
    "references": {
        "problem": "skillrun_kernels.protocol",
        "oracle": "skillrun_kernels.protocol:KernelLaunch",
        "baseline": {"rocm": "skillrun_kernels.protocol:KernelLaunch"},
    },
    "recipes": [
        {"name": "wide_n", "when": "N >= 32768", "kernel": "skillrun_kernels.protocol:KernelLaunch", "backend": "flydsl",
         "config": {"tile_m": 64, "tile_n": 256}, "lever": "XCD swizzle", "expected_speedup": 1.2},
        {"name": "k_light", "when": "K <= 1024 and ceil_div(M, 64) * ceil_div(N, 256) >= 4 * cu_count",
         "kernel": "skillrun_kernels.protocol:KernelLaunch", "backend": "flydsl", "config": {"tile_m": 64}, "lever": "tile geometry"},
        {"name": "narrow_n", "when": "N <= 2048 and K >= 4096", "kernel": "skillrun_kernels.protocol:KernelLaunch", "backend": "flydsl",
         "config": {"block_m": 128}, "lever": "8-wave cluster"},
    ],
    "default_recipe": "wide_n",
    "tests": {
        "must_match": ["void ck::kernel_gemm_xdl_cshuffle_v3<ck::GridwiseGemmMultiD_ABScale_xdl_cshuffle_v3<ck::f8_fnuz_t>>"],
        "must_not_match": ["Cijk_Alik_Bljk_BBS_BH_MT256x128x64_ISA942"],
        "selects": [
            {"shape": [4096, 65536, 1536], "recipe": "wide_n"},
            {"shape": [16384, 7168, 768], "recipe": "k_light"},
            {"shape": [4096, 2048, 7168], "recipe": "narrow_n"},
            {"shape": [64, 4096, 4096], "recipe": "wide_n", "untuned": True},
        ],
    },
    "facts": ["toy_hw"],
    "validation": {"status": "unvalidated"},
}

FACT = {
    "id": "toy_hw",
    "title": "Toy gfx950 facts",
    "kind": "fact",
    "topics": ["hardware"],
    "data": {"cu_count": 256, "xcds": 8},
    "sources": ["tests"],
}


def write_card(root: Path, card: dict, body: str = "## When to use\nToy.\n") -> Path:
    d = root / "skills" / card["id"]
    d.mkdir(parents=True, exist_ok=True)
    p = d / "SKILL.md"
    p.write_text("---\n" + yaml.safe_dump(card, sort_keys=False) + "---\n" + body)
    return p


def make_kb(root: Path, card: dict | None = None, fact: dict | None = None) -> Path:
    (root / "facts").mkdir(parents=True, exist_ok=True)
    shutil.copytree(REPO / "schemas", root / "schemas", dirs_exist_ok=True)
    f = fact or FACT
    (root / "facts" / f"{f['id']}.md").write_text("---\n" + yaml.safe_dump(f, sort_keys=False) + "---\nBody.\n")
    # gfx950 device facts are looked up as gfx950_hardware; the toy card cites toy_hw too.
    g = dict(f, id="gfx950_hardware")
    (root / "facts" / "gfx950_hardware.md").write_text("---\n" + yaml.safe_dump(g, sort_keys=False) + "---\nBody.\n")
    write_card(root, card or CARD)
    return root
