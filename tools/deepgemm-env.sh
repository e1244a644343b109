#!/usr/bin/env bash
# DeepGEMM (deepseek-ai/DeepGEMM: the named peer of benchmarks/blockscale_gemm_bench.py) on the offline GPU machine:
# its C++ extension built there with the machine's torch and nvcc, its kernels JIT-compiled there. Pack it here
# first (.dg/ is git-ignored): `bash tools/pack-deepgemm.sh` writes .dg/deepgemm-src.tar.xz (~1.3 MB). Carry that
# file in a device call and, from the repository root:
#
#   source tools/deepgemm-env.sh         # unpack (once per tarball), build, set the env, then the smoke check: one
#                                        # fp8_gemm_nt at 256x512x1024 against a float32 reference, then the shapes
#                                        # of gpu-bench.sh's blockscale-deepgemm (their JIT kernels cached in /tmp)
#   source tools/deepgemm-env.sh --env   # a later call on the same warm machine: set the env only (building first
#                                        # if this machine has no build yet and the tarball travelled)
#
# (`bash tools/deepgemm-env.sh` runs the same, but its exports end with it.) Neither imports flydsl: the first call
# may carry only the MLIR half of FlyDSL's runtime. Everything goes under $DEEPGEMM_ROOT (default /tmp/deepgemm):
# deepgemm/ (the tree, built in place: deep_gemm/_C*.so, as DeepGEMM's develop.sh leaves it), build.log, jit/
# (DG_JIT_CACHE_DIR), link/ (library links, where needed). Exported: PYTHONPATH (+ the tree), CUDA_HOME,
# DG_JIT_CACHE_DIR, DEEPGEMM_COMMIT (from the tarball's PACKED; the bench records it), LD_PRELOAD (the system
# libstdc++: step 4 says why), and CPATH, LIBRARY_PATH,
# LD_LIBRARY_PATH where the toolkit lacks nvrtc's or cuBLASLt's headers or libraries (a pip-assembled CUDA keeps them
# in python's nvidia/ packages). The build is DeepGEMM's `setup.py build_ext --inplace` (what its develop.sh runs,
# one translation unit: ~2 min), with -std=c++17 as its setup.py says, or -std=c++20 where torch's headers refuse
# less (torch 2.14 does; 2.11 does not). Each step prints its seconds. Status: 0 when everything ran and matched the reference;
# else 1 no tarball nor build, 2 unpacking, 3 no CUDA toolkit, 4 headers or libraries missing, 5 the build, 6 the
# import, 7 the smoke check (its own status printed: the shapes that failed, 10 no deep_gemm, 11 no GPU). The
# smoke check's shapes after the first are DEEPGEMM_WARM's (a list, "" for none) where it is set.

source "$(dirname "${BASH_SOURCE[0]}")/cuda-home.sh"

_dg_nvidia_dirs() {  # include|lib: the folders of python's nvidia pip packages (nvidia/cu13/lib, nvidia/*/include)
    python3 - "$1" <<'PY' 2>/dev/null
import glob, os, sys
try:
    import nvidia
except ImportError:
    sys.exit(0)
for root in list(nvidia.__path__):
    for d in sorted(glob.glob(os.path.join(root, "*", sys.argv[1]))):
        print(d)
PY
}

_dg_add() {  # VARIABLE DIR [after]: DIR put first (or last) in the colon-separated VARIABLE, once
    local value="${!1:-}"
    case ":$value:" in
    *":$2:"*) ;;
    *) if [[ "${3:-}" == after ]]; then export "$1=${value:+$value:}$2"; else export "$1=$2${value:+:$value}"; fi ;;
    esac
}

_dg_headers() {  # each header the extension includes from the toolkit, found in it or in python's nvidia packages
    local h d found dirs py
    py="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
    if [[ ! -f "$py/Python.h" ]]; then
        echo "deepgemm_setup: no Python.h in $py (python's development headers)" >&2
        return 1
    fi
    mapfile -t dirs < <(_dg_nvidia_dirs include)
    for h in cuda.h cuda_runtime.h nvrtc.h cublasLt.h; do
        found=""
        for d in "$CUDA_HOME/include" "$CUDA_HOME/targets/x86_64-linux/include" "${dirs[@]}"; do
            [[ -f "$d/$h" ]] && found="$d" && break
        done
        if [[ -z "$found" ]]; then
            echo "deepgemm_setup: no $h in $CUDA_HOME/include nor in python's nvidia packages" >&2
            return 1
        fi
        [[ "$found" == "$CUDA_HOME/include" ]] || _dg_add CPATH "$found"
    done
}

_dg_libraries() {  # -lcudart -lnvrtc link (through links in $1 where the toolkit has no libX.so), and load
    local lib dir f found dirs probe="$1/probe" cxx
    mkdir -p "$1" || return 1
    cxx="$(command -v "${CXX:-c++}" || command -v g++)" || {
        echo "deepgemm_setup: no C++ compiler (c++, g++)" >&2
        return 1
    }
    mapfile -t dirs < <(_dg_nvidia_dirs lib)
    echo 'int dg_probe(void) { return 0; }' >"$probe.c"
    for lib in libcudart libnvrtc; do
        if "$cxx" -x c "$probe.c" -shared -fPIC -o "$probe.so" -L"$CUDA_HOME/lib64" "-l${lib#lib}" 2>/dev/null; then
            _dg_add LD_LIBRARY_PATH "$CUDA_HOME/lib64" after  # deep_gemm._C needs it found when it loads too
            continue
        fi
        found=""
        for dir in "$CUDA_HOME/lib64" "$CUDA_HOME/targets/x86_64-linux/lib" "${dirs[@]}" /usr/lib/x86_64-linux-gnu; do
            for f in "$dir/$lib.so" "$dir/$lib.so".[0-9]*; do
                [[ -e "$f" ]] && found="$f" && break 2
            done
        done
        if [[ -z "$found" ]]; then
            echo "deepgemm_setup: found no $lib.so* (toolkit, python's nvidia packages) to link against" >&2
            return 1
        fi
        ln -sf "$found" "$1/$lib.so"
        _dg_add LIBRARY_PATH "$1"
        _dg_add LD_LIBRARY_PATH "$(dirname "$found")" after  # what torch loads first stays first
        echo "  linking $lib through $1/$lib.so -> $found"
    done
}

_dg_compilers() {  # python's recorded C compiler where it exists, else gcc/g++ (setuptools reads CC, CXX, LDSHARED)
    local cc
    cc="$(python3 -c 'import sysconfig; print((sysconfig.get_config_var("CC") or "cc").split()[0])')"
    command -v "$cc" >/dev/null 2>&1 && return 0
    echo "  python's compiler $cc is not here: building with gcc/g++"
    export CC=gcc CXX=g++ LDSHARED="g++ -pthread -shared"
}

_dg_wheel_shim() {  # DIR: DeepGEMM's setup.py imports wheel.bdist_wheel (to subclass it); where `wheel` is
    # missing, DIR gets a stand-in command (build_ext never runs it), and the caller's `shim` is set to DIR
    python3 -c 'import wheel.bdist_wheel' 2>/dev/null && return 0
    mkdir -p "$1/wheel" || return 1
    : >"$1/wheel/__init__.py"
    cat >"$1/wheel/bdist_wheel.py" <<'PY'
from setuptools import Command


class bdist_wheel(Command):  # a stand-in: setup.py subclasses it, build_ext never runs it
    user_options = []

    def initialize_options(self):
        pass

    def finalize_options(self):
        pass

    def run(self):
        raise SystemExit("no wheel package here: bdist_wheel cannot run")
PY
    echo "  no python wheel package: setup.py imports a stand-in bdist_wheel from $1"
    shim="$1"
}

_dg_cxx_standard() {  # SETUP_PY: DeepGEMM's setup.py compiles with -std=c++17; torch >= 2.13 or so refuses its
    # headers below C++20 (ATen.h's #error), so there the unpacked copy is built with -std=c++20
    local aten
    aten="$(python3 -c 'import os, torch.utils.cpp_extension as e; print(os.path.join(e.include_paths()[0], "ATen", "ATen.h"))')" ||
        return 1
    grep -q "C++20 or later" "$aten" 2>/dev/null || return 0
    grep -q "'-std=c++17'" "$1" || { echo "deepgemm_setup: $1 has no '-std=c++17' to raise" >&2; return 1; }
    sed -i "s/'-std=c++17'/'-std=c++20'/" "$1" && echo "  torch's headers need C++20 ($aten): setup.py builds with -std=c++20"
}

_dg_setup() {
    local mode="full" root base src tarball sum so began=$SECONDS t rc shim
    [[ "${1:-}" == "--env" ]] && mode="env"
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    base="${DEEPGEMM_ROOT:-/tmp/deepgemm}"
    src="$base/deepgemm"
    tarball="$root/.dg/deepgemm-src.tar.xz"

    # 1. unpack, once per tarball (its checksum stamped beside it): a new tarball means a new build
    t=$SECONDS
    if [[ -f "$tarball" ]]; then
        sum="$(cksum <"$tarball")"
        if [[ "$(cat "$base/.unpacked" 2>/dev/null)" != "$sum" ]]; then
            if ! { rm -rf "$src" "$base/.unpacked" && mkdir -p "$base" && tar -xJf "$tarball" -C "$base"; }; then
                echo "deepgemm_setup: step 1 (unpack $tarball into $base) failed" >&2
                return 2
            fi
            echo "$sum" >"$base/.unpacked"
            echo "deepgemm_setup: 1. unpacked $(sed -n 's/^deepgemm //p' "$src/PACKED") in $((SECONDS - t)) s"
        fi
    elif [[ ! -f "$src/PACKED" ]]; then
        echo "deepgemm_setup: step 1: no $tarball and nothing unpacked in $src (carry .dg/deepgemm-src.tar.xz;" \
            "a fresh machine needs \`source tools/deepgemm-env.sh\` again)" >&2
        return 1
    fi

    # 2. the toolkit: CUDA_HOME (torch's extension build and DeepGEMM's JIT read it), headers, libraries
    t=$SECONDS
    if ! CUDA_HOME="$(find_cuda_home)"; then
        echo "deepgemm_setup: step 2: found no CUDA toolkit (bin/nvcc + include/cuda_runtime.h)" >&2
        return 3
    fi
    export CUDA_HOME
    _dg_headers || return 4
    _dg_libraries "$base/link" || return 4
    echo "deepgemm_setup: 2. CUDA_HOME=$CUDA_HOME (nvcc $("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release //p'))," \
        "CPATH=${CPATH:-}, LIBRARY_PATH=${LIBRARY_PATH:-}, $((SECONDS - t)) s"

    # 3. the extension, built in place (deep_gemm/_C*.so) unless this tarball's build is there
    t=$SECONDS
    so="$(find "$src/deep_gemm" -maxdepth 1 -name '_C*.so' 2>/dev/null | head -n 1)"
    if [[ -z "$so" || ! -f "$base/.built" || "$(cat "$base/.built")" != "$(cat "$base/.unpacked" 2>/dev/null)" ]]; then
        shim=""
        _dg_compilers
        _dg_wheel_shim "$base/shim"
        _dg_cxx_standard "$src/setup.py" || return 5
        echo "deepgemm_setup: 3. building deep_gemm._C (setup.py build_ext --inplace; log $base/build.log)"
        (cd "$src" && rm -rf build && PYTHONPATH="${shim:+$shim:}${PYTHONPATH:-}" DG_USE_LOCAL_VERSION=0 \
            python3 setup.py build_ext --inplace) >"$base/build.log" 2>&1
        rc=$?
        so="$(find "$src/deep_gemm" -maxdepth 1 -name '_C*.so' | head -n 1)"
        if [[ $rc -ne 0 || -z "$so" ]]; then
            tail -n 40 "$base/build.log" >&2
            echo "deepgemm_setup: step 3 (build deep_gemm._C, status $rc) failed after $((SECONDS - t)) s;" \
                "the log: $base/build.log" >&2
            return 5
        fi
        cat "$base/.unpacked" >"$base/.built"
        echo "deepgemm_setup: 3. built ${so#"$src"/} in $((SECONDS - t)) s"
    fi

    # 4. the environment. deep_gemm._C's JIT (std::regex in its include parser) crashed in
    # std::collate<char>::transform inside torch's process (cuda-gdb backtrace on an H100 host, torch 2.11, CUDA 13.0,
    # 2026-12-07): its locale facets resolved against another copy of libstdc++'s symbols. Preloading the system
    # libstdc++ binds them to one copy (the check then passes); FlyDSL runs unchanged beside it.
    _dg_add PYTHONPATH "$src"
    local libstdcxx
    libstdcxx="$(ldconfig -p 2>/dev/null | awk '/libstdc\+\+\.so\.6 .*x86-64/ { print $NF; exit }')"
    [[ -n "$libstdcxx" ]] && _dg_add LD_PRELOAD "$libstdcxx"
    export DG_JIT_CACHE_DIR="$base/jit"
    DEEPGEMM_COMMIT="$(sed -n 's/^deepgemm //p' "$src/PACKED")"
    export DEEPGEMM_COMMIT
    mkdir -p "$DG_JIT_CACHE_DIR"
    t=$SECONDS
    if ! python3 -c 'import deep_gemm' >"$base/import.log" 2>&1; then
        tail -n 20 "$base/import.log" >&2
        echo "deepgemm_setup: step 4 (import deep_gemm from $src) failed" >&2
        return 6
    fi
    echo "deepgemm_setup: 4. import deep_gemm ok ($((SECONDS - t)) s): DEEPGEMM_COMMIT=$DEEPGEMM_COMMIT" \
        "DG_JIT_CACHE_DIR=$DG_JIT_CACHE_DIR LD_PRELOAD=${LD_PRELOAD:-} PYTHONPATH=$PYTHONPATH"
    [[ "$mode" == "env" ]] && return 0

    # 5. the smoke check, then the shapes gpu-bench.sh's blockscale-deepgemm times (their kernels JIT-compiled now);
    # a crash prints its Python stack (faulthandler); DG_JIT_DEBUG=1 prints each step of DeepGEMM's JIT, and
    # `cuda-gdb -batch -ex run -ex bt --args python3 ...` where a native crash happens
    t=$SECONDS
    # shellcheck disable=SC2086  # DEEPGEMM_WARM is a list of shapes
    PYTHONUNBUFFERED=1 python3 -X faulthandler "$root/benchmarks/deepgemm_peer.py" \
        --warm ${DEEPGEMM_WARM-4096x7168x16384 512x7168x16384 4096x18432x7168 8192x7168x2048}
    rc=$?
    echo "deepgemm_setup: 5. smoke check status $rc in $((SECONDS - t)) s; all $((SECONDS - began)) s"
    if [[ $rc -ne 0 ]]; then
        echo "deepgemm_setup: step 5 (the smoke check: benchmarks/deepgemm_peer.py) failed with status $rc" >&2
        return 7
    fi
    return 0
}

_dg_setup "$@"
_dg_rc=$?
unset -f _dg_setup _dg_nvidia_dirs _dg_add _dg_headers _dg_libraries _dg_compilers _dg_wheel_shim
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    exit "$_dg_rc"
fi
return "$_dg_rc"
