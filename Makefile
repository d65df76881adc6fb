# One command to set everything up and run the main job; one to run the tests (.ci/run calls it).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# CPU build of torch 2.13.0 (a local wheel on our dev/CI machines); an unpinned torch would pull a
# multi-GB CUDA build. numpy<2.4 because triton 3.6's interpreter breaks on numpy 2.4.
TORCH ?= torch==2.13.0
# The lent H200's Triton: CPU interpreter tests and sm_90 compile checks must see the compiler the
# measurements were taken with (a newer Triton changes what ptxas is given).
TRITON ?= triton==3.6.0
EXAMPLE := runner/examples/h200_fp8_blockscale_scaled_mm.pt.trace.json.gz

.PHONY: setup demo test lld

$(BIN)/skill-run: pyproject.toml setup.py
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)" "$(TRITON)" -e ".[all]"
	touch $@

setup: $(BIN)/skill-run

# FlyDSL compile-only checks link code objects with Debian's lld-19.
lld:
	@command -v ld.lld-19 >/dev/null 2>&1 || test -x /usr/lib/llvm-19/bin/ld.lld || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq lld-19)

demo: setup
	$(BIN)/skill-run --profile $(EXAMPLE)

test: setup lld
	$(BIN)/python -m pytest -q -p no:cacheprovider tests
