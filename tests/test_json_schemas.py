"""Every `--json` document of the CLI carries schema_version and follows its JSON Schema in schemas/
(the CLI driven for real, on the repository's knowledge base and the bundled H200 trace)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

REPO = Path(__file__).resolve().parents[1]
TRACE = str(REPO / "runner" / "skillrun" / "examples" / "h200_fp8_blockscale_scaled_mm.pt.trace.json.gz")


def _schema(name: str) -> dict:
    return json.loads((REPO / "schemas" / f"{name}.schema.json").read_text())


def _run(*args: str) -> dict:
    res = subprocess.run([sys.executable, "-m", "skillrun", "--kb", str(REPO), *args, "--json"], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode in (0, 4), res.stderr[-2000:]
    return json.loads(res.stdout, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))


@pytest.mark.parametrize("schema,args", [
    ("cli-list", ["list"]),
    ("cli-lint", ["lint"]),
    ("cli-report", ["report"]),
    ("cli-match", ["match", TRACE]),
    ("cli-plan", ["plan", TRACE]),
    ("cli-analysis", ["--profile", TRACE]),
])
def test_json_output_follows_its_schema(schema: str, args: list[str]):
    data = _run(*args)
    assert data["schema_version"] == 1
    jsonschema.Draft202012Validator(_schema(schema)).validate(data)


def test_schemas_are_valid_and_can_fail():
    for f in sorted(REPO.glob("schemas/cli-*.schema.json")):
        jsonschema.Draft202012Validator.check_schema(json.loads(f.read_text()))
    v = jsonschema.Draft202012Validator(_schema("cli-list"))
    assert not v.is_valid([{"id": "x"}])  # a bare list, as before schema_version
    assert not v.is_valid({"schema_version": 1, "cards": [{"id": "x", "validation": "validated?"}]})


def test_report_json_says_null_for_missing_never_a_dash():
    data = _run("report")
    text = json.dumps(data)
    assert '"—"' not in text and '"unknown"' not in text
    skipped = [e for e in data["current"] if e["summary"]["speedup"] is None]
    assert skipped and all(e["summary"]["versus"] is None for e in skipped)
