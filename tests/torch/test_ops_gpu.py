"""torch.ops.flydsl.* on the GPU: values and gradients against float64 torch references, eager and compiled
(torch.compile(fullgraph=True), inductor), opcheck of every op, the nn modules against torch's, odd shapes and
strided inputs.

Tolerances: outputs compare elementwise (rtol = atol = TOL[dtype], about the output's rounding); gradients compare
by their largest error against TOL_GRAD[dtype] x max(1, max |reference|), since sums over rows grow with the rows.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import flydsl.torch as ft  # noqa: E402

pytestmark = pytest.mark.gpu

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TOL = {torch.float32: 5e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
TOL_GRAD = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 2e-2}
SHAPES = [(4, 1), (3, 1000), (2, 5, 4097), (2, 65536)]
RMS_EPS = torch.finfo(torch.float32).eps  # what eps=None means, for float32, float16 and bfloat16 alike


def _rand(*shape, dtype, scale=1.0, requires_grad=False):
    t = (torch.randn(*shape, dtype=torch.float32, device="cuda") * scale).to(dtype)
    return t.requires_grad_(requires_grad)


def _f64(t):
    return None if t is None else t.detach().double().requires_grad_(t.requires_grad)


def _check(actual, expected, dtype):
    torch.testing.assert_close(actual.detach().double(), expected.detach(), rtol=TOL[dtype], atol=TOL[dtype])


def _check_grad(actual, expected, dtype, what):
    assert actual is not None, what
    assert actual.dtype != torch.float64 and actual.shape == expected.shape, what
    err = (actual.double() - expected).abs().max().item()
    bound = TOL_GRAD[dtype] * max(1.0, expected.abs().max().item())
    assert err <= bound, f"{what}: max error {err:.3g} > {bound:.3g}"


# --- forward and backward against float64 references ---------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_softmax(shape, dtype):
    torch.manual_seed(0)
    x = _rand(*shape, dtype=dtype, scale=3.0, requires_grad=True)
    y = ft.softmax(x)
    x64 = _f64(x)
    y64 = torch.softmax(x64, -1)
    _check(y, y64, dtype)
    torch.testing.assert_close(y.double().sum(-1), torch.ones_like(y64[..., 0]), rtol=0, atol=TOL[dtype] * 4)
    dy = _rand(*shape, dtype=dtype)
    y.backward(dy)
    y64.backward(dy.double())
    _check_grad(x.grad, x64.grad, dtype, "dx")


# Every affine variant on one shape, the full affine on every shape (each variant is its own kernel to compile).
LN_CASES = [(shape, "weight+bias") for shape in SHAPES] + [((3, 1000), a) for a in ("weight", "bias", "none")]


@pytest.mark.parametrize("shape, affine", LN_CASES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_layer_norm(shape, dtype, affine):
    torch.manual_seed(1)
    n = shape[-1]
    x = _rand(*shape, dtype=dtype, scale=2.0, requires_grad=True)
    x.data += 0.5  # a mean away from zero
    w = _rand(n, dtype=dtype, requires_grad=True) if "weight" in affine else None
    b = _rand(n, dtype=dtype, requires_grad=True) if "bias" in affine else None
    out = ft.layer_norm(x, n, w, b, 1e-5)
    x64, w64, b64 = _f64(x), _f64(w), _f64(b)
    out64 = F.layer_norm(x64, (n,), w64, b64, 1e-5)
    _check(out, out64, dtype)
    dy = _rand(*shape, dtype=dtype)
    out.backward(dy)
    out64.backward(dy.double())
    for name, ours, ref in (("dx", x, x64), ("dweight", w, w64), ("dbias", b, b64)):
        if ours is not None:
            _check_grad(ours.grad, ref.grad, dtype, name)


@pytest.mark.parametrize("shape, weight", [(shape, True) for shape in SHAPES] + [((3, 1000), False)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm(shape, dtype, weight):
    torch.manual_seed(2)
    n = shape[-1]
    x = _rand(*shape, dtype=dtype, scale=2.0, requires_grad=True)
    w = _rand(n, dtype=dtype, requires_grad=True) if weight else None
    out = ft.rms_norm(x, [n], w)
    x64, w64 = _f64(x), _f64(w)
    out64 = F.rms_norm(x64, (n,), w64, RMS_EPS)
    _check(out, out64, dtype)
    dy = _rand(*shape, dtype=dtype)
    out.backward(dy)
    out64.backward(dy.double())
    _check_grad(x.grad, x64.grad, dtype, "dx")
    if weight:
        _check_grad(w.grad, w64.grad, dtype, "dweight")


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_add_rms_norm(shape, dtype):
    torch.manual_seed(3)
    n = shape[-1]
    x = _rand(*shape, dtype=dtype, requires_grad=True)
    r = _rand(*shape, dtype=dtype, requires_grad=True)
    w = _rand(n, dtype=torch.float32, requires_grad=True)  # float32 weights beside any input dtype
    out, residual_out = ft.fused_add_rms_norm(x, r, n, w, 1e-6)
    summed = (x.double() + r.double()).to(dtype)  # the sum is rounded to the input dtype
    torch.testing.assert_close(residual_out, summed, rtol=0, atol=0)
    x64, r64, w64 = _f64(x), _f64(r), _f64(w)
    s64 = x64 + r64
    out64 = F.rms_norm(s64, (n,), w64, 1e-6)
    torch.testing.assert_close(
        out.double(), F.rms_norm(summed.double(), (n,), w.double(), 1e-6), rtol=TOL[dtype], atol=TOL[dtype]
    )
    dy, dres = _rand(*shape, dtype=dtype), _rand(*shape, dtype=dtype)
    torch.autograd.backward([out, residual_out], [dy, dres])
    torch.autograd.backward([out64, s64], [dy.double(), dres.double()])
    _check_grad(x.grad, x64.grad, dtype, "dx")
    _check_grad(r.grad, r64.grad, dtype, "dresidual")
    _check_grad(w.grad, w64.grad, dtype, "dweight")


# --- layouts, out variants, edge cases -------------------------------------------------------------------------------


def test_strided_and_transposed_inputs():
    torch.manual_seed(4)
    base = _rand(6, 40, 130, dtype=torch.bfloat16)
    sliced = base[:, :, :128]  # rows 130 apart: read in place
    torch.testing.assert_close(ft.layer_norm(sliced, 128), F.layer_norm(sliced, (128,)), rtol=1e-2, atol=1e-2)
    transposed = base.transpose(0, 1)  # leading dims permuted
    torch.testing.assert_close(ft.rms_norm(transposed, 130), F.rms_norm(transposed, (130,)), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(ft.softmax(base, dim=1), torch.softmax(base, dim=1), rtol=1e-2, atol=1e-3)
    x = _rand(8, 64, dtype=torch.float32, requires_grad=True)
    ft.softmax(x).sum().backward()  # an expanded (stride 0) gradient
    torch.testing.assert_close(x.grad, torch.zeros_like(x), rtol=0, atol=1e-6)


def test_out_ops_and_in_place_residual():
    torch.manual_seed(5)
    x, r = _rand(33, 2048, dtype=torch.bfloat16), _rand(33, 2048, dtype=torch.bfloat16)
    w = _rand(2048, dtype=torch.bfloat16)
    expected_sum = x + r
    out = torch.full_like(x, float("nan"))
    rstd = torch.full((33,), float("nan"), device="cuda")
    residual = r.clone()
    torch.ops.flydsl.fused_add_rms_norm_out(x, residual, [2048], w, 1e-6, out, residual, rstd)  # as vLLM does
    torch.testing.assert_close(residual, expected_sum, rtol=0, atol=0)
    ref = F.rms_norm(expected_sum.float(), (2048,), w.float(), 1e-6)
    torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(rstd, expected_sum.float().square().mean(-1).add(1e-6).rsqrt(), rtol=1e-5, atol=0)
    out = torch.full_like(x, float("nan"))
    version = out._version
    torch.ops.flydsl.layer_norm_out(x, [2048], w, None, 1e-5, out, None, None)  # no statistics written
    torch.testing.assert_close(out, F.layer_norm(x, (2048,), w), rtol=1e-2, atol=1e-2)
    assert out._version > version  # written in place, as autograd's saved-tensor checks need to know
    with pytest.raises(RuntimeError, match="flydsl.layer_norm_out: an input requires grad"):
        torch.ops.flydsl.layer_norm_out(x, [2048], w.clone().requires_grad_(), None, 1e-5, out, None, None)
    with torch.inference_mode():  # inference tensors have no version counter to bump
        torch.ops.flydsl.softmax_out(x.clone(), torch.empty_like(x))


def test_empty_inputs():
    x = torch.empty(0, 16, device="cuda", requires_grad=True)
    w = torch.ones(16, device="cuda", requires_grad=True)
    ft.layer_norm(x, 16, w, w).sum().backward()
    assert x.grad.shape == (0, 16) and torch.equal(w.grad, torch.zeros(16, device="cuda"))
    assert ft.softmax(torch.empty(3, 0, device="cuda")).shape == (3, 0)


def test_opcheck_every_op():
    torch.manual_seed(6)
    x = _rand(4, 3, 96, dtype=torch.bfloat16, requires_grad=True)
    w = _rand(96, dtype=torch.float32, requires_grad=True)
    b = _rand(96, dtype=torch.float32, requires_grad=True)
    dy = _rand(4, 3, 96, dtype=torch.bfloat16)
    y = torch.ops.flydsl.softmax(x).detach()
    _, mean, rstd = torch.ops.flydsl.layer_norm(x, [96], w, b, 1e-5)
    _, rms_rstd = torch.ops.flydsl.rms_norm(x, [96], w, None)
    cases = [
        (torch.ops.flydsl.softmax, (x,)),
        (torch.ops.flydsl.softmax_backward, (dy, y)),
        (torch.ops.flydsl.layer_norm, (x, [96], w, b, 1e-5)),
        (torch.ops.flydsl.layer_norm_backward, (dy, x.detach(), [96], w.detach(), mean.detach(), rstd.detach())),
        (torch.ops.flydsl.rms_norm, (x, [96], w, None)),
        (torch.ops.flydsl.rms_norm_backward, (dy, x.detach(), [96], w.detach(), rms_rstd.detach())),
        (torch.ops.flydsl.fused_add_rms_norm, (x, dy, [96], w, 1e-6)),
        (torch.ops.flydsl.softmax_out, (x.detach(), torch.empty_like(dy))),
        (
            torch.ops.flydsl.layer_norm_out,
            (x.detach(), [96], w.detach(), b.detach(), 1e-5, torch.empty_like(dy), torch.empty_like(mean), None),
        ),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)


# --- torch.compile ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_compiled_block_matches_eager(dtype):
    torch._dynamo.reset()
    torch.manual_seed(7)
    ln = ft.nn.LayerNorm(1000, device="cuda", dtype=dtype)
    rms = ft.nn.RMSNorm(1000, device="cuda", dtype=dtype)

    def block(x, r):
        h = ln(x) * 2
        h, r = rms(h, r)
        return ft.softmax(h, dim=-1), r

    compiled = torch.compile(block, fullgraph=True)
    results = []
    for fn in (block, compiled):
        x = _rand(3, 7, 1000, dtype=dtype, requires_grad=True)
        r = _rand(3, 7, 1000, dtype=dtype, requires_grad=True)
        torch.manual_seed(8)
        x.data.copy_(_rand(3, 7, 1000, dtype=dtype))
        r.data.copy_(_rand(3, 7, 1000, dtype=dtype))
        for p in (*ln.parameters(), *rms.parameters()):
            p.grad = None
        y, r_out = fn(x, r)
        dy, dr = _rand(*y.shape, dtype=dtype), _rand(*y.shape, dtype=dtype)
        torch.autograd.backward([y, r_out], [dy, dr])
        results.append([y, r_out, x.grad, r.grad, ln.weight.grad, ln.bias.grad, rms.weight.grad])
    for name, eager, comp in zip(("y", "r", "dx", "dr", "dln_w", "dln_b", "drms_w"), *results, strict=True):
        torch.testing.assert_close(comp, eager, rtol=TOL[dtype], atol=TOL[dtype], msg=name)
    explanation = torch._dynamo.explain(block)(x.detach(), r.detach())
    assert explanation.graph_break_count == 0


def test_compiled_inference_matches_eager():
    torch._dynamo.reset()
    torch.manual_seed(9)
    rms = ft.nn.RMSNorm(4096, device="cuda", dtype=torch.bfloat16)
    x = _rand(17, 4096, dtype=torch.bfloat16)
    with torch.inference_mode():
        eager = rms(x)
        compiled = torch.compile(rms, fullgraph=True)(x)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    torch.testing.assert_close(
        eager, torch.nn.RMSNorm(4096, device="cuda", dtype=torch.bfloat16)(x), rtol=1e-2, atol=1e-2
    )


# --- the modules against torch's -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_modules_match_torch(dtype):
    torch.manual_seed(10)
    for ours, theirs in ((ft.nn.LayerNorm, torch.nn.LayerNorm), (ft.nn.RMSNorm, torch.nn.RMSNorm)):
        ref = theirs((5, 96), device="cuda")
        with torch.no_grad():
            for p in ref.parameters():
                p.copy_(torch.randn_like(p))
        mine = ours((5, 96), device="cuda")
        mine.load_state_dict(ref.state_dict())
        # float32 parameters with a lower-precision input, as under mixed precision
        x = _rand(4, 5, 96, dtype=dtype, requires_grad=True)
        x_ref = x.detach().float().requires_grad_()
        y, y_ref = mine(x), ref(x_ref)
        assert y.dtype == dtype
        torch.testing.assert_close(y.float(), y_ref, rtol=TOL[dtype], atol=TOL[dtype])
        dy = _rand(4, 5, 96, dtype=dtype)
        y.backward(dy)
        y_ref.backward(dy.float())
        _check_grad(x.grad, x_ref.grad.double(), dtype, f"{ours.__name__} dx")
        for (name, p), p_ref in zip(mine.named_parameters(), ref.parameters(), strict=True):
            assert p.grad.dtype == torch.float32
            _check_grad(p.grad, p_ref.grad.double(), dtype, f"{ours.__name__} d{name}")


# --- gemm ------------------------------------------------------------------------------------------------------------


def _rel(x, ref) -> float:
    return ((x.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("activation", [None, "relu", "silu"])
def test_gemm_values(activation):
    a, b = _rand(136, 264, dtype=torch.bfloat16), _rand(264, 200, dtype=torch.bfloat16)
    bias = _rand(200, dtype=torch.float32)
    out = torch.ops.flydsl.gemm(a, b, bias, activation)
    ref = a.double() @ b.double() + bias.double()
    ref = {None: lambda t: t, "relu": torch.relu, "silu": F.silu}[activation](ref)
    assert _rel(out, ref) < 1e-2


def test_gemm_gradients_eager_and_compiled():
    a = _rand(64, 128, dtype=torch.bfloat16, requires_grad=True)
    b = _rand(128, 96, dtype=torch.bfloat16, requires_grad=True)
    bias = _rand(96, dtype=torch.float32, requires_grad=True)
    dc = _rand(64, 96, dtype=torch.bfloat16)

    def f(a, b, bias):
        return torch.ops.flydsl.gemm(a, b, bias, None)

    for fn in (f, torch.compile(f, fullgraph=True)):
        a.grad = b.grad = bias.grad = None
        fn(a, b, bias).backward(dc)
        assert _rel(a.grad, dc.double() @ b.double().t()) < 1e-2
        assert _rel(b.grad, a.double().t() @ dc.double()) < 1e-2
        assert _rel(bias.grad, dc.double().sum(0)) < 1e-3


@pytest.mark.parametrize("activation", ["relu", "gelu", "silu"])
def test_gemm_gradients_through_the_fused_activation(activation):
    """Against float64 autograd of the unfused ``act(a @ b + bias)``, eager and compiled."""
    a = _rand(64, 128, dtype=torch.bfloat16, requires_grad=True)
    b = _rand(128, 96, dtype=torch.bfloat16, requires_grad=True)
    bias = _rand(96, dtype=torch.float32, requires_grad=True)
    dc = _rand(64, 96, dtype=torch.bfloat16)
    leaves = [t.detach().double().requires_grad_() for t in (a, b, bias)]
    act = getattr(F, activation)
    expected = torch.autograd.grad(act(leaves[0] @ leaves[1] + leaves[2]), leaves, dc.double())

    def f(a, b, bias):
        return torch.ops.flydsl.gemm(a, b, bias, activation)

    for fn in (f, torch.compile(f, fullgraph=True)):
        got = torch.autograd.grad(fn(a, b, bias), (a, b, bias), dc)
        for value, reference in zip(got, expected, strict=True):
            assert _rel(value, reference) < 2e-2, activation


# --- the host path ---------------------------------------------------------------------------------------------------


def test_cuda_tensors_take_the_direct_path_below_autograd():
    from flydsl.torch import _registry

    x = torch.zeros(2, 8, device="cuda")
    assert (torch._C._dispatch_keys(x) & torch._C._after_autograd_keyset).raw_repr() in _registry._DIRECT


def test_gemm_gradients_with_default_arguments():
    # The dispatcher drops bias=None and activation=None (their defaults): the backward still sees four inputs.
    a = _rand(64, 128, dtype=torch.bfloat16, requires_grad=True)
    b = _rand(128, 96, dtype=torch.bfloat16, requires_grad=True)
    dc = _rand(64, 96, dtype=torch.bfloat16)
    da, db = torch.autograd.grad(torch.ops.flydsl.gemm(a, b, None, None), (a, b), dc)
    assert _rel(da, dc.double() @ b.double().t()) < 1e-2
    assert _rel(db, a.double().t() @ dc.double()) < 1e-2


def test_gradients_of_one_output_of_several():
    torch.manual_seed(7)
    x = _rand(6, 256, dtype=torch.float32, requires_grad=True)
    r = _rand(6, 256, dtype=torch.float32, requires_grad=True)
    w = _rand(256, dtype=torch.float32, requires_grad=True)
    dy = _rand(6, 256, dtype=torch.float32)
    _, residual_out, _ = torch.ops.flydsl.fused_add_rms_norm(x, r, [256], w, None)
    dx, dr, dw = torch.autograd.grad(residual_out, (x, r, w), dy, allow_unused=True)
    assert torch.equal(dx, dy) and torch.equal(dr, dy) and dw is None
    out, _, _ = torch.ops.flydsl.fused_add_rms_norm(x, r, [256], w, None)
    dx, dw = torch.autograd.grad(out, (x, w), dy)
    xs = (x.detach().double() + r.detach().double()).requires_grad_()
    wd = w.detach().double().requires_grad_()
    rdx, rdw = torch.autograd.grad(F.rms_norm(xs, [256], wd, RMS_EPS), (xs, wd), dy.double())
    _check_grad(dx, rdx, torch.float32, "dx")
    _check_grad(dw, rdw, torch.float32, "dweight")


def test_linear_module_matches_torch_in_inference_and_training():
    reference = torch.nn.Linear(256, 384, device="cuda", dtype=torch.bfloat16)
    ours = ft.nn.Linear(256, 384, device="cuda", dtype=torch.bfloat16)
    ours.load_state_dict(reference.state_dict())
    x = torch.randn(4, 33, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        for _ in range(3):  # the first call records, the others replay
            assert torch.allclose(ours(x).float(), reference(x).float(), rtol=2e-2, atol=2e-2)
    xg = x.clone().requires_grad_(True)
    ours(xg).float().square().sum().backward()
    x2 = x.clone().requires_grad_(True)
    reference(x2).float().square().sum().backward()
    for name, got, want in (
        ("x", xg.grad, x2.grad),
        ("weight", ours.weight.grad, reference.weight.grad),
        ("bias", ours.bias.grad, reference.bias.grad),
    ):
        assert torch.allclose(got.float(), want.float(), rtol=5e-2, atol=5e-2 * want.abs().max().item()), name
