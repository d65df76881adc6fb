#!/bin/bash
# Build DeepGEMM's extension (deep_gemm._C) on the lent H200, from a source copy carried with the
# tree (no internet there), so that the block-scale card's `deepgemm` production reference loads
# (kernels/skillrun_kernels/_deepgemm.py). Why from source: the sgl-deep-gemm 0.2.5 wheel does not load against the
# image's torch 2.11 (undefined c10::cuda::CUDAErrorLogCapture) and ships no C++ to rebuild.
#
# Needs .deps/deepgemm-src.tar.gz (2.7 MB: DeepGEMM 54e2261 csrc/ deep_gemm/ scripts/generate_pyi.py
# setup.py, CUTLASS f3fde58 include/, fmt 553ec11 include/; SOURCE_COMMITS inside), carried:
#   run(carry=[".deps"], command="bash benchmarks/device_deepgemm_build.sh && COMMIT=... bash ...")
# or, after one build, the built package this script leaves in $OUT (deepgemm-built.tgz, copied to
# .deps/ on the lead's side): then the build is skipped and the package is only unpacked and checked.
#
# What it does (one 16-core H200 machine, < 4 min):
#   1. finds a CUDA home with bin/nvcc >= 12.3 (DeepGEMM's JIT compiles every kernel with it at run
#      time, and its import asserts a CUDA home): $CUDA_HOME, $CUDA_PATH, `which nvcc`, torch's
#      CUDA_HOME, /usr/local/cuda*, the pip nvidia-* wheels; prints what it found and why not;
#   2. builds deep_gemm (setup.py build: build_py copies the CUTLASS headers the JIT includes,
#      build_ext compiles csrc/python_api.cpp against this torch) under `timeout`;
#   3. installs it to $DEEPGEMM_PREFIX (default /tmp/deepgemm, outside the tree so a later carry of
#      .deps cannot remove it; it stays while the machine is warm) and writes $DEEPGEMM_PREFIX/env.sh
#      (PYTHONPATH, CUDA_HOME, DG_JIT_CACHE_DIR, library paths); .ci/device-env.sh sources it;
#   4. smoke test: deep_gemm.fp8_gemm_nt on 256x512x1024 against an fp32 reference (this JIT-compiles
#      the sm_90 1d2d kernel once; the cache is kept in $DEEPGEMM_PREFIX/jit-cache);
#   5. leaves deepgemm_build.log and deepgemm-built.tgz (the installed package) in $OUT.
# Exit status: 0 built and smoke-tested; 2 no usable CUDA home; 3 build failed; 4 import or smoke failed.
set -o pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
LOG="$OUT/deepgemm_build.log"
ROOT="$(pwd)"
SRC=${DEEPGEMM_SRC:-$ROOT/.deps/deepgemm-src.tar.gz}
PREBUILT=${DEEPGEMM_PREBUILT:-$ROOT/.deps/deepgemm-built.tgz}
PREFIX=${DEEPGEMM_PREFIX:-/tmp/deepgemm}
WORK=${DEEPGEMM_WORK:-/tmp/deepgemm-build}
BUILD_TIMEOUT=${DEEPGEMM_BUILD_TIMEOUT:-220}
PY=${PYTHON:-python3}
log() { echo "[deepgemm] $*" | tee -a "$LOG"; }
: > "$LOG"
t0=$(date +%s)

# ---- 1. CUDA home -----------------------------------------------------------------------------
nvcc_ok() {  # $1 = candidate home; prints "major.minor" when bin/nvcc >= 12.3 runs and the headers are there
  local v
  [ -x "$1/bin/nvcc" ] && [ -f "$1/include/cuda_runtime.h" ] || return 1
  v=$("$1/bin/nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p' | head -1)
  [ -n "$v" ] || return 1
  awk -v v="$v" 'BEGIN { split(v, a, "."); exit !((a[1] > 12) || (a[1] == 12 && a[2] >= 3)) }' || return 1
  echo "$v"
}
cands=("${CUDA_HOME:-}" "${CUDA_PATH:-}")
if command -v nvcc >/dev/null 2>&1; then
  # nvcc on PATH may be a wrapper script: ask it where its toolkit is (TOP in its dry run).
  top=$(nvcc --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1)
  [ -n "$top" ] && cands+=("$(readlink -f "$top")")
  cands+=("$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")")
fi
cands+=("$($PY -c 'from torch.utils.cpp_extension import CUDA_HOME; print(CUDA_HOME or "")' 2>/dev/null)")
for d in /usr/local/cuda /usr/local/cuda-13* /usr/local/cuda-12* /opt/cuda; do cands+=("$d"); done
while IFS= read -r d; do cands+=("$d"); done < <($PY - <<'EOF' 2>/dev/null
import glob, os, site
for sp in site.getsitepackages() + [site.getusersitepackages()]:
    for d in sorted(glob.glob(os.path.join(sp, "nvidia", "*"))):
        if os.path.exists(os.path.join(d, "bin", "nvcc")):
            print(d)
EOF
)
CUDA_FOUND=""
for d in "${cands[@]}"; do
  [ -n "$d" ] || continue
  if v=$(nvcc_ok "$d"); then CUDA_FOUND="$d"; log "CUDA home $d (nvcc $v)"; break; fi
  log "not a CUDA home with nvcc >= 12.3: $d"
done
if [ -z "$CUDA_FOUND" ]; then
  log "no CUDA home with bin/nvcc >= 12.3 found: DeepGEMM cannot build or JIT here (the reference stays unavailable)"
  exit 2
fi
export CUDA_HOME="$CUDA_FOUND"
export PATH="$CUDA_HOME/bin:$PATH"
# setup.py links -lcudart -lnvrtc from $CUDA_HOME/lib64; a pip-style layout has lib/ and versioned
# names only: give the linker unversioned links in a shim directory.
SHIM="$WORK/libshim"
mkdir -p "$SHIM"
PYLIBS=$($PY -c 'import glob, os, site; print(" ".join(d for p in site.getsitepackages() for d in sorted(glob.glob(os.path.join(p, "nvidia", "*", "lib")))))' 2>/dev/null)
for lib in cudart nvrtc; do
  f=""
  for dir in "$CUDA_HOME/lib64" "$CUDA_HOME/lib" "$CUDA_HOME"/targets/*/lib $PYLIBS; do
    f=$(ls "$dir"/lib$lib.so "$dir"/lib$lib.so.[0-9]* 2>/dev/null | grep -v alt | head -1)
    [ -n "$f" ] && break
  done
  if [ -n "$f" ]; then ln -sfn "$f" "$SHIM/lib$lib.so"; log "lib$lib: $f"; else log "lib$lib.so not found under $CUDA_HOME or the nvidia wheels"; fi
done
export LIBRARY_PATH="$SHIM:$CUDA_HOME/lib64:$CUDA_HOME/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
export LD_LIBRARY_PATH="$SHIM:$CUDA_HOME/lib64:$CUDA_HOME/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CPATH="$CUDA_HOME/include:$CUDA_HOME/include/cccl${CPATH:+:$CPATH}"

write_env() {
  cat > "$PREFIX/env.sh" <<EOF
# written by benchmarks/device_deepgemm_build.sh: makes deep_gemm importable and its JIT usable
export CUDA_HOME="$CUDA_HOME"
export PATH="$CUDA_HOME/bin:\$PATH"
export PYTHONPATH="$PREFIX/site\${PYTHONPATH:+:\$PYTHONPATH}"
export LD_LIBRARY_PATH="$SHIM:$CUDA_HOME/lib64:$CUDA_HOME/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export DG_JIT_CACHE_DIR="$PREFIX/jit-cache"
EOF
}

smoke() {
  # shellcheck disable=SC1091
  source "$PREFIX/env.sh"
  timeout 150 $PY - <<'EOF' 2>&1 | tee -a "$LOG"
import time, torch
t0 = time.time()
import deep_gemm
print("deep_gemm", deep_gemm.__version__, "from", deep_gemm.__file__, "torch", torch.__version__, "cuda", torch.version.cuda)
M, N, K = 256, 512, 1024
g = torch.Generator(device="cuda").manual_seed(0)
a = torch.randn(M, K, device="cuda", generator=g).to(torch.float8_e4m3fn)
b = torch.randn(N, K, device="cuda", generator=g).to(torch.float8_e4m3fn)
sa = torch.rand(M, K // 128, device="cuda", generator=g) + 0.5
sb = torch.rand(N // 128, K // 128, device="cuda", generator=g) + 0.5
d = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
deep_gemm.fp8_gemm_nt((a, deep_gemm.get_mn_major_tma_aligned_tensor(sa)), (b, sb), d)
torch.cuda.synchronize()
ref = (a.float() * sa.repeat_interleave(128, 1)) @ (b.float() * sb.repeat_interleave(128, 0).repeat_interleave(128, 1)).t()
err = ((d.float() - ref).norm() / ref.norm()).item()
print(f"smoke fp8_gemm_nt {M}x{N}x{K}: rel_fro {err:.3g} ({time.time() - t0:.1f} s incl. JIT)")
raise SystemExit(0 if err < 5e-3 else 1)
EOF
}

# ---- a package built earlier and carried back: unpack and check, no build ----------------------
if [ -f "$PREBUILT" ] && [ -z "${DEEPGEMM_FORCE_BUILD:-}" ]; then
  log "using the prebuilt package $PREBUILT"
  rm -rf "$PREFIX/site" && mkdir -p "$PREFIX/site" "$PREFIX/jit-cache"
  tar xzf "$PREBUILT" -C "$PREFIX/site" && write_env
  if smoke; then log "ok in $(( $(date +%s) - t0 )) s (prebuilt)"; exit 0; fi
  log "the prebuilt package does not work here: building from source"
fi

# ---- 2. build ---------------------------------------------------------------------------------
if [ ! -f "$SRC" ]; then log "no source copy at $SRC (carry .deps)"; exit 3; fi
rm -rf "$WORK/src" && mkdir -p "$WORK/src"
tar xzf "$SRC" -C "$WORK/src" || { log "cannot unpack $SRC"; exit 3; }
cd "$WORK/src/DeepGEMM" || exit 3
cat SOURCE_COMMITS | tee -a "$LOG"
$PY -c "import torch, setuptools, packaging; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'setuptools', setuptools.__version__)" 2>&1 | tee -a "$LOG"
command -v g++ >/dev/null 2>&1 || log "no g++ on PATH: the C++ extension cannot build"
# setup.py imports wheel.bdist_wheel; where the image has no `wheel`, setuptools' own class stands in.
if ! $PY -c "import wheel.bdist_wheel" 2>/dev/null; then
  mkdir -p "$WORK/shim/wheel"
  : > "$WORK/shim/wheel/__init__.py"
  # Only `setup.py build` runs here; DeepGEMM subclasses bdist_wheel for its wheel command alone.
  printf 'from setuptools import Command\n\n\nclass bdist_wheel(Command):  # stand-in: device_deepgemm_build.sh runs `build` only\n    user_options = []\n\n    def initialize_options(self):\n        pass\n\n    def finalize_options(self):\n        pass\n\n    def run(self):\n        raise SystemExit("bdist_wheel needs the wheel package")\n' > "$WORK/shim/wheel/bdist_wheel.py"
  export PYTHONPATH="$WORK/shim${PYTHONPATH:+:$PYTHONPATH}"
  log "no wheel module: a stand-in bdist_wheel class lets setup.py import (only build runs)"
fi
export DG_USE_LOCAL_VERSION=0 MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST="9.0a"
log "building (timeout ${BUILD_TIMEOUT} s)"
tb=$(date +%s)
if ! timeout "$BUILD_TIMEOUT" $PY setup.py build >> "$LOG" 2>&1; then
  log "build failed or timed out after $(( $(date +%s) - tb )) s; tail:"; tail -30 "$LOG"
  exit 3
fi
log "built in $(( $(date +%s) - tb )) s"

# ---- 3. install -------------------------------------------------------------------------------
lib=$(ls -d build/lib*/ 2>/dev/null | head -1)
if [ -z "$lib" ] || ! ls "$lib"deep_gemm/_C*.so >/dev/null 2>&1; then log "no deep_gemm/_C*.so under build/lib*"; exit 3; fi
rm -rf "$PREFIX/site" && mkdir -p "$PREFIX/site" "$PREFIX/jit-cache"
cp -r "$lib"deep_gemm "$PREFIX/site/"
write_env
cd "$ROOT" || exit 3

# ---- 4. smoke, 5. leave the package for later calls --------------------------------------------
if ! smoke; then log "import or smoke test failed"; exit 4; fi
tar czf "$OUT/deepgemm-built.tgz" -C "$PREFIX/site" deep_gemm
log "ok in $(( $(date +%s) - t0 )) s; package $(du -h "$OUT/deepgemm-built.tgz" | cut -f1) in \$OUT/deepgemm-built.tgz; source $PREFIX/env.sh"
