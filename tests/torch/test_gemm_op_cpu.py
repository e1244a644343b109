"""torch.ops.flydsl.gemm without a GPU: schema, fake outputs, gradients wired to GEMMs, torch.compile(fullgraph=True)
forward and backward graphs, and errors naming the argument (meta and fake tensors)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses import FakeTensorMode  # noqa: E402

import flydsl.torch  # noqa: E402, F401  (registers the ops)


def _schema(name: str) -> str:
    return str(getattr(torch.ops.flydsl, name).default._schema)


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


def _graphs():
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def keep(gm, _inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=keep, bw_compiler=keep), graphs


def test_gemm_gradients_are_gemms_in_one_compiled_graph():
    torch._dynamo.reset()
    backend, graphs = _graphs()
    a = torch.empty(16, 32, dtype=torch.bfloat16, device="meta", requires_grad=True)
    b = torch.empty(32, 24, dtype=torch.bfloat16, device="meta", requires_grad=True)
    bias = torch.empty(24, dtype=torch.float32, device="meta", requires_grad=True)

    def f(a, b, bias):
        return torch.ops.flydsl.gemm(a, b, bias, None).float().sum()

    torch.compile(f, backend=backend, fullgraph=True)(a, b, bias).backward()
    forward, backward = str(graphs[0].graph), str(graphs[1].graph)
    assert forward.count("flydsl.gemm.default") == 1
    assert backward.count("flydsl.gemm.default") == 2  # da = dc b^T, db = a^T dc
    assert a.grad.shape == a.shape and b.grad.shape == b.shape and bias.grad.dtype == torch.float32


def test_gemm_errors_name_the_argument():
    a = torch.empty(16, 32, dtype=torch.bfloat16, device="meta")
    with pytest.raises(ValueError, match=r"flydsl.gemm: b: expected 32 rows"):
        torch.ops.flydsl.gemm(a, torch.empty(16, 8, dtype=torch.bfloat16, device="meta"))
    with pytest.raises(TypeError, match="flydsl.gemm: a: expected dtype bfloat16 or float16, got float32"):
        torch.ops.flydsl.gemm(a.float(), a.float().t())
    with pytest.raises(ValueError, match="flydsl.gemm: activation: expected one of"):
        torch.ops.flydsl.gemm(a, a.t(), None, "tanh")
    with pytest.raises(ValueError, match=r"flydsl.gemm: bias: expected a \(16,\) tensor"):
        torch.ops.flydsl.gemm(a, a.t(), torch.empty(3, device="meta"))
    leaf = torch.empty(16, 32, dtype=torch.bfloat16, device="meta", requires_grad=True)
    with pytest.raises(NotImplementedError, match="gradients through the fused activation"):
        torch.ops.flydsl.gemm(leaf, a.t(), None, "relu")
