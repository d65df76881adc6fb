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
EXAMPLE := runner/skillrun/examples/h200_fp8_blockscale_scaled_mm.pt.trace.json.gz
# `setup` installs the newest FlyDSL the package accepts; the oldest supported release gets its own
# small venv that holds only flydsl and borrows everything else from $(VENV).
FLYDSL_OLDEST_VERSION ?= 0.4.2
FLYDSL_OLDEST := flydsl==$(FLYDSL_OLDEST_VERSION)
OLDEST := .venv-flydsl-oldest
FLYDSL_TESTS := tests/test_flydsl_compile.py
# The suite runs on PYTEST_WORKERS processes (pytest-xdist; auto = one per core). A test file stays on
# one worker (--dist loadfile), so its module fixtures are built once, as in a single process; the
# FlyDSL compile tests spread test by test. PYTEST_WORKERS=0 runs everything in one process.
PYTEST_WORKERS ?= auto

.PHONY: setup demo test test-flydsl-oldest lld browser

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

# The report's layout test renders the page in headless Chromium (Debian's package; no browser download).
browser:
	@command -v chromium >/dev/null 2>&1 || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)

demo: setup
	$(BIN)/skill-run --profile $(EXAMPLE)

# An `import` line in a .pth runs at start-up: addsitedir also reads $(VENV)'s own .pth files (the
# editable install), and this venv's flydsl stays first on the path.
$(OLDEST)/.ready: $(BIN)/skill-run
	$(PY) -m venv $(OLDEST)
	$(OLDEST)/bin/pip install -q --no-deps "$(FLYDSL_OLDEST)"
	echo "import site; site.addsitedir('$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')')" \
	  > "$$($(OLDEST)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_skillrun_venv.pth"
	touch $@

# The FlyDSL compile tests only (every recipe compiled and gated), under the oldest supported FlyDSL.
test-flydsl-oldest: $(OLDEST)/.ready lld
	$(OLDEST)/bin/python -c "import importlib.metadata as m; v = m.version('flydsl'); print('flydsl', v); assert v == '$(FLYDSL_OLDEST_VERSION)', v"
	$(OLDEST)/bin/python -m pytest -q -p no:cacheprovider -n $(PYTEST_WORKERS) --dist load $(FLYDSL_TESTS)

test: setup lld browser
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadfile tests
	$(MAKE) test-flydsl-oldest
