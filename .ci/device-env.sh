# Source this on the lent GPU machine (device tool), from the repository root:
#   source .ci/device-env.sh
# It makes `skillrun` / `skillrun_kernels` importable without installing (no network there):
# the fixed layout maps runner/ and kernels/ onto those names, so we expose them through links.
# Wheels for packages the image lacks travel in .whl/ (carry it) and go to /tmp/site. Fetch them here
# (ignored by git) for the image's Python 3.12, e.g. for pydantic, pydantic_core, annotated-types,
# typing-inspection, typing_extensions, jsonschema, jsonschema-specifications, referencing, rpds-py, ijson, orjson:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl NAME==VER
set -e
_root="$(pwd)"
mkdir -p /tmp/shim
ln -sfn "$_root/runner" /tmp/shim/skillrun
ln -sfn "$_root/kernels" /tmp/shim/skillrun_kernels
ln -sfn "$_root" /tmp/shim/skillrun_kb
export PYTHONPATH="/tmp/shim${PYTHONPATH:+:$PYTHONPATH}"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
export SKILLRUN_KB="$_root"
export PYTHONUNBUFFERED=1
set +e
