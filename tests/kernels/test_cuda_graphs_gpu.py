"""Every zoo op captured in a CUDA graph and replayed on new input values (copied into the captured inputs), against
float64 references with the tolerances of test_norms_gpu.py: register kernels, staged kernels whose rows are claimed
through a per-stream counter, teams exchanging through global memory (zeroed per launch), the backward's partial
column sums, the GEMM's split-K workspace and flags, and the skinny GEMM (flydsl.torch's forms:
tests/torch/test_torch_cuda_graphs_gpu.py).

The pattern (docs/torch.md, "CUDA graphs"): one call outside the capture first, on a side stream (it compiles the
kernel, makes the call's launch plan and loads the module: none of which may happen while capturing), then capture."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import flydsl.kernels as zoo  # noqa: E402
from flydsl.kernels.gemm import gemm  # noqa: E402

from .norms_gpu_support import close, column_close, ln_ref, make_input, rms_ref  # noqa: E402

REPLAYS = 3


def _replay(graph, inputs: dict, make: dict):
    """New values into each captured input, then a replay."""
    for name, tensor in inputs.items():
        tensor.copy_(make[name]())
    graph.replay()
    torch.cuda.synchronize()


@pytest.mark.parametrize(
    "rows, n, dtype",
    [(8, 1024, torch.bfloat16), (4, 65536, torch.bfloat16), (2, 262144, torch.float32)],
    ids=["register", "claimed rows", "team"],
)
def test_softmax_and_its_backward(rows, n, dtype, graphed):
    x, dy = make_input(rows, n, dtype), make_input(rows, n, dtype)

    def step():
        y = zoo.softmax(x)
        return y, zoo.softmax_backward(dy, y)

    graph, (y, dx) = graphed(step)
    for _ in range(REPLAYS):
        _replay(
            graph,
            {"x": x, "dy": dy},
            {"x": lambda: make_input(rows, n, dtype), "dy": lambda: make_input(rows, n, dtype)},
        )
        ref = torch.softmax(x.double(), -1)
        close(y.double() * n, ref * n, dtype, "y * N", n)
        yd = y.double()
        dref = yd * (dy.double() - (dy.double() * yd).sum(-1, keepdim=True))
        magnitude = yd * (dy.double().abs() + (dy.double() * yd).abs().sum(-1, keepdim=True))
        close(dx.double() * n, dref * n, dtype, "dx * N", n, magnitude * n)


@pytest.mark.parametrize(
    "rows, n", [(8, 1024), (16, 65536), (2, 1048576)], ids=["register", "staged backward", "team forward"]
)
def test_layer_norm_forward_and_backward(rows, n, graphed):
    dtype = torch.bfloat16
    x, dy = make_input(rows, n, dtype), make_input(rows, n, dtype)
    w, b = torch.randn(n, device="cuda").to(dtype), torch.randn(n, device="cuda").to(dtype)

    def step():
        out, mean, rstd = zoo.layer_norm(x, w, b, 1e-5, return_stats=True)
        return (out, mean, rstd, *zoo.layer_norm_backward(dy, x, w, mean, rstd))

    graph, (out, mean, rstd, dx, dw, db) = graphed(step)
    for _ in range(REPLAYS):
        _replay(
            graph,
            {"x": x, "dy": dy},
            {"x": lambda: make_input(rows, n, dtype), "dy": lambda: make_input(rows, n, dtype)},
        )
        ref, ref_mean, ref_rstd = ln_ref(x, w, b, 1e-5)
        close(out, ref)
        close(mean, ref_mean, torch.float32, "mean")
        close(rstd, ref_rstd, torch.float32, "rstd")
        xd, wd, bd = (t.double().requires_grad_() for t in (x, w, b))
        torch.nn.functional.layer_norm(xd, (n,), wd, bd, 1e-5).backward(dy.double())
        close(dx, xd.grad, what="dx")
        column_close(dw, wd.grad, rows, "dweight")
        column_close(db, bd.grad, rows, "dbias")


@pytest.mark.parametrize("rows, n", [(8, 4096), (4, 262144)], ids=["register", "claimed rows"])
def test_rms_norm_and_the_fused_add(rows, n, graphed):
    dtype = torch.bfloat16
    x, residual = make_input(rows, n, dtype), make_input(rows, n, dtype)
    w = torch.randn(n, device="cuda").to(dtype)

    def step():
        out, _ = zoo.rms_norm(x, w)
        fused, summed, _ = zoo.fused_add_rms_norm(x, residual, w)
        return out, fused, summed

    graph, (out, fused, summed) = graphed(step)
    for _ in range(REPLAYS):
        make = {"x": lambda: make_input(rows, n, dtype), "residual": lambda: make_input(rows, n, dtype)}
        _replay(graph, {"x": x, "residual": residual}, make)
        close(out, rms_ref(x, w)[0])
        expected_sum = (x.float() + residual.float()).to(dtype)
        assert torch.equal(summed, expected_sum), "residual_out"
        close(fused, rms_ref(expected_sum, w)[0])


@pytest.mark.parametrize(
    "m, n, k", [(16, 4096, 4096), (128, 4096, 16384), (64, 512, 8192), (512, 512, 512)],
    ids=["skinny", "split K workspace", "split K 8", "tiles"],
)  # fmt: skip
def test_gemm(m, n, k, graphed):
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    graph, out = graphed(lambda: gemm(a, w.t(), bias=bias))
    for _ in range(REPLAYS):
        _replay(graph, {"a": a}, {"a": lambda: torch.randn(m, k, device="cuda", dtype=torch.bfloat16)})
        ref = a.double() @ w.double().t() + bias.double()
        assert torch.allclose(out.double(), ref, atol=2e-2, rtol=1e-2), (out.double() - ref).abs().max()
