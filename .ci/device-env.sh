# Source this on the lent GPU machine (device tool), from the repository root:
#   source .ci/device-env.sh
# It makes `skillrun` / `skillrun_kernels` importable without installing (no network there): each
# package sits in a folder of its own name (runner/skillrun, kernels/skillrun_kernels), so the two
# parent folders go on PYTHONPATH.
# Wheels for packages the image lacks travel in .whl/ (carry it) and go to /tmp/site. Fetch them here
# (ignored by git) for the image's Python 3.12 (it has attrs, typer, rich, pyyaml, numpy already):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0 \
#     jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 ijson==3.6.0 \
#     orjson==3.13.0 mslk-cuda==1.1.0 google-re2==1.1.20251105 detect-secrets==1.5.0
# (google-re2 and detect-secrets are the runner's own dependencies: without them `import skillrun.api` fails.)
# mslk-cuda (MSLK's CUTLASS ops, the production references of issue 11; needs only numpy) is
# mslk_cuda-1.1.0-cp312-cp312-manylinux_2_28_x86_64.whl, 44.5 MB; the twelve wheels are 48.1 MB
# (45.9 MiB; with google-re2 and detect-secrets, 14 wheels, 47 MiB) together, inside the 64 MiB a device call carries with the working tree (~2.3 MB).
# Without the mslk wheel the MSLK references are recorded `unavailable`, never replaced.
set -e
_root="$(pwd)"
export PYTHONPATH="$_root/runner:$_root/kernels${PYTHONPATH:+:$PYTHONPATH}"
# SKILLRUN_WHEELS: another folder of wheels (the CPU tests that run these scripts point it at an empty one, so a
# developer's .whl/ of cp312 wheels is never installed into their Python).
_whl="${SKILLRUN_WHEELS:-.whl}"
if ls "$_whl"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$_whl"/*.whl
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
export SKILLRUN_KB="$_root"
# Say at once, in the log, which of the runner's dependencies this image lacks (a device call that finds out at
# its first import has spent its machine's start for nothing).
python3 - <<'PY' || echo "device-env: the runner will not import here; fetch the wheels named above into .whl/ and carry it" >&2
import importlib.util, sys
need = ["yaml", "typer", "rich", "pydantic", "jsonschema", "ijson", "orjson", "re2", "detect_secrets"]
missing = [m for m in need if importlib.util.find_spec(m) is None]
if missing:
    print("device-env: missing", " ".join(missing), file=sys.stderr)
    sys.exit(1)
PY
# DeepGEMM, where benchmarks/device_deepgemm_build.sh built it on this machine (the card's `deepgemm`
# reference; without it that reference is recorded `unavailable`).
if [ -f "${DEEPGEMM_PREFIX:-/tmp/deepgemm}/env.sh" ]; then source "${DEEPGEMM_PREFIX:-/tmp/deepgemm}/env.sh"; fi
export PYTHONUNBUFFERED=1
set +e
