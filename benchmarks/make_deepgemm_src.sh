#!/bin/bash
# Assemble .deps/deepgemm-src.tar.gz, the DeepGEMM source copy benchmarks/device_deepgemm_build.sh
# builds on the lent H200 (which reaches no network). Run on any machine with git and three local
# clones (or mirrors) holding the pinned commits; nothing is downloaded here:
#   bash benchmarks/make_deepgemm_src.sh <DeepGEMM git dir> <CUTLASS git dir> <fmt git dir> [out]
# DeepGEMM is pinned below; the CUTLASS and fmt commits are the submodule commits DeepGEMM's own tree
# records at that commit (third-party/cutlass, third-party/fmt), read from it, not retyped.
# Contents (DeepGEMM/ at the top): csrc/ deep_gemm/ scripts/ setup.py and third-party/tilelang_ops from
# DeepGEMM; include/ of CUTLASS and of fmt under third-party/; SOURCE_COMMITS naming all three.
# The archive is a build input carried to the device (run(carry=[".deps"])), never committed: /.deps/
# is in .gitignore.
set -euo pipefail
DG_COMMIT=${DG_COMMIT:-54e22612409371d6364144b69086735beb54e98b}
DG=${1:?DeepGEMM git dir}
CUTLASS=${2:?CUTLASS git dir}
FMT=${3:?fmt git dir}
OUT=${4:-.deps/deepgemm-src.tar.gz}
sub() { git -C "$DG" ls-tree "$DG_COMMIT" "third-party/$1" | awk '{print $3}'; }
CUT_COMMIT=$(sub cutlass)
FMT_COMMIT=$(sub fmt)
[ -n "$CUT_COMMIT" ] && [ -n "$FMT_COMMIT" ] || { echo "no third-party submodule commits in $DG at $DG_COMMIT" >&2; exit 2; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP/DeepGEMM/third-party/cutlass" "$TMP/DeepGEMM/third-party/fmt"
git -C "$DG" archive "$DG_COMMIT" csrc deep_gemm scripts setup.py third-party/tilelang_ops | tar x -C "$TMP/DeepGEMM"
git -C "$CUTLASS" archive "$CUT_COMMIT" include | tar x -C "$TMP/DeepGEMM/third-party/cutlass"
git -C "$FMT" archive "$FMT_COMMIT" include | tar x -C "$TMP/DeepGEMM/third-party/fmt"
# A partial mirror may lack blobs outside include/ (git then prints "invalid object" and goes on):
# the copy counts, not git's exit status, say whether every header arrived.
for pair in "cutlass:$CUTLASS:$CUT_COMMIT" "fmt:$FMT:$FMT_COMMIT"; do
  IFS=: read -r name dir commit <<< "$pair"
  want=$(git -C "$dir" ls-tree -r --name-only "$commit" include | wc -l)
  got=$(find "$TMP/DeepGEMM/third-party/$name/include" -type f | wc -l)
  [ "$want" = "$got" ] || { echo "$name include/: $got of $want files copied" >&2; exit 3; }
done
printf 'DeepGEMM %s\nCUTLASS %s\nfmt %s\n' "$DG_COMMIT" "$CUT_COMMIT" "$FMT_COMMIT" > "$TMP/DeepGEMM/SOURCE_COMMITS"
mkdir -p "$(dirname "$OUT")"
tar czf "$OUT" -C "$TMP" DeepGEMM
echo "$OUT: $(du -h "$OUT" | cut -f1) ($(tr '\n' ' ' < "$TMP/DeepGEMM/SOURCE_COMMITS"))"
