"""torch.ops.flydsl.* without a GPU: registration and schemas, fake (meta) implementations, autograd wiring,
torch.compile(fullgraph=True) tracing, errors, and the views handed to the kernels."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses import FakeTensorMode  # noqa: E402

import flydsl.torch as ft  # noqa: E402
from flydsl.torch import ops  # noqa: E402

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
NAMES = (
    "softmax",
    "layer_norm",
    "rms_norm",
    "fused_add_rms_norm",
    "gemm",
    "fp8_gemm",
    "fp8_gemm_prepared",
    "blockscale_gemm",
    "quantize_fp8",
    "paged_decode",
    "topk_route",
    "align_tokens",
    "fused_moe",
)
BACKWARD = ("softmax_backward", "layer_norm_backward", "rms_norm_backward")


def _schema(name: str) -> str:
    return str(getattr(torch.ops.flydsl, name).default._schema)


# --- registration ----------------------------------------------------------------------------------------------------


def test_every_op_is_registered_functional_and_mutating():
    assert set(ft.registered_ops()) == set(NAMES + BACKWARD)
    for name in NAMES + BACKWARD:
        functional, out = _schema(name), _schema(f"{name}_out")
        assert "!" not in functional, functional  # the functional op mutates nothing
        assert out.endswith("-> ()"), out
        op = ft.registered_ops()[name]
        for output in op.output_names:
            assert f"!) {output}" in out or f"!)? {output}" in out, (output, out)


def test_schemas():
    assert _schema("softmax") == "flydsl::softmax(Tensor x) -> Tensor"
    assert _schema("softmax_out") == "flydsl::softmax_out(Tensor x, Tensor(a1!) out) -> ()"
    assert _schema("layer_norm").startswith(
        "flydsl::layer_norm(Tensor x, SymInt[] normalized_shape, Tensor? weight=None, Tensor? bias=None, float eps="
    )
    assert _schema("layer_norm").endswith("-> (Tensor, Tensor, Tensor)")
    assert "Tensor(a6!)? mean, Tensor(a7!)? rstd) -> ()" in _schema("layer_norm_out")
    assert _schema("rms_norm") == (
        "flydsl::rms_norm(Tensor x, SymInt[] normalized_shape, Tensor? weight=None, float? eps=None)"
        " -> (Tensor, Tensor)"
    )
    assert _schema("fused_add_rms_norm_out").endswith(
        "Tensor(a5!) out, Tensor(a6!) residual_out, Tensor(a7!)? rstd) -> ()"
    )
    assert _schema("layer_norm_backward") == (
        "flydsl::layer_norm_backward(Tensor dy, Tensor x, SymInt[] normalized_shape, Tensor? weight, Tensor mean,"
        " Tensor rstd) -> (Tensor, Tensor, Tensor)"
    )


def test_registering_twice_is_refused():
    with pytest.raises(RuntimeError, match="already registered"):
        ops.register_op("softmax", outputs=lambda x: (), check=lambda x: None)(lambda x, *, out: None)


# --- fake implementations ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_fake_outputs_shapes_and_dtypes(dtype):
    with FakeTensorMode():
        x = torch.empty(2, 3, 5, 7, dtype=dtype, device="cuda")
        w = torch.empty(5, 7, dtype=torch.float32, device="cuda")  # float32 weights beside any input dtype
        w7 = torch.empty(7, dtype=torch.float32, device="cuda")
        y = torch.ops.flydsl.softmax(x)
        assert (y.shape, y.dtype, y.device.type) == (x.shape, dtype, "cuda")
        dx = torch.ops.flydsl.softmax_backward(y, y)
        assert (dx.shape, dx.dtype) == (x.shape, dtype)

        out, mean, rstd = torch.ops.flydsl.layer_norm(x, [5, 7], w, w, 1e-5)
        assert (out.shape, out.dtype) == (x.shape, dtype)
        assert (mean.shape, mean.dtype, rstd.shape, rstd.dtype) == ((2, 3), torch.float32, (2, 3), torch.float32)
        dx, dw, db = torch.ops.flydsl.layer_norm_backward(out, x, [5, 7], w, mean, rstd)
        assert (dx.shape, dx.dtype) == (x.shape, dtype)
        assert (dw.shape, dw.dtype, db.shape, db.dtype) == ((5, 7), torch.float32, (5, 7), torch.float32)
        dx, dw, db = torch.ops.flydsl.layer_norm_backward(out, x, [5, 7], None, mean, rstd)
        assert dw.numel() == 0 and db.numel() == 0  # no weight: nothing to differentiate

        out, rstd = torch.ops.flydsl.rms_norm(x, [7], None, None)
        assert (out.shape, rstd.shape, rstd.dtype) == (x.shape, (2, 3, 5), torch.float32)
        dx, dw = torch.ops.flydsl.rms_norm_backward(out, x, [7], w7, rstd)
        assert (dx.shape, dw.shape, dw.dtype) == (x.shape, (7,), torch.float32)

        out, residual_out, rstd = torch.ops.flydsl.fused_add_rms_norm(x, x, [7], w7.to(dtype), 1e-6)
        assert out.shape == residual_out.shape == x.shape and out.dtype == residual_out.dtype == dtype
        assert rstd.shape == (2, 3, 5)


def test_fake_out_ops_check_the_outputs_given():
    with FakeTensorMode():
        x = torch.empty(4, 16, dtype=torch.bfloat16, device="cuda")
        torch.ops.flydsl.softmax_out(x, torch.empty_like(x))
        torch.ops.flydsl.layer_norm_out(x, [16], None, None, 1e-5, torch.empty_like(x), None, None)  # no statistics
        with pytest.raises(ValueError, match=r"flydsl.softmax: out: expected a bfloat16 tensor of shape \(4, 16\)"):
            torch.ops.flydsl.softmax_out(x, torch.empty(4, 15, dtype=torch.bfloat16, device="cuda"))
        with pytest.raises(ValueError, match="flydsl.layer_norm: rstd: expected a float32 tensor of shape"):
            bad = torch.empty(4, 1, device="cuda")
            torch.ops.flydsl.layer_norm_out(x, [16], None, None, 1e-5, torch.empty_like(x), None, bad)
        with pytest.raises(ValueError, match="dweight: not written with these inputs"):
            s = torch.empty(4, device="cuda")
            dw = torch.empty(16, device="cuda")
            torch.ops.flydsl.rms_norm_backward_out(x, x, [16], None, s, torch.empty_like(x), dw)


def test_meta_tensors_run_the_fake_implementation():
    x = torch.empty(3, 8, device="meta")
    out, mean, rstd = torch.ops.flydsl.layer_norm(x, [8])
    assert out.device.type == "meta" and mean.shape == (3,)


# --- autograd ---------------------------------------------------------------------------------------------------------


def _leaf(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta", requires_grad=True)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("weight", [True, False])
def test_layer_norm_gradients_reach_every_input(weight, bias):
    x = _leaf(2, 3, 8, dtype=torch.bfloat16)
    w = _leaf(8) if weight else None
    b = _leaf(8) if bias else None
    ft.layer_norm(x, 8, w, b).sum().backward()
    assert x.grad.shape == x.shape and x.grad.dtype == torch.bfloat16
    for p in (w, b):
        if p is not None:
            assert p.grad.shape == (8,) and p.grad.dtype == torch.float32


def test_rms_and_softmax_gradients():
    x, r, w = _leaf(4, 8), _leaf(4, 8), _leaf(8)
    out, residual_out = ft.fused_add_rms_norm(x, r, 8, w)
    (out.sum() + residual_out.sum()).backward()
    assert x.grad.shape == r.grad.shape == (4, 8) and w.grad.shape == (8,)
    x = _leaf(4, 8)
    ft.rms_norm(x, [8]).sum().backward()
    assert x.grad.shape == (4, 8)
    x = _leaf(4, 6, 8)
    ft.softmax(x, dim=1).sum().backward()  # a dim other than the last moves there and back
    assert x.grad.shape == (4, 6, 8)


def test_statistics_are_not_differentiable():
    x = _leaf(4, 8)
    _, mean, rstd = torch.ops.flydsl.layer_norm(x, [8])
    assert not mean.requires_grad and not rstd.requires_grad


def test_inference_calls_the_out_op_without_statistics_and_training_the_functional_op(op_recorder):
    x = torch.empty(4, 8, device="meta")
    with op_recorder() as rec, torch.no_grad():
        ft.layer_norm(x, [8])
    assert "flydsl.layer_norm_out.default" in rec.names
    with op_recorder() as rec:
        ft.layer_norm(x.requires_grad_(), [8]).sum().backward()
    assert "flydsl.layer_norm.default" in rec.names and "flydsl.layer_norm_backward.default" in rec.names


# --- torch.compile ----------------------------------------------------------------------------------------------------


def _targets(gm) -> str:
    return " ".join(str(node.target) for node in gm.graph.nodes if node.op == "call_function")


def test_compile_fullgraph_forward_and_backward_use_the_flydsl_ops(aot_graphs):
    torch._dynamo.reset()
    backend, graphs = aot_graphs()
    w, b = _leaf(8), _leaf(8)

    def block(x, r):
        h = ft.layer_norm(x, [8], w, b)
        h, r = ft.fused_add_rms_norm(h, r, [8], w)
        return ft.softmax(h).sum() + r.sum()

    x, r = _leaf(2, 3, 8), _leaf(2, 3, 8)
    torch.compile(block, backend=backend, fullgraph=True)(x, r).backward()
    forward, backward = _targets(graphs[0]), _targets(graphs[1])
    for name in ("layer_norm", "fused_add_rms_norm", "softmax"):
        assert f"flydsl.{name}.default" in forward, forward
    for name in ("layer_norm_backward", "rms_norm_backward", "softmax_backward"):
        assert f"flydsl.{name}.default" in backward, backward
    assert x.grad.shape == r.grad.shape == x.shape and w.grad.shape == b.grad.shape == (8,)


def test_modules_run_flydsl_on_cuda_and_torch_elsewhere(op_recorder):
    # Fake CUDA tensors cannot carry autograd in a CPU build of torch: inference only here (gradients: meta tests).
    with FakeTensorMode(), torch.no_grad():
        x = torch.empty(2, 8, device="cuda")
        ln, rms = ft.nn.LayerNorm(8, device="cuda"), ft.nn.RMSNorm(8, device="cuda")
        with op_recorder() as rec:
            ln(x)
            rms(x)
            out, residual_out = rms(x, x)
        assert out.shape == residual_out.shape == (2, 8)
        called = [name for name in rec.names if name.startswith("flydsl.")]
        assert called == ["flydsl.layer_norm_out.default", "flydsl.rms_norm_out.default"] + [
            "flydsl.fused_add_rms_norm_out.default"
        ]
    x = torch.empty(2, 8, device="meta")  # not CUDA: torch's own forward
    with op_recorder() as rec:
        ft.nn.LayerNorm(8, device="meta")(x)
        ft.nn.RMSNorm(8, device="meta")(x, x)
        ft.nn.Linear(8, 4, device="meta")(x)
    assert not any("flydsl" in name for name in rec.names)


def test_linear_module_runs_the_gemm_on_cuda_bf16_and_torch_elsewhere(op_recorder):
    with FakeTensorMode(), torch.no_grad():
        layer = ft.nn.Linear(32, 48, device="meta", dtype=torch.bfloat16)  # (fake CUDA tensors: no random init)
        layer.weight = torch.nn.Parameter(torch.empty(48, 32, device="cuda", dtype=torch.bfloat16))
        layer.bias = torch.nn.Parameter(torch.empty(48, device="cuda", dtype=torch.bfloat16))
        assert isinstance(layer, torch.nn.Linear)
        with op_recorder() as rec:
            y = layer(torch.empty(2, 5, 32, device="cuda", dtype=torch.bfloat16))
            layer(torch.empty(2, 32, device="cuda", dtype=torch.float16))  # not the weight's dtype: torch's
        assert y.shape == (2, 5, 48)
        assert [name for name in rec.names if name.startswith("flydsl.")] == ["flydsl.gemm.default"]
    reference = torch.nn.Linear(32, 48)
    ours = ft.nn.Linear(32, 48)
    ours.load_state_dict(reference.state_dict())  # checkpoints load both ways
    x = torch.randn(3, 32)
    assert torch.equal(ours(x), reference(x))  # CPU: torch's forward


def test_compile_inference_functionalizes_the_out_ops(aot_graphs):
    torch._dynamo.reset()
    backend, graphs = aot_graphs()

    def f(x, w):
        return ft.rms_norm(x, [16], w, 1e-6) * 2

    with torch.no_grad():
        torch.compile(f, backend=backend, fullgraph=True, dynamic=True)(
            torch.empty(5, 16, device="meta"), torch.empty(16, device="meta")
        )
    assert "auto_functionalized" in _targets(graphs[0]) and "flydsl.rms_norm_out" in str(graphs[0].graph)


def test_explain_reports_no_graph_breaks():
    torch._dynamo.reset()
    w = torch.empty(8, device="meta")

    def f(x):
        y = ft.layer_norm(x, [8], w, w)
        y = ft.rms_norm(y, 8, w)
        return ft.softmax(y, dim=0)

    explanation = torch._dynamo.explain(f)(torch.empty(4, 8, device="meta"))
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1


# --- errors -----------------------------------------------------------------------------------------------------------


def test_errors_name_the_argument():
    x = torch.empty(4, 8, device="meta")
    with pytest.raises(TypeError, match="flydsl.softmax: x: expected dtype float32, float16 or bfloat16, got float64"):
        torch.ops.flydsl.softmax(x.double())
    with pytest.raises(ValueError, match=r"normalized_shape: expected the trailing dims of x \(shape \(4, 8\)\)"):
        torch.ops.flydsl.layer_norm(x, [4])
    with pytest.raises(ValueError, match=r"flydsl.layer_norm: weight: expected shape \(8,\)"):
        torch.ops.flydsl.layer_norm(x, [8], torch.empty(7, device="meta"))
    with pytest.raises(TypeError, match="flydsl.rms_norm: weight: expected dtype float16 .x's. or float32"):
        torch.ops.flydsl.rms_norm(x.half(), [8], torch.empty(8, device="meta", dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="flydsl.rms_norm: eps: expected a non-negative number"):
        torch.ops.flydsl.rms_norm(x, [8], None, -1.0)
    with pytest.raises(ValueError, match=r"flydsl.fused_add_rms_norm: residual: expected shape \(4, 8\)"):
        torch.ops.flydsl.fused_add_rms_norm(x, x[:2], [8])
    with pytest.raises(TypeError, match="flydsl.softmax_backward: dy: expected dtype float32"):
        torch.ops.flydsl.softmax_backward(x.half(), x)
    with pytest.raises(ValueError, match=r"flydsl.rms_norm_backward: rstd: expected a float32 tensor of shape \(4,\)"):
        torch.ops.flydsl.rms_norm_backward(x, x, [8], None, torch.empty(4, 1, device="meta"))
    with pytest.raises(ValueError, match="normalized_shape: expected at least one element"):
        torch.ops.flydsl.layer_norm(torch.empty(4, 0, device="meta"), [0])
    with pytest.raises(IndexError, match="flydsl.softmax: dim"):
        ft.softmax(x, dim=2)


def test_functional_refuses_non_tensors_naming_them():
    x = torch.empty(4, 8, device="meta")
    with pytest.raises(TypeError, match="flydsl.layer_norm: input: expected a torch.Tensor, got NoneType"):
        ft.layer_norm(None, 8)
    with pytest.raises(TypeError, match="flydsl.layer_norm: input: expected a torch.Tensor, got list"):
        ft.layer_norm([[1.0] * 8], 8)
    with pytest.raises(TypeError, match="flydsl.layer_norm: bias: expected a torch.Tensor or None, got list"):
        ft.layer_norm(x, 8, None, [0.0] * 8)
    with pytest.raises(TypeError, match="flydsl.rms_norm: weight: expected a torch.Tensor or None, got list"):
        ft.rms_norm(x, 8, [1.0] * 8)
    with pytest.raises(TypeError, match="flydsl.fused_add_rms_norm: residual: expected a torch.Tensor, got NoneType"):
        ft.fused_add_rms_norm(x, None, 8)
    with pytest.raises(TypeError, match="flydsl.softmax: input: expected a torch.Tensor, got tuple"):
        ft.softmax((1.0, 2.0))


def test_real_tensors_must_be_on_one_cuda_device():
    with pytest.raises(ValueError, match="flydsl.softmax: x: expected a CUDA tensor, got one on cpu"):
        torch.ops.flydsl.softmax(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="flydsl.layer_norm: weight: expected a tensor on cuda:0 .where x is."):
        with FakeTensorMode():
            torch.ops.flydsl.layer_norm(torch.empty(2, 4, device="cuda"), [4], torch.empty(4))


# --- views handed to the kernels --------------------------------------------------------------------------------------


def test_rows_are_views_where_strides_allow():
    base = torch.arange(60.0).reshape(3, 4, 5)
    strided = base[:, :, :4]  # row stride 5 > N = 4: kept as a view
    rows = ops._rows(strided, 4)
    assert rows.data_ptr() == base.data_ptr() and rows.stride() == (5, 1) and torch.equal(rows, strided.reshape(-1, 4))
    transposed = base.transpose(1, 2)  # last-dim stride 5: copied
    rows = ops._rows(transposed, 4)
    assert rows.is_contiguous() and torch.equal(rows, transposed.reshape(-1, 4))
    broadcast = torch.ones(1, 6).expand(5, 6)  # row stride 0: copied (rows must not overlap)
    assert ops._rows(broadcast, 6).stride() == (6, 1)


def test_outputs_must_be_views():
    assert ops._out_rows("op", "out", torch.empty(2, 3, 4), 4).shape == (6, 4)
    with pytest.raises(ValueError, match="flydsl.op: out: expected unit stride over the normalized dims"):
        ops._out_rows("op", "out", torch.empty(4, 6).t(), 4)


# --- gemm ------------------------------------------------------------------------------------------------------------


def test_gemm_activations_are_the_kernels():
    from flydsl.kernels import validation
    from flydsl.kernels.gemm import ACTIVATIONS

    assert ACTIVATIONS is validation.GEMM_ACTIVATIONS  # one list: the op checks against the kernel's


def test_registering_the_ops_loads_no_compiler():
    import subprocess
    import sys

    probe = "import sys, flydsl.torch; print('flydsl.compiler' in sys.modules, 'mlir' in sys.modules)"
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert found == ["False", "False"]


def test_gemm_schemas():
    assert _schema("gemm") == "flydsl::gemm(Tensor a, Tensor b, Tensor? bias=None, str? activation=None) -> Tensor"
    assert _schema("gemm_out").endswith("Tensor? bias, str? activation, Tensor(a4!) out) -> ()")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gemm_fake_outputs(dtype):
    with FakeTensorMode():
        a = torch.empty(64, 32, dtype=dtype, device="cuda")
        b = torch.empty(48, 32, dtype=dtype, device="cuda").t()  # column-major b
        out = torch.ops.flydsl.gemm(a, b, torch.empty(48, device="cuda"), "gelu")
        assert out.shape == (64, 48) and out.dtype == dtype and out.device.type == "cuda"


@pytest.mark.parametrize(
    "activation, gemms, derivative",
    [(None, 2, None), ("relu", 2, "threshold_backward"), ("gelu", 3, "gelu_backward"), ("silu", 3, "silu_backward")],
)
def test_gemm_gradients_are_gemms_in_one_compiled_graph(aot_graphs, activation, gemms, derivative):
    """da = dz b^T and db = a^T dz through the op, dz = dc through the fused activation's derivative: relu's from the
    output, gelu's and silu's at the pre-activation, computed again by one more GEMM (with the bias)."""
    torch._dynamo.reset()
    backend, graphs = aot_graphs()
    a = torch.empty(16, 32, dtype=torch.bfloat16, device="meta", requires_grad=True)
    b = torch.empty(32, 24, dtype=torch.bfloat16, device="meta", requires_grad=True)
    bias = torch.empty(24, dtype=torch.float32, device="meta", requires_grad=True)

    def f(a, b, bias):
        return torch.ops.flydsl.gemm(a, b, bias, activation).float().sum()

    torch.compile(f, backend=backend, fullgraph=True)(a, b, bias).backward()
    forward, backward = str(graphs[0].graph), str(graphs[1].graph)
    assert forward.count("flydsl.gemm.default") == 1
    assert backward.count("flydsl.gemm.default") == gemms  # (da = dz b^T, db = a^T dz, and the pre-activation)
    if derivative is not None:
        assert activation in forward, forward
        assert derivative in backward and backward.index(derivative) < backward.rindex("flydsl.gemm.default")
    assert a.grad.shape == a.shape and b.grad.shape == b.shape and bias.grad.dtype == torch.float32


@pytest.mark.parametrize("activation", ["relu", "gelu", "silu"])
def test_gemm_activation_gradients_are_torchs(monkeypatch, activation):
    """The gemm op's backward through a fused activation, its GEMMs stood in for by torch's (float32, on the CPU):
    the gradients of torch's unfused ``act(a @ b + bias)``."""
    from flydsl.torch import autograd

    class Context:  # what the setup and the backward use of autograd.Function's ctx
        needs_input_grad = (True, True, True, False)

        def save_for_backward(self, *tensors):
            self.saved_tensors = tensors

    def stand_in(a, b, bias, act):
        z = a @ b + (0 if bias is None else bias)
        return z if act is None else getattr(torch.nn.functional, act)(z)

    monkeypatch.setattr(autograd.ops.gemm, "call", stand_in)
    torch.manual_seed(0)
    a, b, bias = torch.randn(8, 16), torch.randn(16, 12), torch.randn(12)
    dc = torch.randn(8, 12)
    ctx = Context()
    autograd._gemm_setup(ctx, (a, b, bias, activation), stand_in(a, b, bias, activation))
    da, db, dbias, _ = autograd._gemm_backward(ctx, dc)
    leaves = [t.clone().requires_grad_() for t in (a, b, bias)]
    expected = torch.autograd.grad(stand_in(*leaves, activation), leaves, dc)
    for got, want in zip((da, db, dbias), expected, strict=True):
        torch.testing.assert_close(got, want)


def test_gemm_errors_name_the_argument():
    a = torch.empty(16, 32, dtype=torch.bfloat16, device="meta")
    with pytest.raises(ValueError, match=r"flydsl.gemm: b: expected 32 rows"):
        torch.ops.flydsl.gemm(a, torch.empty(16, 8, dtype=torch.bfloat16, device="meta"))
    with pytest.raises(TypeError, match="flydsl.gemm: a: expected dtype bfloat16 or float16, got float32"):
        torch.ops.flydsl.gemm(a.float(), a.float().t())
    with pytest.raises(ValueError, match="flydsl.gemm: activation: expected one of"):
        torch.ops.flydsl.gemm(a, a.t(), None, "tanh")
    with pytest.raises(ValueError, match=r"flydsl.gemm: bias: expected a \(16,\) vector"):
        torch.ops.flydsl.gemm(a, a.t(), torch.empty(3, device="meta"))


def test_functional_linear_is_the_gemm_op(op_recorder):
    """ft.linear(x, w, b) = x @ w.t() + b through torch.ops.flydsl.gemm (traced: fake tensors), batch dims kept."""
    with FakeTensorMode(), torch.no_grad():
        x = torch.empty(2, 3, 32, dtype=torch.bfloat16, device="cuda")
        w = torch.empty(48, 32, dtype=torch.bfloat16, device="cuda")
        bias = torch.empty(48, dtype=torch.bfloat16, device="cuda")
        with op_recorder() as rec:
            y = ft.linear(x, w, bias)
        assert y.shape == (2, 3, 48) and y.dtype == torch.bfloat16
        assert "flydsl.gemm.default" in rec.names, rec.names
        assert ft.linear(torch.empty(32, dtype=torch.bfloat16, device="cuda"), w).shape == (48,)


def test_functional_linear_refuses_what_is_not_a_tensor():
    with pytest.raises(TypeError, match="flydsl.linear: weight: expected a torch.Tensor, got list"):
        ft.linear(torch.empty(2, 4), [[1.0] * 4])
    with pytest.raises(ValueError, match="flydsl.linear: input: expected at least one dim"):
        ft.linear(torch.tensor(1.0), torch.empty(2, 1))


def test_functional_linear_gradients_in_one_compiled_graph(aot_graphs):
    torch._dynamo.reset()
    backend, graphs = aot_graphs()
    x = torch.empty(4, 16, 32, dtype=torch.bfloat16, device="meta", requires_grad=True)
    w = torch.empty(24, 32, dtype=torch.bfloat16, device="meta", requires_grad=True)
    torch.compile(lambda x, w: ft.linear(x, w).float().sum(), backend=backend, fullgraph=True)(x, w).backward()
    assert "flydsl.gemm.default" in _targets(graphs[0]) and "flydsl.gemm.default" in _targets(graphs[1])
    assert x.grad.shape == x.shape and w.grad.shape == w.shape
