"""flydsl.torch's C++ autograd node (flydsl.torch._nodes) without a GPU: the node's contract on plain torch functions
(gradients, non-differentiable and unused outputs, needs_input_grad, saved tensors and their version checks, no
reference cycle through a saved output, errors), the eager ops' gradients through it equal to the Python Function's
(ops whose kernels are stood in for by torch on CPU tensors), and the fallback where it cannot be built."""

from __future__ import annotations

import gc
import warnings
import weakref

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.utils.cpp_extension")

from flydsl.torch import _nodes, _registry, ops  # noqa: E402
from flydsl.torch import functional as F  # noqa: E402


@pytest.fixture(scope="module")
def node():
    try:
        return _nodes.build(quiet=True)
    except Exception as error:  # no compiler or ninja here: the fallback's own test still runs
        pytest.skip(f"the C++ autograd node cannot be built here: {error}")


def _scale_gradients(node, calls: list):
    """y = x * w (and stat = x.sum(), never differentiable) as a node's op, saving x (an input) and y (an output)."""

    def setup(ctx, inputs, result):
        x, w = inputs
        y, stat = result
        ctx.mark_non_differentiable(stat)
        ctx.save_for_backward(x, w, y)
        ctx.tag = "scale"

    def backward(ctx, dy, dstat):
        x, w, y = ctx.saved_tensors
        calls.append((ctx.tag, ctx.needs_input_grad, dy is None, dstat, y.grad_fn is None))
        if dy is None:
            return None, None
        return dy * w, (dy * x).sum(0)

    return node.Gradients("scale", setup, backward, _nodes.NodeContext, False)


def _forward(x, w):
    return x * w, x.sum()


def test_gradients_outputs_and_context(node):
    calls = []
    gradients = _scale_gradients(node, calls)
    x, w = torch.randn(4, 3, requires_grad=True), torch.randn(3, requires_grad=True)
    y, stat = gradients.apply(_forward, (x, w))
    assert y.grad_fn.name() == "FlyBackward_scale" and not stat.requires_grad
    dy = torch.randn(4, 3)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
    expected = torch.autograd.grad(xr * wr, (xr, wr), dy)
    torch.testing.assert_close((dx, dw), expected)
    # the context's attributes reach the backward; the unused output's gradient is None; the saved output unpacks
    assert calls == [("scale", (True, True), False, None, False)]


def test_a_declared_setup_records_without_python(node):
    """Gradients(declared=Saved(...).spec()): the node saves the declared inputs and outputs, leaves the
    non-differentiable output alone and calls no setup_context; a backward in Python gets a context made then, with
    needs_input_grad, the declared values and the saved tensors in order. Saved itself, as a setup_context, does the
    same through Python."""
    saved = _nodes.Saved(
        tensors=(("input", 0), ("input", 1), ("output", 0)), non_differentiable=(1,), values=(("tag", 2),)
    )
    seen = []

    def backward(ctx, dy, dstat):
        x, w, y = ctx.saved_tensors
        seen.append((ctx.tag, ctx.needs_input_grad, dstat, y.grad_fn is None))
        return dy * w, (dy * x).sum(0), None

    def never(*args):
        raise AssertionError("a declared setup is not called on the node's path")

    gradients = node.Gradients("declared", never, backward, _nodes.NodeContext, False, None, saved.spec())
    x, w = torch.randn(4, 3, requires_grad=True), torch.randn(3, requires_grad=True)
    y, stat = gradients.apply(lambda x, w, tag: (x * w, x.sum()), (x, w, "scaled"))
    assert y.grad_fn.name() == "FlyBackward_declared" and not stat.requires_grad
    dy = torch.randn(4, 3)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    torch.testing.assert_close((dx, dw), (dy * w, (dy * x).sum(0)))
    assert seen == [("scaled", (True, True, False), None, False)]
    ctx = _nodes.NodeContext()
    saved(ctx, (x, w, "scaled"), (y, stat))
    assert ctx.to_save[0] is x and ctx.to_save[1] is w and ctx.to_save[2] is y
    assert ctx.non_differentiable == (stat,) and ctx.tag == "scaled"


def test_apply_kept_looks_the_run_up_by_signature(node):
    """Gradients(kept=(plan_key, plans, transforms_active)).apply_kept(inputs): the run kept for the inputs'
    signature, applied with the node recorded; None where none is kept for it (another shape) or while a functorch
    transform is active (the caller's Python path handles those)."""
    from flydsl.kernels.plans import key_function

    key = key_function()
    saved = _nodes.Saved(tensors=(("input", 1),), non_differentiable=(1,))
    runs = {}

    def backward(ctx, dy, dstat):
        (w,) = ctx.saved_tensors
        return dy * w, None

    kept = (key, runs, torch._C._are_functorch_transforms_active)
    gradients = node.Gradients("kept", saved, backward, _nodes.NodeContext, False, None, saved.spec(), kept)
    x, w = torch.randn(4, 3, requires_grad=True), torch.randn(3)
    assert gradients.apply_kept((x, w)) is None  # nothing kept yet
    runs[key((x, w))] = lambda x, w: (x * w, x.sum())
    y, stat = gradients.apply_kept((x, w))
    assert y.grad_fn.name() == "FlyBackward_kept" and not stat.requires_grad
    (dx,) = torch.autograd.grad(y, (x,), torch.ones_like(y))
    torch.testing.assert_close(dx, w.expand(4, 3))
    assert gradients.apply_kept((torch.randn(5, 3, requires_grad=True), w)) is None  # another signature
    seen = []

    def under_vmap(row):
        seen.append(gradients.apply_kept((row, w)))
        return row

    torch.func.vmap(under_vmap)(x.detach())
    assert seen == [None]
    with pytest.raises(ValueError, match="kept"):
        node.Gradients("kept", saved, backward, _nodes.NodeContext, False, None, None, (key, [], key))


def test_inputs_that_need_no_gradient(node):
    calls = []
    gradients = _scale_gradients(node, calls)
    x, w = torch.randn(4, 3, requires_grad=True), torch.randn(3)
    y, _ = gradients.apply(_forward, (x, w))
    (dx,) = torch.autograd.grad(y.sum(), (x,))
    torch.testing.assert_close(dx, w.expand(4, 3))
    assert calls[0][1] == (True, False)
    y, _ = gradients.apply(_forward, (x.detach(), w))  # nothing needs a gradient: no node at all
    assert y.grad_fn is None and not y.requires_grad
    with torch.no_grad():
        assert gradients.apply(_forward, (x, w))[0].grad_fn is None


def test_the_forward_records_nothing(node):
    seen = []

    def forward(x, w):
        seen.append(torch.is_grad_enabled())
        return _forward(x, w)

    y, _ = _scale_gradients(node, []).apply(forward, (torch.randn(2, 3, requires_grad=True), torch.randn(3)))
    assert seen == [False] and y.grad_fn.name() == "FlyBackward_scale"


def test_a_saved_output_holds_no_reference_to_its_node(node):
    gradients = _scale_gradients(node, [])
    x, w = torch.randn(4, 3, requires_grad=True), torch.randn(3)
    y, _ = gradients.apply(_forward, (x, w))
    alive = weakref.ref(y)
    del y
    gc.collect()
    assert alive() is None


def test_the_context_goes_with_the_graph(node):
    """The backward's context is dropped once the graph is released (not kept until the node dies); a kept graph
    (retain_graph) runs again with it, a released one is refused like torch's own, also where nothing was saved."""
    contexts = []

    def setup(ctx, inputs, result):
        contexts.append(weakref.ref(ctx))

    doubled = node.Gradients("doubled", setup, lambda ctx, dy: dy * 2, _nodes.NodeContext, True)
    x = torch.randn(3, requires_grad=True)
    y = doubled.apply(lambda x: (x * 2,), (x,))
    for _ in range(2):
        (dx,) = torch.autograd.grad(y, (x,), torch.ones(3), retain_graph=True)
        torch.testing.assert_close(dx, torch.full((3,), 2.0))
    assert contexts[0]() is not None
    torch.autograd.grad(y, (x,), torch.ones(3))
    gc.collect()
    assert contexts[0]() is None and y.grad_fn is not None  # the node lives on with the output, its context gone
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        torch.autograd.grad(y, (x,), torch.ones(3))


def test_a_saved_tensor_changed_in_place_is_refused(node):
    gradients = _scale_gradients(node, [])
    x, w = torch.randn(4, 3, requires_grad=True), torch.randn(3)
    y, _ = gradients.apply(_forward, (x, w))
    w.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_errors_of_the_backward_reach_the_caller(node):
    def setup(ctx, inputs, result):
        pass

    def failing(ctx, dy):
        raise ValueError("the backward failed here")

    x = torch.randn(3, requires_grad=True)
    y = node.Gradients("failing", setup, failing, _nodes.NodeContext, True).apply(lambda x: (x * 2,), (x,))
    with pytest.raises(Exception, match="the backward failed here"):
        y.sum().backward()
    two = node.Gradients("two", setup, lambda ctx, dy: (dy, dy), _nodes.NodeContext, True)
    y = two.apply(lambda x: (x * 2,), (x,))
    with pytest.raises(RuntimeError, match="FlyBackward_two: backward returned 2 gradients for 1 inputs"):
        y.sum().backward()


# --- the eager ops through the node ----------------------------------------------------------------------------------


@pytest.fixture
def torch_kernels(monkeypatch):
    """softmax and layer_norm (forward and backward) with torch computing on CPU tensors taken as plain CUDA ones;
    Python plans only (the stand-ins launch nothing a replay could record)."""
    monkeypatch.setenv("FLYDSL_LAUNCH_REPLAY", "0")
    monkeypatch.setattr(_registry, "_plain_keyset", lambda raw: True)
    monkeypatch.setattr(_registry._Op, "_check_devices", lambda self, tensors: None)

    def softmax(x, *, out):
        out.copy_(torch.softmax(x, -1))

    def softmax_backward(dy, y, *, dx):
        dx.copy_(y * (dy - (dy * y).sum(-1, keepdim=True)))

    def layer_norm(x, shape, weight, bias, eps, *, out, mean, rstd):
        rows = x.reshape(-1, shape[-1])
        mean.copy_(rows.mean(-1))
        rstd.copy_((rows.var(-1, unbiased=False) + eps).rsqrt())
        out.copy_(torch.nn.functional.layer_norm(x, shape, weight, bias, eps))

    def layer_norm_backward(dy, x, shape, weight, mean, rstd, *, dx, dweight, dbias):
        xr = x.detach().requires_grad_()
        wr = None if weight is None else weight.detach().requires_grad_()
        br = None if weight is None else torch.zeros_like(weight, requires_grad=True)
        with torch.enable_grad():  # a backward runs with grad mode off
            y = torch.nn.functional.layer_norm(xr, shape, wr, br, 1e-5)
            wanted = [t for t in (xr, wr, br) if t is not None]
            grads = torch.autograd.grad(y, wanted, dy)
        dx.copy_(grads[0])
        if weight is not None:
            dweight.copy_(grads[1])
            dbias.copy_(grads[2])

    for name, impl in [
        ("softmax", softmax),
        ("softmax_backward", softmax_backward),
        ("layer_norm", layer_norm),
        ("layer_norm_backward", layer_norm_backward),
    ]:
        op = getattr(ops, name)
        monkeypatch.setattr(op, "impl", impl)
        monkeypatch.setattr(op._runs, "_plans", {})
        monkeypatch.setattr(op, "_node_gradients", None)


def _gradients(node, monkeypatch, call, *leaves):
    """The call's output's grad_fn name and the leaves' gradients, its gradients through ``node`` (None: the Python
    Function)."""
    monkeypatch.setattr(_nodes, "_module", node)
    for name in ("softmax", "layer_norm"):
        monkeypatch.setattr(getattr(ops, name), "_node_gradients", None)
    out = call(*leaves)
    names = out.grad_fn.name()
    dy = torch.randn_like(out)
    return names, torch.autograd.grad(out, leaves, dy)


def test_eager_ops_take_the_node_and_match_the_python_function(node, torch_kernels, monkeypatch):
    x = torch.randn(6, 32, requires_grad=True)
    w, b = torch.randn(32, requires_grad=True), torch.randn(32, requires_grad=True)
    cases = [
        ("softmax", lambda x: F.softmax(x), (x,)),
        ("layer_norm", lambda x, w, b: F.layer_norm(x, (32,), w, b), (x, w, b)),
        ("layer_norm", lambda x: F.layer_norm(x, 32), (x,)),
    ]
    for op_name, call, leaves in cases:
        torch.manual_seed(0)
        name, through_node = _gradients(node, monkeypatch, call, *leaves)
        torch.manual_seed(0)
        python_name, through_function = _gradients(None, monkeypatch, call, *leaves)
        assert name == f"FlyBackward_{op_name}" and python_name == "EagerFunctionBackward"
        torch.testing.assert_close(through_node, through_function)
    ref = x.detach().requires_grad_()
    torch.manual_seed(0)
    _, (dx,) = _gradients(node, monkeypatch, lambda x: F.softmax(x), x)
    torch.manual_seed(0)
    out = torch.softmax(ref, -1)
    torch.testing.assert_close(dx, torch.autograd.grad(out, (ref,), torch.randn_like(out))[0])


def test_without_a_node_gradients_take_the_python_function(monkeypatch, tmp_path):
    """On by default; where it cannot be built, the process that tried warns once, keeps why (later processes do not
    compile again, and stay quiet unless FLYDSL_TORCH_NODES=1 asks for the node) and leaves the eager ops on the
    Python Function; FLYDSL_TORCH_NODES=0 tries nothing."""
    broken = tmp_path / "autograd_node.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setenv("FLYDSL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(_nodes, "SOURCE", broken)
    monkeypatch.setattr(_nodes, "_module", _nodes._UNSET)
    monkeypatch.setenv("FLYDSL_TORCH_NODES", "0")
    assert _nodes.module() is None and not (tmp_path / "cache").exists()  # nothing built, nothing warned
    monkeypatch.setattr(_nodes, "_module", _nodes._UNSET)
    monkeypatch.delenv("FLYDSL_TORCH_NODES")
    with pytest.warns(RuntimeWarning, match="the C.. autograd node is not available"):
        assert _nodes.module() is None
    assert _nodes.module() is None  # settled for the process
    assert len(list((tmp_path / "cache").rglob("failed.txt"))) == 1
    with pytest.raises(RuntimeError, match="Error"):
        _nodes.build(quiet=True)  # the kept reason, without compiling again
    monkeypatch.setattr(_nodes, "_module", _nodes._UNSET)  # a later process, by default: quiet
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _nodes.module() is None
    monkeypatch.setattr(_nodes, "_module", _nodes._UNSET)  # asked for: warned
    monkeypatch.setenv("FLYDSL_TORCH_NODES", "1")
    with pytest.warns(RuntimeWarning, match="FLYDSL_TORCH_NODES=0 chooses it"):
        assert _nodes.module() is None


def test_a_native_backward_is_checked_when_bound(node):
    """Gradients(native=...): each source a ('grad', i), ('saved', j) or ('context', name), defined arguments among
    them, and the runtime's replay capsule of the version the node speaks; else a ValueError names what is wrong.
    NativeBackward.spec gives what the node takes (CPU tensors then take the Python backward: the node replays
    plans of CUDA tensors only)."""
    from flydsl.compiler._native import launcher

    def bound(native):
        return node.Gradients("probe", lambda *a: None, lambda *a: None, _nodes.NodeContext, True, native)

    learn = lambda *args: None  # noqa: E731
    capsule = launcher._native_replay
    assert bound(((("grad", 0), ("saved", 0), ("context", "n")), (0,), (0, 1), (), learn, capsule)) is not None
    with pytest.raises(ValueError, match="a source is"):
        bound(((("input", 0),), (0,), (), (), learn, capsule))
    with pytest.raises(ValueError, match="out of range"):
        bound(((("grad", 0),), (0,), (1,), (), learn, capsule))
    with pytest.raises(ValueError, match="expected"):
        bound(((("grad", 0),), (0,), learn, capsule))
    spec = _nodes.NativeBackward(ops.softmax_backward, (("grad", 0), ("saved", 0)), (0,)).spec()
    assert spec[:4] == ((("grad", 0), ("saved", 0)), (0,), (), ()) and spec[5] is capsule
    assert spec[4](torch.randn(2, 8), torch.randn(2, 8)) is None  # no kept plan for these: None
