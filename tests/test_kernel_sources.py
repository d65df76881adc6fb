"""A kernel's source identity: its module and every skillrun_kernels module it imports, found with ast."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from skillrun.evidence import kernel_sources as KS
from skillrun.errors import InputError

REPO = Path(__file__).resolve().parents[1]


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture
def kernels(tmp_path: Path) -> Path:
    """A KB root whose kernels/skillrun_kernels/ has a port reaching helpers every way a port imports them."""
    k = tmp_path / "kernels" / "skillrun_kernels"
    files = {
        "__init__.py": '"""the package"""\n',
        "_base.py": "CONST = 1\n",
        "_h/__init__.py": "",
        "_h/deep.py": "from .. import _base  # two levels up\n",
        "_h/lazy.py": "X = 2\n",
        "fam/__init__.py": "",
        "fam/problem.py": "from skillrun_kernels import _base\nimport os\n",
        "fam/port.py": ("import numpy  # not ours: not followed\n"
                        "from . import problem\n"
                        "from .problem import CONST\n"
                        "from skillrun_kernels._h.deep import _base as B\n\n"
                        "def build(**kw):\n"
                        "    from skillrun_kernels._h import lazy  # a call-time import counts too\n"
                        "    return lazy.X\n"),
        "unused.py": "Y = 3\n",
    }
    for rel, text in files.items():
        (k / rel).parent.mkdir(parents=True, exist_ok=True)
        (k / rel).write_text(text)
    return tmp_path


def test_the_closure_is_every_kernels_module_imported_transitively(kernels: Path):
    got = KS.kernel_sources("skillrun_kernels.fam.port", root=kernels)
    k = kernels / "kernels" / "skillrun_kernels"
    want = {"skillrun_kernels": k / "__init__.py", "skillrun_kernels._base": k / "_base.py",
            "skillrun_kernels._h": k / "_h" / "__init__.py", "skillrun_kernels._h.deep": k / "_h" / "deep.py",
            "skillrun_kernels._h.lazy": k / "_h" / "lazy.py", "skillrun_kernels.fam": k / "fam" / "__init__.py",
            "skillrun_kernels.fam.problem": k / "fam" / "problem.py", "skillrun_kernels.fam.port": k / "fam" / "port.py"}
    assert got == {m: _sha(p) for m, p in want.items()}
    assert list(got) == sorted(got)  # a stable order in the YAML


def test_a_helper_that_does_not_parse_or_passes_a_bound_is_an_error_naming_it(kernels: Path, monkeypatch):
    deep = kernels / "kernels" / "skillrun_kernels" / "_h" / "deep.py"
    deep.write_text("def broken(:\n")
    with pytest.raises(InputError) as exc:
        KS.kernel_sources("skillrun_kernels.fam.port", root=kernels)
    assert exc.value.path == str(deep) and "syntax error at line 1" in exc.value.reason
    deep.write_text("from .. import _base\n")
    monkeypatch.setattr(KS, "MAX_MODULES", 3)
    with pytest.raises(InputError) as exc:
        KS.kernel_sources("skillrun_kernels.fam.port", root=kernels)
    assert "more than 3 skillrun_kernels modules" in exc.value.reason and exc.value.path.startswith(str(kernels / "kernels"))
    monkeypatch.setattr(KS, "MAX_MODULES", 200)
    monkeypatch.setattr(KS, "MAX_FILE_BYTES", 4096)
    (kernels / "kernels" / "skillrun_kernels" / "_h" / "lazy.py").write_text("X = 2\n" + "#" * 5000 + "\n")
    with pytest.raises(InputError) as exc:
        KS.kernel_sources("skillrun_kernels.fam.port", root=kernels)
    assert exc.value.path == str(kernels / "kernels" / "skillrun_kernels" / "_h" / "lazy.py") and "larger than" in exc.value.reason


def test_a_module_name_from_an_artifact_cannot_point_outside_kernels(kernels: Path):
    assert KS.locate("skillrun_kernels./etc/passwd", kernels) is None
    assert KS.locate("skillrun_kernels.fam..port", kernels) is None
    assert KS.locate("skillrun_kernels.fam.port", kernels) == kernels / "kernels" / "skillrun_kernels" / "fam" / "port.py"


def test_source_identity_of_a_real_port_covers_its_shared_helpers(monkeypatch):
    ref = "skillrun_kernels.fp8_blockscale_moe.triton_sm90:build"
    fields, note = KS.source_identity(ref)
    assert note is None
    mod = ref.split(":")[0]
    sources = fields["kernel_sources"]
    assert fields["kernel_source_sha256"] == sources[mod] == _sha(REPO / "kernels" / "skillrun_kernels" / "fp8_blockscale_moe" / "triton_sm90.py")
    # the shared MoE routing and the family's problem module are what an edit would change unseen
    assert sources["skillrun_kernels._moe.routing"] == _sha(REPO / "kernels" / "skillrun_kernels" / "_moe" / "routing.py")
    assert "skillrun_kernels.fp8_blockscale_moe.problem" in sources and "skillrun_kernels.fp8_blockscale_gemm.problem" in sources
    # a closure that cannot be read leaves the module's own sha256 (as before) and a note saying why
    monkeypatch.setattr(KS, "MAX_MODULES", 2)
    fields, note = KS.source_identity(ref)
    assert fields == {"kernel_source_sha256": sources[mod]}
    assert "kernel_sources not recorded" in note and "more than 2" in note and "kernels/" in note
    assert KS.source_identity("no_such_module_xyz:f") == ({}, None)


def test_a_compile_only_check_records_the_identity_and_stays_schema_valid():
    """skill-run check writes the same identity as a run (one function for every writer)."""
    from skillrun import api
    from skillrun.check.core import RecipeCheck, _record
    from skillrun.evidence.validation import validate_record

    card = api.load_index().skill("flydsl_fp8_blockscale_gemm")
    recipe = card.recipes[0]
    chk = RecipeCheck(recipe=recipe.name, kernel=recipe.kernel, shape={"M": 256, "N": 256, "K": 256}, config=dict(recipe.config),
                      arch="gfx950", status="compile_failed", reason="toy")
    rec = _record(card, chk, recipe, "0.0")
    validate_record(rec)
    module = recipe.kernel.split(":")[0]
    assert rec["recipe"]["kernel_sources"] == KS.kernel_sources(module)
    assert "skillrun_kernels._flydsl.runtime" in rec["recipe"]["kernel_sources"]
