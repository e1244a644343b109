# Sourced by tools/flashinfer-env.sh and tools/deepgemm-env.sh on the GPU machine: find_cuda_home prints the CUDA
# toolkit's folder (one with bin/nvcc and include/cuda_runtime.h), or returns 1 where there is none. nvcc on PATH can
# be a wrapper script (/usr/local/bin/nvcc that execs /usr/local/cuda-13.0/bin/nvcc), so nvcc itself is asked where
# it lives.
find_cuda_home() {
    local c here
    here="$(nvcc -dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ _HERE_=//p' | head -n 1)"
    for c in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda "${here:+$here/..}" /usr/local/cuda-13*; do
        if [[ -n "$c" && -x "$c/bin/nvcc" && -f "$c/include/cuda_runtime.h" ]]; then
            (cd "$c" && pwd -P)
            return 0
        fi
    done
    return 1
}
