#!/usr/bin/env bash
# FlashInfer (JIT: kernels compiled there by the machine's nvcc, no prebuilt ones) on the GPU machine, for
# benchmarks/paged_attention_bench.py. Fetch the wheels here first (.whl/ is git-ignored: `echo /.whl/ >>
# .git/info/exclude`), with the device README's pip download command:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any -d .whl \
#     flashinfer-python==0.6.13 apache-tvm-ffi==0.1.12
# then carry .whl in the device call (with .devrt/rt-mlir.tar.xz and .devrt/wheels: ~57 MB with the tree) and, from
# the repository root:
#
#   source tools/flashinfer-env.sh         # install the wheels, set the env, JIT-build + run the decode once per case
#   source tools/flashinfer-env.sh --env   # a later call on the same warm machine: install only if missing, set
#                                          # the env (same JIT cache dir, so nothing is rebuilt), no warm-up
#
# (`bash tools/flashinfer-env.sh` runs the same, but its exports end with it.) Status: 0 when everything ran and
# matched the reference, else non-zero (the warm-up's count of failed cases, or 1..9 for a setup step).
#
# .whl/: flashinfer-python 0.6.13 (pure-Python wheel, JIT) and apache-tvm-ffi 0.1.12, installed with --no-deps.
# Their other Requires-Dist are either on the machine already (torch, numpy, ninja, einops, click, tabulate,
# requests, packaging, nvidia-ml-py, tqdm) or not imported by `import flashinfer` nor by the decode path
# (nvidia-cutlass-dsl, nvidia-cudnn-frontend, cuda-tile[tileiras]).

source "$(dirname "${BASH_SOURCE[0]}")/cuda-home.sh"

_fi_link_ok() {
    # FlashInfer links each module with: c++ ... -shared -L$CUDA_HOME/lib64 -L$CUDA_HOME/lib64/stubs -lcudart -lcuda
    mkdir -p /tmp/fi_link || return 1
    echo 'int fi_probe(void) { return 0; }' >/tmp/fi_link/probe.c
    # shellcheck disable=SC2086  # FLASHINFER_EXTRA_LDFLAGS is a list of flags
    c++ -x c /tmp/fi_link/probe.c -shared -fPIC -o /tmp/fi_link/probe.so -L"$CUDA_HOME/lib64" \
        -L"$CUDA_HOME/lib64/stubs" ${FLASHINFER_EXTRA_LDFLAGS:-} -lcudart -lcuda 2>/tmp/fi_link/probe.err
}

_fi_fix_link() {
    # No libcuda.so stub (or no libcudart.so) where the linker looks: link against the driver's libcuda.so.1
    # (and CUDA's / torch's libcudart.so.13) through symlinks in /tmp/fi_link.
    local lib dir found f
    for lib in libcuda libcudart; do
        found=""
        for dir in "$CUDA_HOME/lib64/stubs" "$CUDA_HOME/lib64" "$CUDA_HOME/targets/x86_64-linux/lib" \
            /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64 \
            /lib/x86_64-linux-gnu "$(python3 -c 'import nvidia.cu13, os; print(os.path.join(nvidia.cu13.__path__[0], "lib"))' 2>/dev/null)"; do
            found=""
            for f in "$dir/$lib.so" "$dir/$lib.so".[0-9]*; do
                [[ -e "$f" ]] && found="$f" && break
            done
            [[ -n "$found" ]] && break
        done
        if [[ -z "$found" ]]; then
            found="$(ldconfig -p 2>/dev/null | sed -n "s/^[[:space:]]*$lib\.so[.0-9]* .*=> //p" | head -n 1)"
        fi
        if [[ -n "$found" ]]; then
            ln -sf "$found" "/tmp/fi_link/$lib.so"
            echo "  linking $lib through /tmp/fi_link/$lib.so -> $found"
        else
            echo "  found no $lib.so* to link against"
        fi
    done
    export FLASHINFER_EXTRA_LDFLAGS="${FLASHINFER_EXTRA_LDFLAGS:+$FLASHINFER_EXTRA_LDFLAGS }-L/tmp/fi_link"
}

_fi_setup() {
    local mode="full" root site=/tmp/site began=$SECONDS
    [[ "${1:-}" == "--env" ]] && mode="env"
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    local wheels=("$root"/.whl/*.whl)
    if [[ ! -f "${wheels[0]}" ]]; then
        echo "flashinfer_setup: no wheels in $root/.whl (carry .whl)" >&2
        return 1
    fi

    # 1. the wheels
    if [[ "$mode" == "full" || ! -f "$site/flashinfer/__init__.py" || ! -d "$site/tvm_ffi" ]]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
            "${wheels[@]}" || {
            echo "flashinfer_setup: pip install failed" >&2
            return 2
        }
    fi
    case ":${PYTHONPATH:-}:" in
    *":$site:"*) ;;
    *) export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$site" ;;
    esac

    # 2. ninja (FlashInfer runs the `ninja` executable) and nvcc
    if ! command -v ninja >/dev/null 2>&1; then
        local bin
        bin="$(python3 -c 'import ninja; print(ninja.BIN_DIR)' 2>/dev/null)"
        [[ -z "$bin" ]] && bin="$(dirname "$(python3 -c 'import sys; print(sys.executable)')")"
        export PATH="$bin:$PATH"
    fi
    command -v ninja >/dev/null 2>&1 || echo "flashinfer_setup: warning: no ninja on PATH" >&2
    local cuda_home
    if ! cuda_home="$(find_cuda_home)"; then
        echo "flashinfer_setup: found no CUDA toolkit (bin/nvcc + include/cuda_runtime.h)" >&2
        return 3
    fi
    export CUDA_HOME="$cuda_home"

    # 3. FlashInfer's JIT: sm_90a only (CUDA 13 has no sm < 75 targets; FlashInfer asks for none when the list
    # is given), the cache under /tmp, 16 parallel compiles. 9.0a is also what FlashInfer detects on an H200,
    # so the cache directory (.../flashinfer/<version>/90a/) is the same with or without this variable.
    export FLASHINFER_CUDA_ARCH_LIST="9.0a"
    export TORCH_CUDA_ARCH_LIST="9.0"
    export FLASHINFER_WORKSPACE_BASE=/tmp/flashinfer
    export TVM_FFI_CACHE_DIR=/tmp/tvm-ffi-cache
    export MAX_JOBS="${MAX_JOBS:-16}"
    mkdir -p "$FLASHINFER_WORKSPACE_BASE" "$TVM_FFI_CACHE_DIR"
    if ! _fi_link_ok; then
        echo "flashinfer_setup: linking -lcudart -lcuda failed ($(tail -n 1 /tmp/fi_link/probe.err)); trying symlinks"
        _fi_fix_link
        _fi_link_ok || echo "flashinfer_setup: warning: -lcudart -lcuda still do not link: $(cat /tmp/fi_link/probe.err)" >&2
    fi

    echo "flashinfer_setup: ${wheels[*]##*/} -> $site"
    echo "  CUDA_HOME=$CUDA_HOME ($("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release //p'))" \
        "FLASHINFER_CUDA_ARCH_LIST=$FLASHINFER_CUDA_ARCH_LIST MAX_JOBS=$MAX_JOBS"
    echo "  JIT cache under $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer; ninja: $(command -v ninja)" \
        "; FLASHINFER_EXTRA_LDFLAGS=${FLASHINFER_EXTRA_LDFLAGS:-}; PYTHONPATH=$PYTHONPATH"
    [[ "$mode" == "env" ]] && return 0

    # 4. the warm-up: JIT-build the 4 modules and run every case once
    PYTHONUNBUFFERED=1 python3 "$root/tools/flashinfer_warmup.py"
    local rc=$?
    echo "flashinfer_setup: warm-up status $rc, $((SECONDS - began)) s"
    return "$rc"
}

_fi_setup "$@"
_fi_rc=$?
unset -f _fi_setup _fi_link_ok _fi_fix_link
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    exit "$_fi_rc"
fi
return "$_fi_rc"
