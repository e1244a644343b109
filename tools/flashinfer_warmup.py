"""FlashInfer warm-up on the GPU machine: JIT-build and run BatchDecodeWithPagedKVCacheWrapper once for each case
benchmarks/paged_attention_bench.py times, so that later calls on the same warm machine find the modules built.

Run through tools/flashinfer-env.sh (it installs the carried wheels and sets PYTHONPATH, CUDA_HOME,
FLASHINFER_CUDA_ARCH_LIST, FLASHINFER_WORKSPACE_BASE, MAX_JOBS ...).

Cases: (Hq 32, Hkv 8, D 128) and (Hq 8, Hkv 1, D 128); pages of 16 and 64 tokens; q bf16; KV bf16 and
float8_e4m3fn (one float k_scale / v_scale per tensor); use_tensor_cores False and True (the bench's "auto" takes
False for group 4 and True for group 8; the other two cost no extra build: FlashInfer's JIT modules are keyed by
dtypes and head dim only). 4 modules in all: decode bf16/bf16, decode bf16/e4m3, fa2 prefill bf16/bf16 and fa2
prefill bf16/e4m3 (the tensor-core decode). The first case of each module shows its JIT time in plan_s. Each case
is checked against a float32 reference (relative Frobenius error). Failures print their traceback and the loop
goes on; the exit status is the number of failed cases (0: all ran and matched).
"""

from __future__ import annotations

import os
import sys
import time
import traceback

MODELS = (("llama3-8b", 32, 8, 128), ("llama3-70b-tp8", 8, 1, 128))
PAGE_SIZES = (16, 64)
KV_KINDS = ("bf16", "fp8")
CONTEXTS = (1, 17, 300, 1100)  # ragged: partial last pages, a single token, a few pages
WORKSPACE_BYTES = 256 << 20  # as benchmarks/paged_attention_bench.py
FP8_MAX = 448.0
TOLERANCE = 2e-2


def _say(*args):
    print(*args, flush=True)


def make_case(torch, hq, hkv, d, page_size, kv, seed):
    """(q, (k, v), scales, indptr, indices, last_page_len, reference) for a small ragged batch."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    lens = torch.tensor(CONTEXTS, dtype=torch.int64)
    pages_per_seq = (lens + page_size - 1) // page_size
    total_pages = int(pages_per_seq.sum())
    num_pages = total_pages + 3  # a few pages nobody uses
    perm = torch.randperm(num_pages, generator=gen, device="cuda")[:total_pages].to(torch.int32)
    indptr = torch.zeros(len(CONTEXTS) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(pages_per_seq, 0)
    last_page_len = (lens - (pages_per_seq - 1) * page_size).to(torch.int32)
    shape = (num_pages, page_size, hkv, d)
    k = torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(len(CONTEXTS), hq, d, generator=gen, device="cuda", dtype=torch.bfloat16)
    scales = {}
    k_ref, v_ref = k.float(), v.float()
    if kv == "fp8":
        k_scale = float(k.float().abs().amax()) / FP8_MAX
        v_scale = float(v.float().abs().amax()) / FP8_MAX
        k = (k.float() / k_scale).to(torch.float8_e4m3fn)
        v = (v.float() / v_scale).to(torch.float8_e4m3fn)
        k_ref, v_ref = k.float() * k_scale, v.float() * v_scale
        scales = {"k_scale": k_scale, "v_scale": v_scale}
    group = hq // hkv
    outs = []
    for b, n in enumerate(CONTEXTS):
        pages = perm[int(indptr[b]) : int(indptr[b + 1])].long()
        kb = k_ref[pages].reshape(-1, hkv, d)[:n].repeat_interleave(group, dim=1)  # (n, hq, d)
        vb = v_ref[pages].reshape(-1, hkv, d)[:n].repeat_interleave(group, dim=1)
        s = torch.einsum("hd,nhd->hn", q[b].float(), kb) / d**0.5
        outs.append(torch.einsum("hn,nhd->hd", s.softmax(-1), vb))
    reference = torch.stack(outs)
    return q, (k, v), scales, indptr.cuda(), perm, last_page_len.cuda(), reference


def run_case(torch, flashinfer, workspace, model, hq, hkv, d, page_size, kv, tensor_cores, seed):
    q, kv_cache, scales, indptr, indices, last_page_len, reference = make_case(torch, hq, hkv, d, page_size, kv, seed)
    kv_dtype = torch.bfloat16 if kv == "bf16" else torch.float8_e4m3fn
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=tensor_cores)
    began = time.perf_counter()
    wrapper.plan(
        indptr,
        indices,
        last_page_len,
        hq,
        hkv,
        d,
        page_size,
        q_data_type=torch.bfloat16,
        kv_data_type=kv_dtype,
    )
    torch.cuda.synchronize()
    plan_s = time.perf_counter() - began
    out = torch.empty_like(q)
    began = time.perf_counter()
    result = wrapper.run(q, kv_cache, out=out, **scales)
    torch.cuda.synchronize()
    run_s = time.perf_counter() - began
    began = time.perf_counter()
    for _ in range(10):
        wrapper.run(q, kv_cache, out=out, **scales)
    torch.cuda.synchronize()
    again_us = (time.perf_counter() - began) / 10 * 1e6
    err = float((result.float() - reference).norm() / reference.norm())
    return plan_s, run_s, again_us, err


def main() -> int:
    began = time.perf_counter()
    import torch

    _say(f"python {sys.version.split()[0]} torch {torch.__version__} (CUDA {torch.version.cuda})")
    _say(
        "torch.Tensor has __dlpack_c_exchange_api__:",
        hasattr(torch.Tensor, "__dlpack_c_exchange_api__"),
        "/ __c_dlpack_exchange_api__:",
        hasattr(torch.Tensor, "__c_dlpack_exchange_api__"),
    )
    for name in (
        "CUDA_HOME",
        "FLASHINFER_CUDA_ARCH_LIST",
        "TORCH_CUDA_ARCH_LIST",
        "FLASHINFER_WORKSPACE_BASE",
        "FLASHINFER_EXTRA_LDFLAGS",
        "TVM_FFI_CACHE_DIR",
        "MAX_JOBS",
    ):
        _say(f"  {name}={os.environ.get(name, '(unset)')}")
    if not torch.cuda.is_available():
        _say("FAILED: torch sees no GPU")
        return 99
    _say("GPU:", torch.cuda.get_device_name(), torch.cuda.get_device_capability())
    t = time.perf_counter()
    try:
        import flashinfer
    except Exception:  # noqa: BLE001 (reported; nothing else can run)
        _say("FAILED: import flashinfer")
        traceback.print_exc()
        sys.stdout.flush()
        return 98
    import_s = time.perf_counter() - t
    try:
        import tvm_ffi

        tvm_version = getattr(tvm_ffi, "__version__", "?")
    except Exception as error:  # noqa: BLE001
        tvm_version = f"(import failed: {error})"
    _say(f"flashinfer {flashinfer.__version__} from {os.path.dirname(flashinfer.__file__)}; tvm_ffi {tvm_version}")
    _say(f"import flashinfer took {import_s:.1f} s")
    try:
        from flashinfer.jit import env as jit_env

        _say("JIT cache:", jit_env.FLASHINFER_JIT_DIR)
    except Exception as error:  # noqa: BLE001
        _say("JIT cache: (unknown)", error)

    workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    # The cases the bench's "auto" picks (group 4: CUDA cores, group 8: tensor cores) first, then the other two.
    order = []
    for kv in KV_KINDS:
        for model, hq, hkv, d in MODELS:
            auto = hq // hkv > 4
            for tensor_cores in (auto, not auto):
                for page_size in PAGE_SIZES:
                    order.append((kv, tensor_cores, model, hq, hkv, d, page_size))
    order.sort(key=lambda c: (c[0], c[1] != (c[3] // c[4] > 4)))  # kv, then the "auto" cases first (stable)
    failed, modules_seen = 0, {}
    _say(f"{'kv':<5}{'tc':<6}{'model':<16}{'bs':>4}{'plan_s':>9}{'run_s':>8}{'again_us':>10}{'rel_err':>10}  note")
    for index, (kv, tensor_cores, model, hq, hkv, d, page_size) in enumerate(order):
        module = ("prefill-fa2" if tensor_cores else "decode") + f"/{kv}"
        first = modules_seen.get(module) is None  # no successful plan() of this module yet
        try:
            plan_s, run_s, again_us, err = run_case(
                torch, flashinfer, workspace, model, hq, hkv, d, page_size, kv, tensor_cores, seed=index
            )
        except Exception:  # noqa: BLE001 (reported; the loop goes on)
            failed += 1
            modules_seen.setdefault(module, None)
            _say(f"{kv:<5}{str(tensor_cores):<6}{model:<16}{page_size:>4}  FAILED ({module})")
            traceback.print_exc()
            sys.stdout.flush()
            continue
        if first:
            modules_seen[module] = plan_s
        ok = err <= TOLERANCE
        failed += not ok
        note = (f"JIT {module}" if first else "") + ("" if ok else f"  MISMATCH > {TOLERANCE}")
        _say(
            f"{kv:<5}{str(tensor_cores):<6}{model:<16}{page_size:>4}{plan_s:>9.2f}{run_s:>8.3f}{again_us:>10.1f}"
            f"{err:>10.2e}  {note}"
        )
    _say("JIT (first plan() of each module, build + load):")
    for module, seconds in modules_seen.items():
        _say(f"  {module:<18} " + ("FAILED" if seconds is None else f"{seconds:.1f} s"))
    _say(f"{len(order) - failed}/{len(order)} cases ran and matched; {time.perf_counter() - began:.1f} s in all")
    return failed


if __name__ == "__main__":
    sys.exit(main())
