#!/usr/bin/env bash
# Packs DeepGEMM (deepseek-ai/DeepGEMM, the block-scaled fp8 GEMM peer of benchmarks/blockscale_gemm_bench.py) for
# the offline GPU machine into .dg/deepgemm-src.tar.xz (git-ignored, ~2 MB); tools/deepgemm-env.sh unpacks and
# builds it there. The tarball holds one folder, deepgemm/:
#   DeepGEMM's tree at $DEEPGEMM_COMMIT (git archive: its sources, setup.py, tests; no submodule contents)
#   third-party/cutlass/include (cute/, cutlass/) and LICENSE.txt at the commit DeepGEMM's tree pins for it
#   third-party/fmt/include and LICENSE at its pinned commit (DeepGEMM includes fmt header-only: no fmt source)
#   deep_gemm/include/{cute,cutlass}: links to third-party/cutlass/include/..., as DeepGEMM's develop.sh makes them
#     (its JIT compiles the kernels with -I deep_gemm/include only)
#   PACKED: the three commits (deepgemm-env.sh exports DEEPGEMM_COMMIT from it; the bench records it)
#
#   bash tools/pack-deepgemm.sh        # from anywhere in the repository
#
# The sources are git repositories (bare or not): DEEPGEMM_GIT, CUTLASS_GIT and FMT_GIT, by default the mirrors
# this workplace's fetch tool makes under /work/.mirror (github:deepseek-ai/DeepGEMM, NVIDIA/cutlass, fmtlib/fmt).
# cutlass and fmt are taken at the commits DeepGEMM's tree records for its submodules (CUTLASS_COMMIT / FMT_COMMIT
# override them, e.g. with the nearest commit a mirror holds; PACKED then says so).
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"

dg_git=${DEEPGEMM_GIT:-/work/.mirror/deepseek-ai+DeepGEMM/repo}
cutlass_git=${CUTLASS_GIT:-/work/.mirror/NVIDIA+cutlass/repo}
fmt_git=${FMT_GIT:-/work/.mirror/fmtlib+fmt/repo}
dg_commit=${DEEPGEMM_COMMIT:-54e22612409371d6364144b69086735beb54e98b}

commit_of() {  # repository revision: the full commit, or a message naming what is missing
  git -C "$1" rev-parse --verify --quiet "$2^{commit}" || {
    echo "pack-deepgemm: $1 holds no commit $2 (set ${3}_GIT to a clone that has it, or ${3}_COMMIT)" >&2
    return 1
  }
}
dg_commit=$(commit_of "$dg_git" "$dg_commit" DEEPGEMM)
gitlink() {  # the commit DeepGEMM's tree pins for a submodule
  git -C "$dg_git" ls-tree "$dg_commit" "third-party/$1" | awk '$2 == "commit" { print $3 }'
}
cutlass_pin=$(gitlink cutlass)
fmt_pin=$(gitlink fmt)
[[ -n $cutlass_pin && -n $fmt_pin ]] || { echo "pack-deepgemm: no cutlass/fmt submodule pins in $dg_commit" >&2; exit 1; }
cutlass_commit=$(commit_of "$cutlass_git" "${CUTLASS_COMMIT:-$cutlass_pin}" CUTLASS)
fmt_commit=$(commit_of "$fmt_git" "${FMT_COMMIT:-$fmt_pin}" FMT)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
src=$work/deepgemm
mkdir -p "$src/third-party/cutlass" "$src/third-party/fmt"
git -C "$dg_git" archive "$dg_commit" | tar -x -C "$src"
git -C "$cutlass_git" archive "$cutlass_commit" include LICENSE.txt | tar -x -C "$src/third-party/cutlass"
git -C "$fmt_git" archive "$fmt_commit" include LICENSE | tar -x -C "$src/third-party/fmt"
# A partial mirror (one lacking blobs outside include/, as /work/.mirror's cutlass does) makes git archive print
# "invalid object" for those; what was asked for is checked here: every file of include/ is in the tree.
complete() {  # repository commit folder: the archived folder holds as many files as the commit's tree
  local want have
  want=$(git -C "$1" ls-tree -r --name-only "$2" include | wc -l)
  have=$(find "$3/include" -type f | wc -l)
  [[ $want -gt 0 && $want == "$have" ]] || { echo "pack-deepgemm: $3/include has $have of $want files" >&2; exit 1; }
}
complete "$cutlass_git" "$cutlass_commit" "$src/third-party/cutlass"
complete "$fmt_git" "$fmt_commit" "$src/third-party/fmt"
for d in cute cutlass; do
  [[ -d $src/third-party/cutlass/include/$d ]] || { echo "pack-deepgemm: cutlass has no include/$d" >&2; exit 1; }
  ln -s "../../third-party/cutlass/include/$d" "$src/deep_gemm/include/$d"
done
note() {  # pinned actual: the commit, and the pin where another was taken
  if [[ $1 == "$2" ]]; then echo "$2"; else echo "$2 (DeepGEMM pins $1)"; fi
}
{
  echo "deepgemm $dg_commit"
  echo "cutlass $(note "$cutlass_pin" "$cutlass_commit")"
  echo "fmt $(note "$fmt_pin" "$fmt_commit")"
} >"$src/PACKED"

mkdir -p .dg
mtime=$(git -C "$dg_git" show -s --format=%ct "$dg_commit")
tar -C "$work" --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$mtime" -cf - deepgemm |
  xz -T0 -9 >.dg/deepgemm-src.tar.xz.partial
mv .dg/deepgemm-src.tar.xz.partial .dg/deepgemm-src.tar.xz
sed 's/^/  /' "$src/PACKED"
echo "pack-deepgemm: .dg/deepgemm-src.tar.xz, $(wc -c <.dg/deepgemm-src.tar.xz) bytes"
