"""Launch plans on the GPU (flydsl.kernels.plans): a signature's later calls reuse its plan and stay right on fresh
inputs; a call that differs in strides, alignment or dtype gets a plan of its own (and the route its facts ask for),
never a wrong one; a call that would fail validation still fails after plans exist. Results against float64 with the
tolerances of test_norms_gpu.py, outputs poisoned."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import flydsl.kernels as zoo  # noqa: E402
from flydsl.kernels.gemm import gemm  # noqa: E402
from flydsl.kernels.gemm import launch as gemm_launch  # noqa: E402
from flydsl.kernels.norms import api as norms_api  # noqa: E402
from flydsl.kernels.softmax import api as softmax_api  # noqa: E402

from .norms_gpu_support import (  # noqa: E402
    check_fused_add_in_place,
    check_layer_norm,
    check_layer_norm_backward,
    check_rms_norm,
    check_rms_norm_backward,
    check_softmax,
    check_softmax_backward,
    make_input,
)

ROWS, N = 64, 1000  # N not a multiple of the vector width: the masked register kernel


def _misaligned(rows, n, dtype):
    """Rows starting one element past a 16-byte boundary (the vectorized paths' condition fails)."""
    flat = torch.randn(rows * n + 1, device="cuda").to(dtype)
    return flat[1:].view(rows, n)


def _variants(dtype):
    """Inputs of four signatures: plain, strided rows, misaligned, the other dtype."""
    other = torch.float32 if dtype != torch.float32 else torch.bfloat16
    return [
        lambda: make_input(ROWS, N, dtype),
        lambda: make_input(ROWS, N, dtype, strided=True),
        lambda: _misaligned(ROWS, N, dtype),
        lambda: make_input(ROWS, N, other),
    ]


def _softmax_in_place(x):
    """x overwritten by its softmax (what softmax_backward's y is), in x's own layout."""
    x.copy_(torch.softmax(x.float(), -1).to(x.dtype))
    return x


def _weights(x):
    return torch.randn(x.shape[1], device="cuda").to(x.dtype), torch.randn(x.shape[1], device="cuda").to(x.dtype)


CASES = {
    "softmax": (lambda x: check_softmax(x), softmax_api._SOFTMAX),
    "softmax_backward": (
        lambda x: check_softmax_backward(make_input(*x.shape, x.dtype), _softmax_in_place(x)),
        softmax_api._SOFTMAX_BACKWARD,
    ),
    "layer_norm": (lambda x: check_layer_norm(x, *_weights(x)), norms_api._LAYER_NORM),
    "rms_norm": (lambda x: check_rms_norm(x, _weights(x)[0]), norms_api._RMS_NORM),
    "fused_add_rms_norm": (lambda x: check_fused_add_in_place(x, _weights(x)[0]), norms_api._FUSED_ADD_RMS_NORM),
    "layer_norm_backward": (
        lambda x: check_layer_norm_backward(make_input(*x.shape, x.dtype), x, *_weights(x)),
        norms_api._LAYER_NORM_BACKWARD,
    ),
    "rms_norm_backward": (
        lambda x: check_rms_norm_backward(make_input(*x.shape, x.dtype), x, _weights(x)[0]),
        norms_api._RMS_NORM_BACKWARD,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", CASES)
def test_each_signature_gets_its_plan_and_reuses_it(name):
    check, store = CASES[name]
    for count, make in enumerate(_variants(torch.bfloat16), start=1):
        for _ in range(3):  # fresh inputs each time: the first call makes the plan, the others run it
            check(make())
        assert len(store) == count, (name, count, store)


def test_a_plan_launches_its_own_route():
    """The misaligned signature's plan takes the route for unaligned rows, not the aligned one's (the looped kernel's
    16-byte accesses would fault or read wrong data on it)."""
    from flydsl.kernels.norms import forward

    aligned = make_input(ROWS, 8192, torch.float32)
    misaligned = _misaligned(ROWS, 8192, torch.float32)
    w = torch.randn(8192, device="cuda")
    for x in (aligned, misaligned, aligned, misaligned):
        check_rms_norm(x, w)
    info = zoo.validation.rows("test", "x", misaligned), zoo.validation.rows("test", "x", aligned)
    routes = [forward.forward_route(norms_api.NormTensors(x=t, out=t, weight=None), rms=True) for t in info]
    assert not zoo.validation.rows_aligned(info[0]) and routes[0] != routes[1]
    assert len(norms_api._RMS_NORM) == 2


def test_validation_still_refuses_after_plans_exist():
    x = make_input(ROWS, N, torch.bfloat16)
    w = torch.randn(N, device="cuda").to(torch.bfloat16)
    zoo.rms_norm(x, w)
    with pytest.raises(TypeError, match="flydsl.kernels.rms_norm: weight: expected dtype"):
        zoo.rms_norm(x, w.to(torch.float16))
    with pytest.raises(ValueError, match="flydsl.kernels.rms_norm: weight: expected shape"):
        zoo.rms_norm(x, w[:-1])
    with pytest.raises(ValueError, match="flydsl.kernels.rms_norm: eps: expected a non-negative number"):
        zoo.rms_norm(x, w, -1.0)
    with pytest.raises(ValueError, match="flydsl.kernels.rms_norm: out: expected 64 rows"):
        zoo.rms_norm(x, w, out=torch.empty(ROWS - 1, N, device="cuda", dtype=torch.bfloat16))
    out, _ = zoo.rms_norm(x, w)  # and the good call still runs its plan
    assert out.shape == x.shape and len(norms_api._RMS_NORM) == 1


@pytest.mark.parametrize("m", [16, 200])  # the skinny kernel (w.t()), the warp-specialized one
def test_gemm_plans_per_signature(m):
    k, n = 512, 384
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    for layout in ("rows", "columns", "rows"):
        for _ in range(2):
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            if layout == "columns":
                a = a.t().contiguous().t()
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            gemm(a, w.t(), out)
            ref = a.double() @ w.double().t()
            assert torch.allclose(out.double(), ref, atol=1e-2 * k**0.5, rtol=1e-2)
    assert len(gemm_launch._GEMM) == 2


# --- replays (flydsl.kernels.plans: a plan that only launches kernels on its arguments is replayed natively) ---------

REPLAYED = ["softmax", "softmax_backward", "layer_norm", "rms_norm"]  # the register kernel at N = 1000


@pytest.mark.parametrize("name", REPLAYED)
def test_a_register_route_is_replayed_and_stays_right(name):
    from flydsl.compiler._native import launcher

    check, store = CASES[name]
    for _ in range(4):  # the first call records; the others replay on fresh inputs and outputs (poisoned)
        check(make_input(ROWS, N, torch.bfloat16))
    (plan,) = store._plans.values()
    assert isinstance(plan, launcher.LaunchPlan) and len(plan) == 1, store.declined


def test_an_in_place_call_keeps_its_python_plan():
    """fused_add_rms_norm writing residual_out into residual: a pointer into two arguments, so no replay (a later call
    with other aliasing would be replayed wrongly otherwise); the Python plan stays right."""
    for _ in range(3):
        check_fused_add_in_place(make_input(ROWS, N, torch.bfloat16), _weights(make_input(ROWS, N, torch.bfloat16))[0])
    (why,) = norms_api._FUSED_ADD_RMS_NORM.declined.values()
    assert "more than one argument" in why


def test_a_replay_launches_on_the_current_stream():
    x = make_input(ROWS, N, torch.bfloat16)
    check_softmax(x)  # recorded on the default stream
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x2 = make_input(ROWS, N, torch.bfloat16)
        out = torch.full_like(x2, float("nan"))
        zoo.softmax(x2, out)  # replayed: must run on `side`, after x2 is written there
    side.synchronize()
    assert torch.allclose(out.float(), torch.softmax(x2.float(), -1), atol=1e-2)


def test_a_replay_is_captured_in_a_cuda_graph():
    x = make_input(ROWS, N, torch.bfloat16)
    out = torch.empty_like(x)
    zoo.softmax(x, out)  # recorded
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        zoo.softmax(x, out)  # a replay, off the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        zoo.softmax(x, out)
    x.copy_(make_input(ROWS, N, torch.bfloat16))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.allclose(out.float(), torch.softmax(x.float(), -1), atol=1e-2)


def test_functional_inference_calls_replay_their_first_calls_launches():
    """flydsl.torch.functional under no_grad: the second call of a signature runs the *_out op's replay directly."""
    pytest.importorskip("flydsl.torch")
    from flydsl.compiler._native import launcher
    from flydsl.torch import functional as F

    w, b = _weights(make_input(ROWS, N, torch.bfloat16))
    weight = torch.randn(N, N, device="cuda", dtype=torch.bfloat16) / N**0.5
    calls = {
        "softmax": (lambda x: F.softmax(x), lambda x: torch.softmax(x.float(), -1), F._SOFTMAX),
        "layer_norm": (
            lambda x: F.layer_norm(x, [N], w, b),
            lambda x: torch.nn.functional.layer_norm(x.float(), [N], w.float(), b.float()),
            F._LAYER_NORM,
        ),
        "rms_norm": (
            lambda x: F.rms_norm(x, [N], w, 1e-6),
            lambda x: torch.nn.functional.rms_norm(x.float(), [N], w.float(), 1e-6),
            F._RMS_NORM,
        ),
        "linear": (  # batch dims kept; the weight read in place (K-major); N = 1000: a dense GEMM with tails
            lambda x: F.linear(x.view(4, ROWS // 4, N), weight, b).view(ROWS, -1),
            lambda x: torch.nn.functional.linear(x.float(), weight.float(), b.float()),
            F._LINEAR,
        ),
    }
    with torch.no_grad():
        for name, (ours, reference, kept) in calls.items():
            for _ in range(3):
                x = make_input(ROWS, N, torch.bfloat16)
                assert torch.allclose(ours(x).float(), reference(x), atol=5e-2, rtol=2e-2), name
            (plan,) = kept._plans.values()
            assert isinstance(plan, launcher.LaunchPlan), (name, kept.declined)


def test_a_dense_gemm_replays_its_tma_descriptors_for_new_addresses():
    """The warp-specialized GEMM (TMA operands): later calls re-encode each descriptor for the new tensors' memory."""
    from flydsl.compiler._native import launcher

    m, k, n = 200, 512, 384
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    for _ in range(4):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        gemm(a, w.t(), out)
        assert torch.allclose(out.double(), a.double() @ w.double().t(), atol=1e-2 * k**0.5, rtol=1e-2)
    (plan,) = gemm_launch._GEMM._plans.values()
    assert isinstance(plan, launcher.LaunchPlan), gemm_launch._GEMM.declined


@pytest.mark.parametrize("granularity", ["token", "group", "tensor"])
def test_quantize_replays_its_kernel_on_fresh_outputs(granularity):
    """quantize_fp8's plans allocate their outputs (and per tensor the zeroed amax) in a scratch function: later calls
    replay the kernels into new outputs."""
    from flydsl.compiler._native import launcher
    from flydsl.kernels.quantize import api as quantize_api

    for _ in range(3):
        x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
        q, scales = quantize_api.quantize_fp8(x, granularity)
        per = scales.repeat_interleave(128, dim=1) if granularity == "group" else scales
        assert torch.allclose(q.float() * per, x.float(), rtol=0.07, atol=1e-3)
    (plan,) = quantize_api._QUANTIZE._plans.values()
    assert isinstance(plan, launcher.LaunchPlan), quantize_api._QUANTIZE.declined


def test_functional_linear_gradients():
    from flydsl.torch import functional as F

    x = torch.randn(3, 40, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(384, 256, device="cuda", dtype=torch.bfloat16) / 16).requires_grad_(True)
    b = torch.randn(384, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(3, 40, 384, device="cuda", dtype=torch.bfloat16)
    ours = torch.autograd.grad(F.linear(x, w, b), (x, w, b), dy)
    theirs = torch.autograd.grad(torch.nn.functional.linear(x.double(), w.double(), b.double()), (x, w, b), dy.double())
    for name, got, want in zip(("dx", "dw", "db"), ours, theirs, strict=True):
        want = want.double()
        assert torch.allclose(got.double(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item()), name


@pytest.mark.parametrize("tokens", [8, 4096])  # align: one CTA; three kernels with per-call counts (8192+ ids)
def test_routing_replays_with_fresh_outputs_and_scratch(tokens):
    from flydsl.compiler._native import launcher
    from flydsl.kernels.moe import api as moe_api
    from flydsl.kernels.moe.reference import align_tokens_reference, topk_route_reference

    experts, top_k, block_m = 64, 4, 64
    for _ in range(3):
        logits = torch.randn(tokens, experts, device="cuda", dtype=torch.bfloat16)
        weights, ids = moe_api.topk_route(logits, top_k)
        want_weights, want_ids = topk_route_reference(logits, top_k)
        assert torch.equal(ids, want_ids) and torch.allclose(weights, want_weights, rtol=1e-5, atol=1e-6)
        got = moe_api.align_tokens(ids, experts, block_m)
        want = align_tokens_reference(ids, experts, block_m)
        for name, g, w in zip(("sorted_ids", "expert_of_block", "padded_count"), got, want, strict=True):
            assert torch.equal(g.cpu(), w.cpu()), name
    for store in (moe_api._TOPK, moe_api._ALIGN):
        (plan,) = store._plans.values()
        assert isinstance(plan, launcher.LaunchPlan), store.declined


@pytest.mark.parametrize("quant", [None, "channel", "tensor"])
def test_fused_moe_at_decode_size_replays_over_fresh_buffers(quant):
    """fused_moe's decode path keeps every buffer in its plan's scratch function: later calls replay align, the
    quantizations, both grouped skinny GEMMs and the combine natively, on fresh inputs, right each time."""
    from flydsl.compiler._native import launcher
    from flydsl.kernels.moe import api as moe_api
    from flydsl.kernels.moe import experts as moe_experts
    from flydsl.kernels.moe.reference import dequantize_experts, fused_moe_reference
    from flydsl.kernels.quantize import api as quantize_api

    tokens, hidden, experts, inter, top_k = 4, 256, 8, 128, 2
    w1 = torch.randn(experts, 2 * inter, hidden, device="cuda", dtype=torch.bfloat16) / hidden**0.5
    w2 = torch.randn(experts, hidden, inter, device="cuda", dtype=torch.bfloat16) / inter**0.5
    options, ref_w1, ref_w2 = {}, w1, w2
    if quant is not None:
        granularity = "token" if quant == "channel" else "tensor"
        quantized = []
        for w in (w1, w2):
            e, rows, k = w.shape
            if quant == "channel":
                w8, scale = quantize_api.quantize_fp8(w.reshape(e * rows, k), "token")
                w8, scale = w8.view(e, rows, k), scale.view(e, rows)
            else:
                pairs = [quantize_api.quantize_fp8(w[i], granularity) for i in range(e)]
                w8, scale = torch.stack([p[0] for p in pairs]), torch.stack([p[1].reshape(()) for p in pairs])
            quantized.append((w8, scale, dequantize_experts(w8, scale, quant)))
        (w1, s1, ref_w1), (w2, s2, ref_w2) = quantized
        options = dict(quant="fp8", granularity=quant, w1_scale=s1, w2_scale=s2)
    for _ in range(3):
        x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
        weights, ids = moe_api.topk_route(torch.randn(tokens, experts, device="cuda"), top_k)
        out = moe_experts.fused_moe(x, w1, w2, weights, ids, **options)
        want = fused_moe_reference(x, ref_w1, ref_w2, weights, ids)
        assert torch.allclose(out.float(), want, rtol=0.1, atol=0.1 * want.abs().max().item()), quant
    (plan,) = moe_experts._FUSED._plans.values()
    assert isinstance(plan, launcher.LaunchPlan), moe_experts._FUSED.declined


@pytest.mark.parametrize("context", [40, 3000])  # one CTA per head; flash-decoding splits with per-call partials
def test_paged_decode_replays_with_fresh_partials(context):
    from flydsl.compiler._native import launcher
    from flydsl.kernels.attention import api as attention_api
    from flydsl.kernels.attention.reference import paged_decode_reference

    batch, heads, kv_heads, dim, block = 2, 8, 2, 128, 16
    blocks = -(-context // block)
    k_cache = torch.randn(batch * blocks, block, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    tables = torch.randperm(batch * blocks, device="cuda", dtype=torch.int32).view(batch, blocks)
    lens = torch.full((batch,), context, device="cuda", dtype=torch.int32)
    for _ in range(3):
        q = torch.randn(batch, heads, dim, device="cuda", dtype=torch.bfloat16)
        out = attention_api.paged_decode(q, k_cache, v_cache, tables, lens)
        want = paged_decode_reference(q, k_cache, v_cache, tables, lens)
        assert torch.allclose(out.float(), want, rtol=2e-2, atol=2e-2)
    (plan,) = attention_api._PLANS._plans.values()
    assert isinstance(plan, launcher.LaunchPlan), attention_api._PLANS.declined


@pytest.mark.parametrize("n", [32768, 131072])  # staged: a claimed-rows counter per stream; clusters of 4
def test_staged_routes_replay_with_their_exchange_made_per_call(n):
    from flydsl.compiler._native import launcher

    for _ in range(3):
        check_softmax(make_input(16, n, torch.bfloat16))
    (plan,) = softmax_api._SOFTMAX._plans.values()
    assert isinstance(plan, launcher.LaunchPlan), softmax_api._SOFTMAX.declined


def test_norm_backward_replays_with_fresh_partial_sums():
    """rms_norm_backward with a weight: per-CTA partial column sums made per call, then the column-sum kernel."""
    from flydsl.compiler._native import launcher

    for _ in range(3):
        x = make_input(ROWS, 8192, torch.bfloat16)
        check_rms_norm_backward(make_input(ROWS, 8192, torch.bfloat16), x, _weights(x)[0])
    (plan,) = norms_api._RMS_NORM_BACKWARD._plans.values()
    assert isinstance(plan, launcher.LaunchPlan) and len(plan) == 2, norms_api._RMS_NORM_BACKWARD.declined


def test_a_split_k_gemm_replays_over_its_streams_workspace():
    """64 x 4096 x 4096 splits K in two (the stream's workspace and flags, from the scratch function on each call):
    replayed on fresh inputs, and on another stream with that stream's workspace."""
    from flydsl.compiler._native import launcher

    m, k, n = 64, 4096, 4096
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5

    def check(a):
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        gemm(a, w.t(), out)
        return out

    for _ in range(3):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        assert torch.allclose(check(a).double(), a.double() @ w.double().t(), atol=2e-2, rtol=2e-2)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        out = check(a)
    side.synchronize()
    assert torch.allclose(out.double(), a.double() @ w.double().t(), atol=2e-2, rtol=2e-2)
    (plan,) = gemm_launch._GEMM._plans.values()
    assert isinstance(plan, launcher.LaunchPlan), gemm_launch._GEMM.declined


_KEPT_PLAN_CALL = """
import json, sys, torch
import flydsl.torch.functional as F
torch.manual_seed(0)
x = torch.randn(64, 1000, device="cuda", dtype=torch.bfloat16)
y = F.softmax(x)
torch.cuda.synchronize()
error = (y.float() - torch.softmax(x.float(), -1)).abs().max().item()
print(json.dumps({"error": error, "imported": sorted(m for m in sys.modules if m in (
    "flydsl.kernels.softmax.kernels", "flydsl.compiler.kernel", "flydsl.expr"))}))
"""


def test_a_plan_kept_on_disk_replays_in_a_new_process(tmp_path):
    """FLYDSL_PLAN_CACHE=1: a first process routes softmax, records its plan and keeps it beside the kernel; a new
    process's first call replays the kept plan (it never imports the softmax kernels, the tracer or the DSL) and is
    as right as the first."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, FLYDSL_PLAN_CACHE="1", FLYDSL_CACHE_DIR=str(tmp_path))

    def run():
        done = subprocess.run([sys.executable, "-c", _KEPT_PLAN_CALL], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    first, second = run(), run()
    assert first["error"] < 1e-2 and "flydsl.kernels.softmax.kernels" in first["imported"], first
    assert second["error"] < 1e-2 and second["imported"] == [], second


@pytest.mark.parametrize("op", ["linear", "fused_moe", "paged_decode"])
def test_a_torch_op_over_plans_that_make_memory_replays_whole(op):
    """flydsl.torch.functional's inference calls over entry points whose plans make memory (a linear whose GEMM
    splits K: the workspace and flags held per stream; fused_moe's decode buffers; paged_decode's split partials and
    merge counters): from the second call on, the
    functional's own plan replays every launch with that memory made by the replay (recorded again on the second
    call, when the inner plans replay natively), right on fresh inputs and on another stream."""
    pytest.importorskip("flydsl.torch")
    from flydsl.compiler._native import launcher
    from flydsl.kernels.attention.reference import paged_decode_reference
    from flydsl.kernels.moe import api as moe_api
    from flydsl.kernels.moe.reference import fused_moe_reference
    from flydsl.torch import attention as torch_attention
    from flydsl.torch import functional as F
    from flydsl.torch import moe as torch_moe

    if op == "linear":  # 64 x 4096 x 4096 splits K in two
        weight = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) / 64
        inputs = lambda: (torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16),)  # noqa: E731
        ours = lambda x: F.linear(x, weight)  # noqa: E731
        want = lambda x: x.double() @ weight.double().t()  # noqa: E731
        store = F._LINEAR
    elif op == "paged_decode":  # 3000 tokens: split, merged by the last split
        batch, heads, kv_heads, dim, block, context = 2, 8, 2, 128, 16, 3000
        blocks = -(-context // block)
        k_cache = torch.randn(batch * blocks, block, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
        v_cache = torch.randn_like(k_cache)
        tables = torch.randperm(batch * blocks, device="cuda", dtype=torch.int32).view(batch, blocks)
        lens = torch.full((batch,), context, device="cuda", dtype=torch.int32)
        inputs = lambda: (torch.randn(batch, heads, dim, device="cuda", dtype=torch.bfloat16),)  # noqa: E731
        ours = lambda q: F.paged_decode(q, k_cache, v_cache, tables, lens)  # noqa: E731
        want = lambda q: paged_decode_reference(q, k_cache, v_cache, tables, lens).double()  # noqa: E731
        store = torch_attention.paged_decode._runs
    else:
        tokens, hidden, experts, inter, top_k = 4, 256, 8, 128, 2
        w1 = torch.randn(experts, 2 * inter, hidden, device="cuda", dtype=torch.bfloat16) / hidden**0.5
        w2 = torch.randn(experts, hidden, inter, device="cuda", dtype=torch.bfloat16) / inter**0.5
        routing = lambda: moe_api.topk_route(torch.randn(tokens, experts, device="cuda"), top_k)  # noqa: E731
        inputs = lambda: (torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16), *routing())  # noqa: E731
        ours = lambda x, weights, ids: F.fused_moe(x, w1, w2, weights, ids)  # noqa: E731
        want = lambda x, weights, ids: fused_moe_reference(x, w1, w2, weights, ids).double()  # noqa: E731
        store = torch_moe.fused_moe._runs

    def check():
        args = inputs()
        got, expected = ours(*args).double(), want(*args)
        assert torch.allclose(got, expected, rtol=0.05, atol=0.05 * expected.abs().max().item()), op

    with torch.no_grad():
        for _ in range(3):
            check()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            check()
        side.synchronize()
    (plan,) = store._plans.values()
    assert isinstance(plan, launcher.LaunchPlan), store.declined
    assert plan._to_bytes() is not None  # no Python scratch: kept on disk too
