# Run on the GPU machine from the repository root (carry [".devrt"], see tools/pack-gpu-runtime.sh); the machine has no
# git, so pass the commit:
#   bash tools/gpu-bench.sh $(git rev-parse --short HEAD) gemm skinny   # some of: gemm skinny norms host moe-decode
# A device call runs 10 minutes at most: gemm (~3 min), skinny (~1) and host (< 3) fit one call; norms (the full sweep
# with torch.compile peers) takes its own; moe-decode (the decode modes and stage configurations:
# benchmarks/moe_decode_sweep.py, ~4 min) too, as do moe-decode-record (moe_bench.py at T 1, 16, 64: issue 34's decode
# record, ~3 min on an H100) and fp8-small (fp8_gemm_bench.py at M 1 and 16: issue 32's M <= 16 bar, ~2 min). moe-single
# (one token in one launch against two, 6 cases, whole calls only, < 1 min), fp8-explore-skinny (every skinny
# configuration of 7 fp8 layers at M 16 beside the half copy, ~3 min); moe-stages (the stage sweeps of fp8 and
# block from 16 tokens, ~1.5 min); moe-one-token (moe_decode_sweep.py --stages
# direct over the fp8 and block cases at one token, Mixtral's too: each stage alone, with and without
# SkinnyConfig.landed, ~3 min) and quantize (quantize_bench.py, per token and tensor, ~2 min) fit one call together;
# blockscale (issue 33's 36 shapes, ~1.5 min on an H100), blockscale-variants (the mainloop's tile variants, ~3 min),
# blockscale-wide-unroll (192-wide tiles with one and two K steps per loop iteration at the four shapes that choose
# them, medians of 3, < 2 min), blockscale-unroll4 (256 x 128 tiles with two and four K steps per loop iteration, and
# four with the tile staged whole, at four shapes from M 4096, DeepGEMM beside where its env is set, ~3 min),
# blockscale-narrow (the chosen tiles against DeepGEMM's at M 64 and 128: 64 x 64, 64 x 32 and 64 x 16, one consumer,
# no split K, up to 16 stages, at the issue's 14 shapes there, DeepGEMM beside where its env is set, ~2.5 min)
# and fp8-prepared (plain vs prepared
# weights' descriptors, < 1 min) too, as do paged-70b (paged_attention_bench.py over Llama-3-70B TP8, pages of 16: issue
# 35's short caches, ~1.5 min on an H100, no FlashInfer) and paged-merge (paged_decode_merge.py: the two merges of split
# contexts, ~1.5 min); fp8-sweep (issue 32's 72 shapes without the bf16 column in two records, *_small and *_large, ~2
# min on an H100); paged-sweep-8b and paged-sweep-70b (issue 35's sweep of one model, pages of 16 and 64, ~3.5 min each
# on an H100, one per call; FlashInfer is a peer where `source tools/flashinfer-env.sh --env` ran first in the same
# command, after `source tools/flashinfer-env.sh` built its modules in an earlier call; join the two records with
# paged_attention_bench.py --merge); paged-ab (benchmarks/paged_decode_ab.py against the kernel of d3d92bc, ~3 min:
# first `git show d3d92bc:packages/flydsl-kernels/src/flydsl/kernels/attention/decode.py > exp/decode_d3d92bc.py` and
# carry exp); paged-split (paged_decode_ab.py over Llama-3-70B TP8's sweep and Llama-3-8B's at B 1 and 8, the shapes
# whose splits a floor changes, with a floor of 32 and 64 KB under each split's K+V bytes against none: what
# api._MIN_SPLIT_BYTES should be, ~3 min; two records, *_70b and *_8b); host-cold (issue 31's launch levels, one call
# taken apart and the cold start without kept plans, FLYDSL_PLAN_CACHE=0, then one profiled first call per op:
# cold_profiles.tgz holds cold_<op>.txt, ~2.5 min; record *_cold); host-ops (the ops table alone, ~1.5 min;
# record *_ops); host-kept (the cold start again with launch plans
# kept on disk, the default, ~1.5 min; record *_kept); host-gradient (the breakdown alone, 15 repeats: softmax's
# recording forward, its backward over a kept graph and the whole, torch's and ours, < 1 min); host-gil
# (benchmarks/autograd_gil_probe.py: whether the GIL on autograd's device thread is the fwd+bwd gap, and the probe's
# node with flydsl's forward plan and backward replay swapped in: where the cycle's extra is, ~1.5 min); host-native
# (the ops table through the C++ node and through the Function, alternated twice: records *_node, *_function,
# *_node_again, *_function_again); host-cycle (benchmarks/host_cycle.py: fwd+bwd against its halves, with
# retain_graph, the GC off and the other order, < 1 min; record *_cycle); host-function (`host`
# with gradients through the Python autograd.Function, FLYDSL_TORCH_NODES=0, record *_function: fits one call with
# `host`); host-node (the ops table and the breakdown with gradients through the C++ node, FLYDSL_TORCH_NODES=1,
# record *_node, ~3 min); host-attributes (`host` with torch's C API off, FLYDSL_TORCH_C_API=0, its record *_attributes: fits one call
# with `host`); paged-token (the per-token scales' f16 P of ac27149 against 690a143's bf16 values over both models'
# sweeps, bf16 beside: first `python tools/decode_variant.py 690a143 exp` and carry exp; ~3 min); blockscale-deepgemm
# (blockscale_gemm_bench.py with DeepGEMM, the named peer, and cuBLAS at 4096x7168x16384 and 512x7168x16384,
# 4096x18432x7168, 8192x7168x2048, also timed as DeepGEMM times itself (--rested), ~1.5 min; record *_deepgemm;
# blockscale-ncu: Nsight Compute's full set of ours and DeepGEMM at the first, with each kernel's stall samples per
# SASS line as CSV, < 1 min). DeepGEMM is built on the machine in two calls, since one call carries at most 64 MiB: first `bash tools/pack-deepgemm.sh` here, then a call
# that carries
# .devrt/rt-mlir.tar.xz, .devrt/wheels, .devrt/activate.sh and .dg/deepgemm-src.tar.xz and runs `source
# tools/deepgemm-env.sh` (unpack, build with the machine's torch and nvcc, smoke check and the JIT kernels of those
# shapes, ~3 min; it imports no flydsl), then, on the same warm machine, one that carries .devrt/rt-llvm.tar.xz (and
# .devrt/wheels) and runs `bash tools/gpu-bench.sh C blockscale-deepgemm`, which sources `tools/deepgemm-env.sh --env`
# itself. `blockscale` (the sweep) times DeepGEMM too where `source tools/deepgemm-env.sh --env` ran before it in the
# same command. One fresh machine in one call: the working tree goes with every call, and with benchmarks/results/
# and docs/ (16 MB, read by nothing on the GPU machine) moved out of it for that call (and back after it, refused
# or not), the tree and all of .devrt (and .dg/deepgemm-src.tar.xz) fit the 64 MiB; later calls on the warm machine
# carry .devrt/wheels and .devrt/activate.sh only. Each run is cut at 5
# minutes. Each benchmark writes its record where benchmarks/results/ keeps it, under $OUT (or ./gpu-logs):
# <folder>/<date>_<commit>.json (gemm/, skinny_gemm/, norms/, host_overhead/, moe_decode_sweep/; copy the folders into
# benchmarks/results/ and rename a run in a word where the commit alone does not say what it was), and its log as
# <name>.txt; the last lines printed are one summary line per benchmark, so a truncated output tail still shows every
# result.
source tools/gpu-env.sh
commit=${1:?usage: bash tools/gpu-bench.sh COMMIT BENCHMARK... (the header lists them)}
shift
logs=${OUT:-gpu-logs}
mkdir -p "$logs"
out() {  # folder [suffix]: the record's path under $logs
  mkdir -p "$logs/$1"
  echo "$logs/$1/$(date +%F)_$commit${2:+_$2}.json"
}
which=${*:-gemm skinny host}
summary=""
run() {  # name, command...
  local name=$1
  shift
  timeout 300 "$@" > "$logs/$name.txt" 2>&1
  summary="$summary\n$name (rc $?): $(tail -1 "$logs/$name.txt")"
}
for bench in $which; do
  case $bench in
    gemm) run gemm python3 benchmarks/gemm_bench.py --sweep --repeats 5 --json "$(out gemm)" --commit "$commit" ;;
    skinny) run skinny python3 benchmarks/skinny_gemm_bench.py --repeats 3 --json "$(out skinny_gemm)" --commit "$commit" ;;
    norms) run norms python3 benchmarks/norms_bench.py --backward --out "$(out norms)" --commit "$commit" ;;
    host) run host python3 benchmarks/host_overhead.py --json "$(out host_overhead)" --commit "$commit" ;;
    host-ops)  # the ops table alone (issue 31's bar: no levels, breakdown, cold start or cycle), ~1.5 min
      run host-ops python3 benchmarks/host_overhead.py --parts ops --json "$(out host_overhead ops)" \
        --commit "$commit" ;;
    host-cold) FLYDSL_PLAN_CACHE=0 run host-cold python3 benchmarks/host_overhead.py --parts levels breakdown cold \
      --cold-profile "$logs/cold_profiles" --json "$(out host_overhead cold)" --commit "$commit"
      # the device tool brings back 8 files at most: the profiles travel as one archive
      tar -czf "$logs/cold_profiles.tgz" -C "$logs" cold_profiles && rm -rf "$logs/cold_profiles" ;;
    host-kept)  # the cold start with launch plans kept on disk (the default), ~1.5 min
      FLYDSL_PLAN_CACHE=1 run host-kept python3 benchmarks/host_overhead.py --parts cold \
        --json "$(out host_overhead kept)" --commit "$commit" ;;
    host-gradient)  # where softmax's fwd+bwd gap is: its parts, torch's and ours (Function and C++ node), < 1 min
      run host-gradient python3 benchmarks/host_overhead.py --parts breakdown --repeats 15 --calls 100 \
        --json "$(out host_overhead gradient)" --commit "$commit" ;;
    host-cycle)  # fwd+bwd against its halves, retained, GC off, other order: ours and torch's, < 1 min
      run host-cycle python3 benchmarks/host_overhead.py --parts cycle --json "$(out host_overhead cycle)" \
        --commit "$commit" ;;
    host-gil)  # softmax fwd+bwd through C++ nodes whose backward runs natively, with the GIL, or in Python, < 1.5 min
      run host-gil python3 benchmarks/autograd_gil_probe.py --json "$(out autograd_gil_probe)" --commit "$commit" ;;
    host-native)  # issue 31's ops through the C++ node (native backwards) and the Function, twice each, ~2 min
      for round in "" again; do
        FLYDSL_TORCH_NODES=1 run host-native-node$round python3 benchmarks/host_overhead.py --parts ops \
          --json "$(out host_overhead "node${round:+_$round}")" --commit "$commit"
        FLYDSL_TORCH_NODES=0 run host-native-function$round python3 benchmarks/host_overhead.py --parts ops \
          --json "$(out host_overhead "function${round:+_$round}")" --commit "$commit"
      done ;;
    host-function)  # issue 31's ops with gradients through the Python Function (FLYDSL_TORCH_NODES=0), beside `host`
      FLYDSL_TORCH_NODES=0 run host-function python3 benchmarks/host_overhead.py \
        --json "$(out host_overhead function)" --commit "$commit" ;;
    host-node)  # issue 31's ops with gradients through the C++ node (FLYDSL_TORCH_NODES=1, built there first), ~3 min
      FLYDSL_TORCH_NODES=1 run host-node python3 benchmarks/host_overhead.py --parts ops breakdown \
        --json "$(out host_overhead node)" --commit "$commit" ;;
    host-attributes)  # issue 31's ops with torch's C API off (FLYDSL_TORCH_C_API=0): what it saves, beside `host`
      FLYDSL_TORCH_C_API=0 run host-attributes python3 benchmarks/host_overhead.py \
        --json "$(out host_overhead attributes)" --commit "$commit" ;;
    moe-decode) run moe-decode python3 benchmarks/moe_decode_sweep.py --json "$(out moe_decode_sweep)" --commit "$commit" ;;
    moe-decode-record) run moe-decode-record python3 benchmarks/moe_bench.py --tokens 1,16,64 --repeats 3 \
      --json "$(out moe)" --commit "$commit" ;;
    fp8-small) run fp8-small python3 benchmarks/fp8_gemm_bench.py --sweep --no-square --m 1 16 --repeats 5 \
      --json "$(out fp8_gemm)" --commit "$commit" ;;
    moe-one-token) run moe-one-token python3 benchmarks/moe_decode_sweep.py --modes direct+combine --stages direct \
      --cases qwen3:1:fp8,dsv3-tp8:1:fp8,qwen3:1:block,dsv3-tp8:1:block,mixtral:1:fp8,mixtral:1:block \
      --json "$(out moe_decode_sweep)" --commit "$commit" ;;
    moe-stages)  # the stage sweeps of the fp8 and block cases from 16 tokens (DeepSeek-V3 TP8's I 256), ~1.5 min
      run moe-stages python3 benchmarks/moe_decode_sweep.py --modes direct+combine \
        --cases qwen3:16:fp8,dsv3-tp8:16:fp8,dsv3-tp8:64:fp8,qwen3:16:block,dsv3-tp8:16:block \
        --json "$(out moe_decode_sweep stages)" --commit "$commit" ;;
    moe-single)  # one token in one launch (FLYDSL_MOE_DECODE's single) against the two launches, outputs compared
      run moe-single python3 benchmarks/moe_decode_sweep.py --modes direct+combine,direct+combine+single --stages none \
        --cases qwen3:1:fp8,dsv3-tp8:1:fp8,qwen3:1:block,dsv3-tp8:1:block,qwen3:1,dsv3-tp8:1 \
        --json "$(out moe_decode_sweep single)" --commit "$commit" ;;
    fp8-explore-skinny)  # every skinny configuration at M 16 next to the half copy, ~3 min
      run fp8-explore-skinny python3 benchmarks/fp8_gemm_bench.py --explore-skinny --sweep --no-square --m 16 \
        --nk 7168x18432 18432x7168 14336x4096 4096x4096 1536x7168 7168x2048 24576x1536 --repeats 2 \
        --json "$(out fp8_gemm explore_skinny)" --commit "$commit" ;;
    quantize) run quantize python3 benchmarks/quantize_bench.py --granularities token,tensor --repeats 3 \
      --json "$(out quantize)" --commit "$commit" ;;
    blockscale) run blockscale python3 benchmarks/blockscale_gemm_bench.py --sweep --repeats 5 \
      --json "$(out blockscale_gemm)" --commit "$commit" ;;
    blockscale-ncu)  # Nsight Compute's full set of ours and DeepGEMM (built in an earlier call) at 4096x7168x16384
      source tools/deepgemm-env.sh --env >/dev/null 2>&1
      run blockscale-ncu ncu --profile-from-start off --clock-control none --set full --import-source no \
        -o "$logs/blockscale_ncu" -f python3 tools/ncu_blockscale_probe.py flydsl deepgemm
      for kernel in gemm_ws_blockscaled sm90_fp8_gemm_1d2d; do  # warp stall samples per SASS line
        ncu --import "$logs/blockscale_ncu.ncu-rep" --kernel-name "regex:$kernel" --page source --csv \
          --print-source sass >"$logs/blockscale_ncu_$kernel.csv" 2>&1
      done ;;
    blockscale-deepgemm)  # DeepGEMM's build from an earlier call: tools/deepgemm-env.sh, the header says how
      if source tools/deepgemm-env.sh --env; then
        run blockscale-deepgemm python3 benchmarks/blockscale_gemm_bench.py --peers cublas_blockwise deepgemm \
          --shapes 4096x7168x16384 512x7168x16384 4096x18432x7168 8192x7168x2048 --repeats 5 --rested \
          --json "$(out blockscale_gemm deepgemm)" --commit "$commit"
      else
        summary="$summary\nblockscale-deepgemm: not run (deepgemm-env.sh --env failed: build DeepGEMM first)"
      fi ;;
    blockscale-variants) run blockscale-variants python3 benchmarks/blockscale_variants.py \
      --variants chosen,128,192 --m 512 4096 8192 --json "$(out blockscale_variants)" --commit "$commit" ;;
    blockscale-wide-unroll) run blockscale-wide-unroll python3 benchmarks/blockscale_variants.py \
      --variants 192,192-unroll --shapes 2048x7168x2048 2048x7168x16384 512x18432x7168 8192x2112x7168 \
      --json "$(out blockscale_variants wide_unroll)" --commit "$commit" ;;
    blockscale-unroll4) run blockscale-unroll4 python3 benchmarks/blockscale_variants.py \
      --variants 256-unroll,256-unroll4,256-staged-unroll4 \
      --shapes 4096x7168x16384 4096x4096x7168 8192x4096x7168 4096x18432x7168 \
      --json "$(out blockscale_variants unroll4)" --commit "$commit" ;;
    blockscale-narrow) run blockscale-narrow python3 benchmarks/blockscale_variants.py \
      --variants chosen,narrow64,narrow32,narrow16 --shapes 64x2112x7168 64x24576x1536 64x32768x512 64x7168x16384 \
      64x4096x7168 64x7168x2048 64x18432x7168 128x2112x7168 128x24576x1536 128x32768x512 128x7168x16384 \
      128x4096x7168 128x7168x2048 128x18432x7168 --json "$(out blockscale_variants narrow)" --commit "$commit" ;;
    fp8-prepared) run fp8-prepared python3 benchmarks/fp8_prepared_descriptor.py \
      --json "$(out fp8_prepared_descriptor)" --commit "$commit" ;;
    fp8-sweep)  # issue 32's record: two processes (each ~1 min on an H100), joined later by fp8_gemm_bench.py --merge
      record=$(out fp8_gemm)
      run fp8-sweep-small python3 benchmarks/fp8_gemm_bench.py --sweep --no-square --m 1 16 64 128 --no-bf16 \
        --repeats 5 --json "${record%.json}_small.json" --commit "$commit"
      run fp8-sweep-large python3 benchmarks/fp8_gemm_bench.py --sweep --m 512 2048 8192 --no-bf16 --repeats 5 \
        --json "${record%.json}_large.json" --commit "$commit" ;;
    paged-sweep-8b | paged-sweep-70b)  # issue 35's record, one model per call, FlashInfer's JIT modules built before
      model=llama3-${bench#paged-sweep-}
      [ "$model" = llama3-70b ] && model=llama3-70b-tp8
      record=$(out paged_attention)
      run "$bench" python3 benchmarks/paged_attention_bench.py --model "$model" --block-sizes 16,64 --repeats 5 \
        --json "${record%.json}_${bench#paged-sweep-}.json" --commit "$commit" ;;
    paged-70b) run paged-70b python3 benchmarks/paged_attention_bench.py --model llama3-70b-tp8 --block-sizes 16 \
      --repeats 3 --json "$(out paged_attention)" --commit "$commit" ;;
    paged-merge) run paged-merge python3 benchmarks/paged_decode_merge.py --json "$(out paged_decode_merge)" \
      --commit "$commit" ;;
    paged-ab) run paged-ab python3 benchmarks/paged_decode_ab.py --variant main=exp/decode_d3d92bc.py@2,4 \
      --json "$(out paged_decode_ab)" --commit "$commit" ;;
    paged-token) run paged-token python3 benchmarks/paged_decode_ab.py --kinds bf16,fp8-token \
      --variant old=exp/decode_690a143.py@2,4 --ctas "" --fills "" --grid llama3-8b,llama3-70b-tp8 \
      --json "$(out paged_decode_ab)" --commit "$commit" ;;
    paged-split)
      record=$(out paged_decode_ab)
      run paged-split-70b python3 benchmarks/paged_decode_ab.py --grid llama3-70b-tp8 --split-bytes 32768,65536 \
        --ctas "" --fills "" --json "${record%.json}_70b.json" --commit "$commit"
      run paged-split-8b python3 benchmarks/paged_decode_ab.py --grid llama3-8b --batches 1,8 \
        --split-bytes 32768,65536 --ctas "" --fills "" --json "${record%.json}_8b.json" --commit "$commit" ;;
    *) summary="$summary\n$bench: unknown (the header lists the benchmarks)" ;;
  esac
done
printf "%b\n" "$summary"
