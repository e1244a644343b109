"""The C++ autograd node's native backward on a GPU (flydsl.torch._nodes.NativeBackward): softmax's backward replayed
by the node without Python once a backward through Python has shown its plan, with the same gradients as the Python
path; other signatures, plans forgotten by ``plans.clear_all`` and ``create_graph`` take the Python path."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.utils.cpp_extension")

from flydsl.kernels import plans  # noqa: E402
from flydsl.torch import _nodes, ops  # noqa: E402
from flydsl.torch import functional as F  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture
def node(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    try:
        built = _nodes.build(quiet=True)
    except Exception as error:  # no compiler or ninja here
        pytest.skip(f"the C++ autograd node cannot be built here: {error}")
    monkeypatch.setattr(_nodes, "_module", built)
    monkeypatch.setattr(ops.softmax, "_node_gradients", None)
    yield built
    plans.clear_all()


def _softmax_gradient(x, dy):
    leaf = x.detach().requires_grad_()
    out = F.softmax(leaf)
    assert out.grad_fn.name() == "FlyBackward_softmax"
    return torch.autograd.grad(out, (leaf,), dy)[0]


def _reference(x, dy):
    leaf = x.detach().double().requires_grad_()
    return torch.autograd.grad(torch.softmax(leaf, -1), (leaf,), dy.double())[0]


def test_softmax_backward_replays_natively(node):
    shape = (8, 1024)
    gradients = None
    for _ in range(6):
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        dx = _softmax_gradient(x, dy)
        gradients = ops.softmax._node_gradients
        torch.testing.assert_close(dx.double(), _reference(x, dy), rtol=2e-2, atol=2e-3)
    # the first backward of the signature went through Python (and the plan's first replay may record); the rest
    # were replayed by the node
    assert gradients.native_replays >= 3
    before = gradients.native_replays
    # another signature (dy expanded: stride 0 along the rows) goes through Python, right all the same
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(1, shape[1], device="cuda", dtype=torch.bfloat16).expand(shape)
    torch.testing.assert_close(_softmax_gradient(x, dy).double(), _reference(x, dy), rtol=2e-2, atol=2e-3)
    assert gradients.native_replays == before
    # plans forgotten: the node forgets its own, and learns them again from the next Python backward
    plans.clear_all()
    x, dy = torch.randn(shape, device="cuda", dtype=torch.bfloat16), torch.randn(shape, device="cuda").bfloat16()
    torch.testing.assert_close(_softmax_gradient(x, dy).double(), _reference(x, dy), rtol=2e-2, atol=2e-3)
    assert gradients.native_replays == before
    for _ in range(3):
        _softmax_gradient(x, dy)
    assert gradients.native_replays > before


def test_native_and_python_backwards_agree_bit_for_bit(node):
    x = torch.randn(64, 4096, device="cuda", dtype=torch.float16)
    dy = torch.randn_like(x)
    first = _softmax_gradient(x, dy)  # through Python
    again = [_softmax_gradient(x, dy) for _ in range(3)]  # replayed by the node
    assert ops.softmax._node_gradients.native_replays >= 1
    for dx in again:
        assert torch.equal(dx, first)


def test_create_graph_takes_the_python_path(node):
    x = torch.randn(4, 256, device="cuda", dtype=torch.float32)
    dy = torch.randn_like(x)
    for _ in range(3):
        _softmax_gradient(x, dy)
    before = ops.softmax._node_gradients.native_replays
    leaf = x.detach().requires_grad_()
    (dx,) = torch.autograd.grad(F.softmax(leaf), (leaf,), dy, create_graph=True)
    assert ops.softmax._node_gradients.native_replays == before
    torch.testing.assert_close(dx.double(), _reference(x, dy), rtol=1e-4, atol=1e-5)


def _norm_gradients(name, x, w, b, dy):
    leaves = [t.detach().requires_grad_() if t is not None else None for t in (x, w, b)]
    lx, lw, lb = leaves
    if name == "rms_norm":
        out = F.rms_norm(lx, (x.shape[-1],), lw)
    else:
        out = F.layer_norm(lx, (x.shape[-1],), lw, lb)
    assert out.grad_fn.name() == f"FlyBackward_{name}"
    wanted = [t for t in leaves if t is not None]
    return torch.autograd.grad(out, wanted, dy)


@pytest.mark.parametrize("name, bias", [("rms_norm", False), ("layer_norm", True), ("layer_norm", False)])
def test_norm_backwards_replay_natively_with_the_python_paths_bits(node, monkeypatch, name, bias):
    """rms_norm and layer_norm: their backward ops' plans (normalized_shape from the context: kept per forward
    plan) replayed by the node give the Python path's gradients bit for bit (dx, dweight, dbias)."""
    monkeypatch.setattr(getattr(ops, name), "_node_gradients", None)
    n = 2048
    x = torch.randn(32, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16) if bias else None
    dy = torch.randn_like(x)
    first = _norm_gradients(name, x, w, b, dy)  # through Python: the plan is learnt
    again = [_norm_gradients(name, x, w, b, dy) for _ in range(3)]
    assert getattr(ops, name)._node_gradients.native_replays >= 2
    for grads in again:
        assert all(torch.equal(a, e) for a, e in zip(grads, first, strict=True))
    # another normalized shape of the same x: another forward plan, so the backward is learnt again, not reused
    before = getattr(ops, name)._node_gradients.native_replays
    leaf = x.detach().requires_grad_()
    out = F.rms_norm(leaf, (32, n)) if name == "rms_norm" else F.layer_norm(leaf, (32, n))
    (dx,) = torch.autograd.grad(out, (leaf,), dy)
    ref_leaf = x.detach().float().requires_grad_()
    norm = torch.nn.functional.rms_norm if name == "rms_norm" else torch.nn.functional.layer_norm
    (expected,) = torch.autograd.grad(norm(ref_leaf, (32, n)), (ref_leaf,), dy.float())
    torch.testing.assert_close(dx.float(), expected, rtol=5e-2, atol=5e-2)
    assert getattr(ops, name)._node_gradients.native_replays == before


def test_fused_add_rms_norm_replays_natively_only_without_residual_gradients(node, monkeypatch):
    """fused_add_rms_norm: replayed by the node where only its output is differentiated (x and residual both take
    the norm's dx); with residual_out's gradient too (added in Python) through Python, the same either way."""
    monkeypatch.setattr(ops.fused_add_rms_norm, "_node_gradients", None)
    n = 4096
    x, r = (torch.randn(16, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dy, dres = torch.randn_like(x), torch.randn_like(x)

    def gradients(with_residual: bool):
        lx, lr, lw = (t.detach().requires_grad_() for t in (x, r, w))
        out, residual_out = F.fused_add_rms_norm(lx, lr, (n,), lw)
        assert out.grad_fn.name() == "FlyBackward_fused_add_rms_norm"
        if with_residual:
            return torch.autograd.grad((out, residual_out), (lx, lr, lw), (dy, dres))
        return torch.autograd.grad(out, (lx, lr, lw), dy)

    first = gradients(False)
    again = [gradients(False) for _ in range(3)]
    node_gradients = ops.fused_add_rms_norm._node_gradients
    assert node_gradients.native_replays >= 2
    for grads in again:
        assert all(torch.equal(a, e) for a, e in zip(grads, first, strict=True))
    before = node_gradients.native_replays
    both = gradients(True)
    assert node_gradients.native_replays == before
    torch.testing.assert_close(both[0].float(), first[0].float() + dres.float(), rtol=2e-2, atol=2e-2)
    assert torch.equal(both[0], both[1]) and torch.equal(both[2], first[2])
