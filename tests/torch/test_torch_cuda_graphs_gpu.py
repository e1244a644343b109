"""flydsl.torch in CUDA graphs and on its eager path: the functional forms (which run plain CUDA calls without the
dispatcher), the ops and the nn modules captured and replayed on new input values, against torch's own results;
which calls take the eager path on the GPU. The zoo's kernels in graphs: tests/kernels/test_cuda_graphs_gpu.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import flydsl.torch as ft  # noqa: E402
from flydsl.torch import _registry  # noqa: E402

pytestmark = pytest.mark.gpu

TOL = 2e-2  # bfloat16 outputs: about twice their rounding


def test_functional_ops_and_modules_replay_on_new_values(graphed):
    rows, n, dtype = 8, 2048, torch.bfloat16
    x = torch.randn(rows, n, device="cuda").to(dtype)
    residual = torch.randn(rows, n, device="cuda").to(dtype)
    norm = ft.nn.RMSNorm(n, eps=1e-6, device="cuda", dtype=dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(n))
    weight = norm.weight.detach()

    def step():
        with torch.no_grad():
            return (
                ft.functional.layer_norm(x, (n,)),
                norm(x),
                torch.ops.flydsl.softmax(x),
                ft.functional.fused_add_rms_norm(x, residual, (n,), weight, 1e-6)[0],
            )

    graph, results = graphed(step)
    for _ in range(3):
        x.copy_(torch.randn(rows, n, device="cuda"))
        residual.copy_(torch.randn(rows, n, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        summed = (x.float() + residual.float()).to(dtype)
        expected = (
            F.layer_norm(x.float(), (n,)),
            F.rms_norm(x.float(), (n,), weight.float(), 1e-6),
            torch.softmax(x.float(), -1) * n,
            F.rms_norm(summed.float(), (n,), weight.float(), 1e-6),
        )
        got = list(results)
        got[2] = got[2].float() * n  # softmax at the scale of its mean element
        for i, (ours, ref) in enumerate(zip(got, expected, strict=True)):
            assert torch.allclose(ours.float(), ref, atol=TOL, rtol=TOL), (i, (ours.float() - ref).abs().max())


def test_eager_calls_on_plain_cuda_tensors_only():
    x = torch.randn(4, 64, device="cuda")
    assert _registry.eager(x, None)
    with torch.inference_mode():
        assert _registry.eager(torch.randn(4, 64, device="cuda"))
    assert _registry.eager(torch.nn.Parameter(x.clone()))  # requires grad: FlyOp.call's autograd.Function
    assert not _registry.eager(x, torch.randn(64))  # a CPU tensor among them: the op, and its error
    with pytest.raises(ValueError, match="flydsl.layer_norm: weight: expected a CUDA tensor"):
        ft.functional.layer_norm(x, (64,), torch.randn(64))


def test_eager_gradients_equal_the_ops():
    x = torch.randn(6, 1000, device="cuda", requires_grad=True)
    w = torch.randn(1000, device="cuda", requires_grad=True)
    dy = torch.randn(6, 1000, device="cuda")
    eager = torch.autograd.grad(ft.functional.rms_norm(x, 1000, w, 1e-6), (x, w), dy)
    op = torch.autograd.grad(torch.ops.flydsl.rms_norm(x, [1000], w, 1e-6)[0], (x, w), dy)
    assert all(torch.equal(a, b) for a, b in zip(eager, op, strict=True))
    ref = torch.autograd.grad(F.rms_norm(x, (1000,), w, 1e-6), (x, w), dy)
    assert all(torch.allclose(a, b, atol=1e-3, rtol=1e-3) for a, b in zip(eager, ref, strict=True))


def test_eager_results_equal_the_ops():
    x = torch.randn(3, 5, 1000, device="cuda").to(torch.bfloat16)  # leading dims, N not a multiple of 8
    w = torch.randn(1000, device="cuda").to(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(
            ft.functional.rms_norm(x, (1000,), w, 1e-6), torch.ops.flydsl.rms_norm(x, [1000], w, 1e-6)[0]
        )
        assert torch.equal(ft.functional.softmax(x), torch.ops.flydsl.softmax(x))
        ln = torch.ops.flydsl.layer_norm(x, [1000], w, w, 1e-5)[0]
        assert torch.equal(ft.functional.layer_norm(x, 1000, w, w), ln)
