# Run on the GPU machine from the repository root, after .devrt/ travelled (tools/pack-gpu-runtime.sh; carry
# [".devrt"]):
#   bash tools/gpu-check.sh                      # every test suite (GPU tests included), one log per suite
#   bash tools/gpu-check.sh tests/kernels -k gemm   # pytest arguments instead of the default suites
#   bash tools/gpu-check.sh --sanitize           # the sanitizer scripts (GEMM, wgmma, MoE, attention), memcheck + racecheck
#   bash tools/gpu-check.sh --demo               # the README's main job (tools/demo.py, as tox's demo runs it)
# Logs go to $OUT (the device tool brings them back) or ./gpu-logs; the last lines printed are one summary line per
# suite, so a truncated output tail still shows every result.
source tools/gpu-env.sh
logs=${OUT:-gpu-logs}
mkdir -p "$logs"
status=0
if [ "$1" = "--sanitize" ]; then
  for script in tests.kernels.gemm_sanitize tests.compiler.wgmma_sanitize tests.kernels.moe_sanitize tests.kernels.attention_sanitize; do
    for tool in memcheck racecheck; do
      log="$logs/${script##*.}_$tool.txt"
      timeout 300 compute-sanitizer --tool $tool --error-exitcode 1 python3 -m $script > "$log" 2>&1 || status=$?
      echo "$script $tool: $(grep -c ': ok' "$log") ok, $(tail -1 "$log")"
    done
  done
  exit $status
fi
if [ "$1" = "--demo" ]; then
  timeout 540 python3 tools/demo.py > "$logs/demo.txt" 2>&1 || status=$?
  echo "demo (rc $status): $(tail -1 "$logs/demo.txt")"
  exit $status
fi
if [ $# -gt 0 ]; then
  python3 -m pytest -q -p no:cacheprovider "$@" > "$logs/pytest.txt" 2>&1 || status=$?
  echo "pytest $*: $(tail -1 "$logs/pytest.txt")"
  exit $status
fi
summary=""
for suite in layout compiler kernels torch; do
  python3 -m pytest -q -p no:cacheprovider "tests/$suite" > "$logs/$suite.txt" 2>&1 || status=$?
  summary="$summary\n$suite: $(tail -1 "$logs/$suite.txt")"
done
printf "%b\n" "$summary"
exit $status
