"""The per-call host path of torch.ops.flydsl.* without a GPU: which calls take the direct path below autograd and
which redispatch, defaults the dispatcher leaves out, gradients of unused outputs, the zoo entry points the ops call,
which calls of flydsl.torch.functional skip the dispatcher, and flydsl.kernels.validation's descriptions of torch
tensors."""

from __future__ import annotations

import inspect

import pytest

torch = pytest.importorskip("torch")


import flydsl.torch as ft  # noqa: E402
from flydsl.torch import _registry, ops  # noqa: E402


def _leaf(*shape, dtype=torch.float32):
    return torch.empty(*shape, dtype=dtype, device="meta", requires_grad=True)


def _below_autograd(t: torch.Tensor) -> int:
    return (torch._C._dispatch_keys(t) & torch._C._after_autograd_keyset).raw_repr()


def test_plain_cpu_and_cuda_tensors_take_the_direct_path_others_redispatch():
    keys = torch._C.DispatchKey
    cuda = torch._C.DispatchKeySet(keys.CUDA).add(keys.ADInplaceOrView).raw_repr()
    assert cuda in _registry._DIRECT  # what a CUDA tensor carries below autograd
    assert _below_autograd(torch.zeros(2)) in _registry._DIRECT
    with torch.inference_mode():  # inference tensors have no ADInplaceOrView key
        assert _below_autograd(torch.zeros(2)) in _registry._DIRECT
    assert _below_autograd(torch.zeros(2, device="meta")) not in _registry._DIRECT


def test_a_dispatch_mode_still_sees_the_op(op_recorder):
    # A plain CPU tensor takes the direct path (the real implementation, which refuses CPU tensors); under a mode the
    # Python key is set, so the kernel redispatches and the mode sees the op before the implementation raises.
    x = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="flydsl.softmax: x: expected a CUDA tensor, got one on cpu"):
        torch.ops.flydsl.softmax(x)
    with op_recorder() as rec, pytest.raises(ValueError, match="expected a CUDA tensor"):
        torch.ops.flydsl.softmax(x)
    assert rec.names == ["flydsl.softmax.default"]


def test_inputs_left_out_by_the_dispatcher_get_their_defaults():
    op = ft.registered_ops()["layer_norm"]
    x = torch.empty(2, 8, device="meta")
    assert op._inputs((x, [8]), {}) == (x, [8], None, None, 1e-5)
    assert op._inputs((x, [8], None, None, 1e-3), {}) == (x, [8], None, None, 1e-3)
    assert op._inputs((x,), {"normalized_shape": [8], "eps": 0.5}) == (x, [8], None, None, 0.5)


def test_gemm_gradients_when_the_dispatcher_drops_default_arguments():
    # gemm(a, b, None, None): bias and activation equal their defaults, so the dispatcher passes (a, b) only; the
    # backward still sees one needs_input_grad entry per input (torch's generated kernel gave it two: IndexError).
    a, b = _leaf(16, 32, dtype=torch.bfloat16), _leaf(32, 24, dtype=torch.bfloat16)
    torch.ops.flydsl.gemm(a, b, None, None).sum().backward()
    assert a.grad.shape == (16, 32) and b.grad.shape == (32, 24)
    a.grad = b.grad = None
    torch.ops.flydsl.gemm(a, b).sum().backward()
    assert a.grad.shape == (16, 32) and b.grad.shape == (32, 24)


def test_no_zeros_are_materialized_for_the_statistics(op_recorder):
    x, w, b = _leaf(4, 8), _leaf(8), _leaf(8)
    out, _, _ = torch.ops.flydsl.layer_norm(x, [8], w, b)
    with op_recorder() as rec:
        torch.autograd.grad(out, (x, w, b), torch.ones(4, 8, device="meta"))
    assert "flydsl.layer_norm_backward.default" in rec.names
    assert not [name for name in rec.names if "zero" in name or "fill" in name], rec.names


def test_gradient_of_residual_out_alone():
    x, r, w = _leaf(4, 8), _leaf(4, 8), _leaf(8)
    _, residual_out, _ = torch.ops.flydsl.fused_add_rms_norm(x, r, [8], w)
    dx, dr, dw = torch.autograd.grad(residual_out, (x, r, w), torch.ones(4, 8, device="meta"), allow_unused=True)
    assert dx.shape == dr.shape == (4, 8) and dw is None


def _parameters(fn) -> list:
    return list(inspect.signature(fn).parameters)


def test_the_ops_call_the_zoo_entry_points_with_these_arguments():
    # ops.py calls flydsl.kernels' public functions (the first call of a signature validates and routes, later ones
    # run its plan: flydsl.kernels.plans), outputs by keyword.
    import flydsl.kernels as zoo

    assert _parameters(zoo.softmax) == ["x", "out"]
    assert _parameters(zoo.softmax_backward) == ["dy", "y", "dx"]
    assert _parameters(zoo.layer_norm) == ["x", "weight", "bias", "eps", "out", "mean", "rstd", "return_stats"]
    assert _parameters(zoo.layer_norm_backward) == ["dy", "x", "weight", "mean", "rstd", "dx", "dweight", "dbias"]
    assert _parameters(zoo.rms_norm) == ["x", "weight", "eps", "out", "rstd", "return_stats"]
    assert _parameters(zoo.rms_norm_backward) == ["dy", "x", "weight", "rstd", "dx", "dweight"]
    assert _parameters(zoo.fused_add_rms_norm) == [
        "x", "residual", "weight", "eps", "out", "residual_out", "rstd", "return_stats"
    ]  # fmt: skip


def test_only_plain_cuda_tensors_skip_the_dispatcher():
    # CPU tensors and fake tensors go through the ops (which raise naming the argument, or trace); a plain CUDA
    # tensor's key set, with or without autograd keys, is what _plain_keyset accepts (checked on the GPU too).
    from torch._subclasses.fake_tensor import FakeTensorMode

    assert not _registry.eager(torch.zeros(2, 4))
    with FakeTensorMode() as mode:
        assert not _registry.eager(mode.from_tensor(torch.zeros(2, 4)))
    keys = torch._C.DispatchKey
    plain = torch._C.DispatchKeySet(keys.CUDA).add(keys.ADInplaceOrView).add(keys.AutogradCUDA).add(keys.AutocastCUDA)
    assert _registry._plain_keyset(plain.raw_repr())
    assert not _registry._plain_keyset(plain.add(keys.Python).raw_repr())
    assert not _registry._plain_keyset(torch._C._dispatch_keys(torch.zeros(2)).raw_repr())


def test_call_takes_the_op_where_the_dispatcher_is_needed(op_recorder):
    # meta tensors are not plain CUDA tensors: FlyOp.call goes through torch.ops.flydsl (and its fake kernel)
    x = torch.empty(4, 8, device="meta")
    with op_recorder() as rec:
        y = ops.softmax.call(x)
    assert rec.names == ["flydsl.softmax.default"] and y.shape == (4, 8)


def test_validation_describes_torch_tensors_without_checks_or_with_them():
    from flydsl.kernels import validation

    x = torch.zeros(3, 8, dtype=torch.bfloat16)[:, :4]
    t = validation.from_torch(x)
    assert isinstance(t, validation.TensorInfo) and t.obj is x and t.is_torch
    assert (tuple(t.shape), t.strides, t.dtype, t.device, t.pointer) == ((3, 4), (8, 1), "bf16", -1, x.data_ptr())
    assert t == validation.TensorInfo(x, x.shape, (8, 1), "bf16", -1, x.data_ptr())
    with pytest.raises(ValueError, match="flydsl.test: x: expected a CUDA tensor, got one on cpu"):
        validation.describe("flydsl.test", "x", x)
    with pytest.raises(ValueError, match="flydsl.test: x: expected a CUDA tensor"):
        validation.rows("flydsl.test", "x", x)
    assert validation.torch_dtype(torch.float16) == "f16" and validation.torch_dtype(torch.int32) == "int32"


def test_views_of_two_dim_tensors_are_the_tensors_themselves():
    x = torch.zeros(4, 8)
    assert ops._rows(x, 8) is x and ops._out_rows("op", "out", x, 8) is x
    assert ops._rows(torch.zeros(2, 4), 8).shape == (1, 8)  # normalized over both dims: one row
    w = torch.zeros(8)
    assert ops._vector(w) is w and ops._vector(torch.zeros(2, 4)).shape == (8,)
    assert ops._vector(torch.zeros(16)[::2]).stride() == (1,)  # strided: copied
    assert ops._out_vector("op", "rstd", w) is w
