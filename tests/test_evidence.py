"""The evidence index: current / superseded / stale, KB-relative paths, one source for verdict text and noise."""
from __future__ import annotations

import copy
import hashlib
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from kbfixture import CARD, make_kb
from skillrun.evidence.store import kb_relative
from skillrun.evidence.index import build_index, summarize
from skillrun.kb.index import SkillIndex
from skillrun.output.report import render_html, terminal_report
from skillrun.evidence.validation import write_artifact

KERNEL_SRC = "def build(**kw):\n    return None\n"


def _card() -> dict:
    card = copy.deepcopy(CARD)
    for r in card["recipes"]:
        r["kernel"] = "skillrun_kernels.toykern:build"
    return card


@pytest.fixture
def kb(tmp_path: Path) -> Path:
    root = make_kb(tmp_path / "kb", card=_card())
    (root / "kernels" / "skillrun_kernels").mkdir(parents=True)
    (root / "kernels" / "skillrun_kernels" / "toykern.py").write_text(KERNEL_SRC)
    return root


def record(root: Path, created: str, shape: dict, recipe: str = "narrow_n", config=None, kernel_sha=None,
           card_sha=None, speedup=1.2, verdict="validated") -> dict:
    card_path = root / "skills" / "toy_blockscale" / "SKILL.md"
    return {
        "schema_version": 1, "created": created,
        "card": {"id": "toy_blockscale", "revision": "abc", "path": str(card_path),
                 "sha256": card_sha or hashlib.sha256(card_path.read_bytes()).hexdigest()},
        "runner": {"version": "0.1.0", "git_revision": "abc1234", "dirty": False},
        "recipe": {"name": recipe, "untuned": False, "kernel": "skillrun_kernels.toykern:build", "backend": "triton",
                   "config": config if config is not None else {"block_m": 128},
                   "kernel_source_sha256": kernel_sha or hashlib.sha256(KERNEL_SRC.encode()).hexdigest()},
        "shape": shape,
        "device": {"kind": "cuda", "name": "NVIDIA H200", "arch": "sm_90"},
        "software": {"python": "3.12", "torch": "2.11", "triton": "3.6", "flydsl": None},
        "mode": "gpu_measured",
        "tolerance": {"rtol": 0.01, "atol": 0.01, "min_cosine": 0.999},
        "parity": {"port": {"passed": True, "rel_fro": 0.0017}, "baseline": {"passed": True, "rel_fro": 0.0017, "kernel": "k:build_cublas"}},
        "timing": {"method": "device events", "cuda_graph": True, "versus": "baseline (k:build_cublas)",
                   "port_ms": {"median": 1.0, "min": 0.9}, "baseline_ms": {"median": speedup, "min": speedup},
                   "aa_noise_pct": 0.5, "aa": {"slot": "baseline", "aa_noise_pct": 0.5, "aa_medians_pct": 2.0}},
        "speedup": speedup, "verdict": verdict,
        "reason": f"port matches the fp32 oracle and is {speedup:.3f}x vs baseline (A/A noise 2.00%)",
    }


NARROW = {"M": 4096, "N": 2048, "K": 7168}
WIDE = {"M": 4096, "N": 65536, "K": 1536}


@pytest.fixture
def labelled(kb: Path) -> tuple[Path, dict[str, Path]]:
    v = kb / "validation"
    paths = {
        "old": write_artifact(record(kb, "2026-11-29T10:00:00+00:00", NARROW, speedup=1.1), v),
        "new": write_artifact(record(kb, "2026-11-29T11:00:00+00:00", NARROW, speedup=1.3), v),
        # The kernel source changed since this run: stale, though it is the only (so the current) run of its row.
        "stale": write_artifact(record(kb, "2026-11-29T12:00:00+00:00", WIDE, recipe="wide_n", config={"tile_m": 64, "tile_n": 256},
                                       kernel_sha="0" * 64), v),
        # Card text edited since (sha differs) but the recipe is as it ran: current, not stale.
        "edited": write_artifact(record(kb, "2026-11-29T12:30:00+00:00", {"M": 16384, "N": 7168, "K": 768}, recipe="k_light",
                                        config={"tile_m": 64}, card_sha="f" * 64), v),
        # The recipe's config changed since the run: stale.
        "config": write_artifact(record(kb, "2026-11-29T13:00:00+00:00", {"M": 64, "N": 4096, "K": 4096}, recipe="wide_n",
                                        config={"tile_m": 32, "tile_n": 256}), v),
    }
    return kb, paths


def test_index_labels_current_superseded_and_stale(labelled):
    kb, paths = labelled
    ev = build_index(SkillIndex.load(kb))
    by = {name: ev.find(p) for name, p in paths.items()}
    assert by["new"].status == "current" and not by["new"].stale
    assert by["old"].status == "superseded" and by["old"].superseded_by == by["new"].path
    assert by["new"].superseded == [by["old"]]
    assert by["stale"].status == "current" and by["stale"].stale
    assert any("kernel source kernels/skillrun_kernels/toykern.py changed" in r for r in by["stale"].stale_reasons)
    assert by["edited"].card_edited and not by["edited"].stale
    assert by["config"].stale and "config changed" in by["config"].stale_reasons[0]
    assert ev.counts() == {"artifacts": 5, "current": 4, "superseded": 1, "stale_current": 2, "invalid": 0, "unreliable": 0, "untrusted": 0,
                          "lost": 0}
    # Paths are relative to the KB root, in the index and inside the written artifact.
    assert by["new"].path.startswith("validation/toy_blockscale/")
    assert yaml.safe_load(paths["new"].read_text())["card"]["path"] == "skills/toy_blockscale/SKILL.md"


def test_kernel_edit_makes_a_fresh_artifact_stale(labelled):
    kb, paths = labelled
    assert not build_index(SkillIndex.load(kb)).find(paths["new"]).stale
    (kb / "kernels" / "skillrun_kernels" / "toykern.py").write_text(KERNEL_SRC + "# tuned\n")
    assert build_index(SkillIndex.load(kb)).find(paths["new"]).stale


def test_an_edited_helper_stales_the_artifacts_that_recorded_it_and_not_older_ones(kb: Path):
    """Artifacts with kernel_sources are stale when any module of the kernel's import closure moved,
    with a reason naming it; artifacts from before (kernel_source_sha256 alone) are judged as always."""
    from skillrun.evidence.kernel_sources import kernel_sources

    k = kb / "kernels" / "skillrun_kernels"
    (k / "__init__.py").write_text("")
    (k / "_shared").mkdir()
    (k / "_shared" / "__init__.py").write_text("")
    (k / "_shared" / "tiles.py").write_text("TILE = 128\n")
    port = "from skillrun_kernels._shared.tiles import TILE\n\n\ndef build(**kw):\n    return TILE\n"
    (k / "toykern.py").write_text(port)
    port_sha = hashlib.sha256(port.encode()).hexdigest()
    v = kb / "validation"
    new = record(kb, "2026-11-29T10:00:00+00:00", NARROW, kernel_sha=port_sha)
    new["recipe"]["kernel_sources"] = kernel_sources("skillrun_kernels.toykern", root=kb)
    assert set(new["recipe"]["kernel_sources"]) == {"skillrun_kernels", "skillrun_kernels._shared",
                                                    "skillrun_kernels._shared.tiles", "skillrun_kernels.toykern"}
    new_path = write_artifact(new, v)  # schema-valid with the new field
    old_path = write_artifact(record(kb, "2026-11-29T10:00:00+00:00", WIDE, recipe="wide_n",
                                     config={"tile_m": 64, "tile_n": 256}, kernel_sha=port_sha), v)

    def judged() -> tuple:
        ev = build_index(SkillIndex.load(kb))
        return ev.find(new_path), ev.find(old_path)

    fresh, old = judged()
    assert not fresh.stale and not old.stale, (fresh.stale_reasons, old.stale_reasons)
    (k / "_shared" / "tiles.py").write_text("TILE = 64\n")
    fresh, old = judged()
    assert fresh.stale and not old.stale, old.stale_reasons
    (reason,) = fresh.stale_reasons
    assert reason.startswith("the kernel helper kernels/skillrun_kernels/_shared/tiles.py (skillrun_kernels._shared.tiles, imported by skillrun_kernels.toykern) changed")
    # an edit of the kernel module itself stales both, each with the reason it always had
    (k / "toykern.py").write_text(port + "# tuned\n")
    fresh, old = judged()
    assert any(r.startswith("the kernel source kernels/skillrun_kernels/toykern.py changed") for r in fresh.stale_reasons)
    assert len(fresh.stale_reasons) == 2
    assert [r[:len("the kernel source kernels/skillrun_kernels/toykern.py changed")] for r in old.stale_reasons] == ["the kernel source kernels/skillrun_kernels/toykern.py changed"]
    # a helper gone since the run is named, not skipped
    (k / "toykern.py").write_text(port)
    (k / "_shared" / "tiles.py").unlink()
    fresh, _ = judged()
    assert fresh.stale_reasons == ["the kernel helper skillrun_kernels._shared.tiles cannot be found to compare its sha256"]


def test_report_shows_each_label(labelled):
    kb, paths = labelled
    ev = build_index(SkillIndex.load(kb))
    console = Console(record=True, width=400)
    console.print(terminal_report(ev))
    text = console.export_text()
    assert text.index("Summary") < text.index("Superseded")
    summary = text[:text.index("Superseded")]
    assert "1.300× vs cublas" in summary and "1.100×" not in summary  # only the current run is in the summary
    assert summary.count("STALE") == 2 and "1 superseded" in summary
    # a prose edit of the card is not news on every row; --json still carries it
    assert "card edited" not in summary and any(e.card_edited for e in ev.current_entries())
    history = text[text.index("Superseded"):]
    assert ev.find(paths["old"]).path in history  # the older run is listed under the history, not in the summary
    page = render_html(ev)
    summary_html = page[page.index("id='summary'"):page.index("</table>", page.index("id='summary'"))]
    assert summary_html.count("data-path=") == 4
    assert summary_html.count(">STALE<") == 2
    assert "superseded by " + ev.find(paths["old"]).superseded_by in page.replace("<wbr>", "")  # ids may wrap at _ and /


def test_noise_column_and_verdict_text_agree():
    rec = yaml.safe_load(Path(__file__).resolve().parents[1].joinpath(
        "validation/triton_fp8_blockscale_gemm_sm90/20261129T092451Z_prefill_very_wide_n_M4096xN65536xK1536_gpu_measured.yaml").read_text())
    s = summarize(rec)
    # The harness compared against max(ratio noise 0.79%, medians noise 1.36%); the bare field says 0.79.
    assert rec["timing"]["aa_noise_pct"] < 1.0
    assert f"A/A noise {s.noise_pct:.2f}%" in s.verdict_text
    assert s.speed == "slower" and s.versus == "cublas_blockwise" and s.versus_production


def test_within_noise_is_its_own_speed_axis():
    rec = yaml.safe_load(Path(__file__).resolve().parents[1].joinpath(
        "validation/triton_fp8_blockscale_gemm_sm90/20261129T092709Z_decode_m64_klight_M64xN7168xK2048_gpu_measured.yaml").read_text())
    assert rec["verdict"] == "slower"
    s = summarize(rec)
    assert s.speed == "within_noise"
    # one vocabulary: the row never says `slower` beside `within noise`; what the file says is kept
    assert s.verdict == "within_noise" and s.recorded_verdict == "slower" and "recorded as 'slower'" in s.verdict_text


def test_legacy_baseline_is_production_only_when_the_card_says_so():
    rec = yaml.safe_load(Path(__file__).resolve().parents[1].joinpath(
        "validation/triton_fp8_rowwise_batched_gemm_sm90/20261129T093756Z_decode_weight_stream_batch16xM1xN1280xK8192_gpu_measured.yaml").read_text())
    assert "references" not in rec  # written before cards named their production kernels
    old = summarize(rec)
    assert old.refs[0].name == "scaled_mm_loop" and old.refs[0].production  # the old assumption
    s = summarize(rec, ["mslk_rowwise_batched"])
    assert not any(r.production for r in s.refs if r.status == "ok") and not s.versus_production
    # judged under today's rule: the 7.6x against the loop is context, never validation
    assert s.verdict == "no_production_reference" and s.recorded_verdict == "validated"
    assert s.verdict_text.startswith("no production kernel was compared (mslk_rowwise_batched unavailable (not measured in this run")


def test_non_production_alternative_missing_the_oracle_is_expected_not_a_failure():
    from skillrun.output.report import summary_row

    rec = {"verdict": "slower", "mode": "gpu_measured", "created": "2026-12-01T00:00:00+00:00", "card": {"id": "c"},
           "recipe": {"name": "r"}, "shape": {"M": 1}, "speedup": 0.8, "timing": {"port_ms": {"median": 1.0}},
           "references": [
               {"name": "cublas", "role": "baseline", "production": True, "status": "ok", "parity": {"passed": True},
                "speedup": 0.8, "noise_pct": 2.0, "speed": "slower"},
               {"name": "bf16", "role": "alternative", "production": False, "status": "ok", "parity": {"passed": False, "rel_fro": 0.003},
                "speedup": 1.1, "noise_pct": 2.0, "speed": "faster"}]}
    (entry,) = build_index(None, records=[rec], root=Path("/nonexistent")).entries
    by = {text.split()[0]: (text, failed) for text, failed, _ in summary_row(entry)["ref_parity"]}
    assert by["bf16"] == ("bf16 misses oracle (expected) 0.003", False)
    rec["references"][0]["parity"] = {"passed": False}  # the production kernel off the oracle is a failure
    (entry,) = build_index(None, records=[rec], root=Path("/nonexistent")).entries
    by = {text.split()[0]: (text, failed) for text, failed, _ in summary_row(entry)["ref_parity"]}
    assert by["cublas"] == ("cublas FAIL", True)


def test_card_claiming_validation_with_only_stale_evidence_reads_stale(labelled):
    from skillrun.evidence.index import card_status

    kb, paths = labelled
    ev = build_index(SkillIndex.load(kb))
    assert card_status("toy_blockscale", "validated", ev)[0] == "validated"  # two current rows are fresh
    for e in ev.current_entries():
        e.stale = True
    status, why = card_status("toy_blockscale", "validated", ev)
    assert status == "stale" and "all 4 current GPU artifact(s) are stale" in why
    # computed from the evidence, whatever the card declares about itself
    assert card_status("toy_blockscale", "seed_claims", ev)[0] == "stale"
    assert card_status("toy_blockscale", "seed_claims", None)[0] == "seed_claims"  # no evidence at all: the declaration
    assert card_status("toy_blockscale", "validated", None)[0] == "unvalidated"


def test_new_references_block_is_read_first():
    rec = {"verdict": "validated", "mode": "gpu_measured", "speedup": 1.21, "recipe": {"name": "r"}, "card": {"id": "c"},
           "device": {"kind": "cuda", "name": "NVIDIA H200", "arch": "sm_90"},
           "timing": {"aa_noise_pct": 9.9, "versus": "baseline (x)", "port_ms": {"median": 1.0, "min": 1.0}},
           "verdict_text": "faster than mslk_rowwise_batched (1.21x, A/A noise 2.1%), and bf16_loop fails the oracle",
           "references": [
               {"name": "mslk_rowwise_batched", "role": "baseline", "production": True, "status": "ok",
                "parity": {"passed": True, "rel_fro": 0.0027}, "median_ms": 1.21, "speedup": 1.21, "noise_pct": 2.1, "speed": "faster"},
               {"name": "bf16_loop", "role": "alternative", "production": False, "status": "ok",
                "parity": {"passed": False, "rel_fro": 0.02}, "median_ms": 2.0, "speedup": 2.0, "noise_pct": 2.1, "speed": "faster"},
               {"name": "cutlass_grouped", "role": "alternative", "production": False, "status": "unavailable", "error": "no module"}]}
    s = summarize(rec)
    assert s.noise_pct == 2.1 and s.verdict_text.startswith("faster than mslk")
    assert s.versus == "mslk_rowwise_batched" and s.versus_production
    assert [r.name for r in s.failing_references] == ["bf16_loop"]
    assert s.refs[2].status == "unavailable" and s.refs[2].parity_passed is None


def test_measured_lookup_respects_device_class_and_staleness(labelled):
    kb, paths = labelled
    ev = build_index(SkillIndex.load(kb))
    hit = ev.measured("toy_blockscale", "narrow_n", NARROW, arch="sm_90", device_name="NVIDIA H200")
    assert hit is not None and hit.path == ev.find(paths["new"]).path
    assert ev.measured("toy_blockscale", "narrow_n", NARROW, arch="sm_90", device_name="NVIDIA H100 80GB HBM3") is None
    assert ev.measured("toy_blockscale", "narrow_n", NARROW, arch="gfx950") is None
    assert ev.measured("toy_blockscale", "wide_n", WIDE, arch="sm_90") is None
    assert ev.measured("toy_blockscale", "wide_n", WIDE, arch="sm_90", include_stale=True) is not None


def test_invalid_files_are_entries_not_crashes(kb: Path):
    (kb / "validation" / "toy_blockscale").mkdir(parents=True)
    (kb / "validation" / "toy_blockscale" / "broken.yaml").write_text("schema_version: 1\nverdict: [\n")
    ev = build_index(SkillIndex.load(kb))
    assert ev.counts()["invalid"] == 1 and "cannot read" in ev.invalid_entries()[0].error


@pytest.mark.parametrize("raw,want", [
    ("/work/main/skills/x/SKILL.md", "skills/x/SKILL.md"),
    ("skills/x/SKILL.md", "skills/x/SKILL.md"),
    ("/home/u/trace.json", "/home/u/trace.json"),
])
def test_kb_relative(raw, want, tmp_path):
    assert kb_relative(raw, tmp_path) == want
    assert kb_relative(tmp_path / "validation" / "a.yaml", tmp_path) == "validation/a.yaml"


def test_new_evidence_never_turns_lint_red_and_refuted_claims_are_flagged(tmp_path: Path):
    """A run that supersedes a cited artifact, and a card number the current run refutes, are
    lint warnings naming the fix; lint stays ok (exit 0)."""
    import subprocess
    import sys

    from skillrun.lint import lint
    from kbfixture import write_card

    card = copy.deepcopy(CARD)  # kernels that import, so lint has nothing else to say
    root = make_kb(tmp_path / "kb", card=card)
    src = Path(__file__).resolve().parents[1] / "kernels" / "skillrun_kernels" / "protocol.py"

    def rec(created: str, speedup: float) -> dict:
        r = record(root, created, NARROW, speedup=speedup)
        r["recipe"].update(kernel="skillrun_kernels.protocol:KernelLaunch", kernel_source_sha256=hashlib.sha256(src.read_bytes()).hexdigest())
        return r

    old = write_artifact(rec("2026-11-29T10:00:00+00:00", 1.1), root / "validation")
    card["validation"]["artifacts"] = [kb_relative(old, root)]
    write_card(root, card)
    clean = lint(SkillIndex.load(root))
    assert clean.ok and not clean.warnings, [str(w) for w in clean.warnings]
    # a new run supersedes the cited one; the card's numbers say 1.6x where the run reads 1.3x ± 2%
    new = write_artifact(rec("2026-11-29T11:00:00+00:00", 1.3), root / "validation")
    card["recipes"][2]["evidence"] = [{"shape": [4096, 2048, 7168], "speedup": 1.6, "gpu": "H200", "source": "t"},
                                      {"shape": [4096, 2048, 7168], "speedup": 1.31, "gpu": "H200", "source": "t"},  # inside
                                      {"shape": [4096, 2048, 7168], "speedup": 1.6, "gpu": "MI355X", "source": "t"}]  # other GPU
    write_card(root, card)
    rep = lint(SkillIndex.load(root))
    assert rep.ok, [str(e) for e in rep.errors]
    by = {w.field: w.reason for w in rep.warnings}
    assert f"add `- {kb_relative(new, root)}`" in by["validation.artifacts.0"]
    assert "claims 1.6x" in by["recipes.2.evidence.0.speedup"] and "reads 1.300x" in by["recipes.2.evidence.0.speedup"]
    assert set(by) == {"validation.artifacts.0", "recipes.2.evidence.0.speedup"}
    res = subprocess.run([sys.executable, "-m", "skillrun", "--kb", str(root), "lint"], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "recipes.2.evidence.0.speedup" in res.stderr.replace("\n", "") and "2 warning(s)" in res.stdout


def test_list_says_stale_when_every_gpu_artifact_of_a_validated_card_is(tmp_path: Path):
    import json
    import subprocess
    import sys

    card = copy.deepcopy(CARD)  # kernels that import: the card loads and is listed
    card["validation"] = {"status": "validated"}
    kb = make_kb(tmp_path / "kb", card=card)
    src = hashlib.sha256((Path(__file__).resolve().parents[1] / "kernels" / "skillrun_kernels" / "protocol.py").read_bytes()).hexdigest()

    def rec(created: str, shape: dict, sha: str) -> dict:
        r = record(kb, created, shape)
        r["recipe"].update(kernel="skillrun_kernels.protocol:KernelLaunch", kernel_source_sha256=sha)
        return r

    write_artifact(rec("2026-11-29T12:00:00+00:00", WIDE, "0" * 64), kb / "validation")  # kernel changed since: stale

    def listed() -> dict:
        res = subprocess.run([sys.executable, "-m", "skillrun", "--kb", str(kb), "list", "--json"], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        (row,) = [r for r in json.loads(res.stdout)["cards"] if r["id"] == "toy_blockscale"]
        return row

    row = listed()
    assert row["validation"] == "stale" and row["validation_declared"] == "validated" and "are stale" in row["validation_note"]
    write_artifact(rec("2026-11-29T13:00:00+00:00", NARROW, src), kb / "validation")  # one fresh run
    # it beats the production kernel on one shape; other shape classes of the card have no GPU evidence
    assert listed()["validation"] == "partially_validated"
