"""vector: Vector values and the seed's vector helpers. CPU: IR and PTX (widths, registers, loops); GPU (``gpu``):
element-wise results against torch."""

from __future__ import annotations

import re

import pytest

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import T, gpu, vector
from flydsl.expr.vector import Vector, vector_class

from .fakes import FakeGpuTensor


@flyc.kernel
def vector_ops(x: fx.Tensor, y: fx.Tensor, stats: fx.Tensor):
    """Per thread t, on x[4t : 4t+4] = v: y gets v * 2 + v[0], then bf16-rounded v, then (a, b, c, d) built from
    elements; stats[t] = max(v)."""
    t = gpu.block_idx.x * gpu.block_dim.x + gpu.thread_idx.x
    v = vector.load_op(T.f32x4, x, [t * 4])
    w = v * 2.0 + vector.extract(v, static_position=[0])
    vector.store(w, y, [t * 16])
    rounded = v.to(fx.BFloat16).to(fx.Float32)
    vector.store(rounded, y, [t * 16 + 4])
    built = vector.from_elements(T.f32x4, [v[3], v[2], 1.5, -v[0]])
    built = vector.insert(v[1] * v[1], built, static_position=[2])
    vector.store(built, y, [t * 16 + 8])
    bits = vector.bitcast(T.i32x4, v)
    vector.store((bits ^ 0).bitcast(fx.Float32) - vector.broadcast(T.f32x4, v[0]), y, [t * 16 + 12])
    stats[t] = v.reduce("max")


@flyc.kernel
def loop_carried(x: fx.Tensor, y: fx.Tensor, n: fx.Int32):
    """y[4t : 4t+4] = n * x[4t : 4t+4], summed in a dynamic loop on a Vector."""
    t = gpu.thread_idx.x
    v = vector.load_op(T.f32x4, x, [t * 4])
    acc = Vector.of(fx.Float32, 4)(0.0)
    for _ in range(n):
        acc = acc + v
    vector.store(acc, y, [t * 4])


def _trace(kernel, *args) -> str:
    return kernel.trace(kernel.specialize(kernel._bind(list(args), {})).key)


def _tensors(*sizes):
    return [FakeGpuTensor((n,), pointer=(1 << 20) + k * (1 << 16)) for k, n in enumerate(sizes)]


def test_vector_classes_are_cached_per_element_and_length():
    cls = vector_class(fx.Float32, 4)
    assert cls is Vector.of(fx.Float32, 4) and cls.__name__ == "Float32x4"
    assert cls.mlir_name == "vector<4xf32>" and cls.length == 4 and cls.width == 128
    assert issubclass(cls, fx.Numeric)
    with pytest.raises(ValueError):
        vector_class(fx.Float32, 0)


def test_type_shorthands_name_scalars_and_vectors_fp8_included():
    from mlir import ir

    from flydsl.compiler.context import make_context

    with make_context(), ir.Location.unknown():
        assert str(T.f8e4m3fnx16) == "vector<16xf8E4M3FN>" and str(T.f8e5m2x4) == "vector<4xf8E5M2>"
        assert str(T.f8e4m3fn) == "f8E4M3FN" and str(T.bf16x8) == "vector<8xbf16>" and str(T.i32) == "i32"
        assert vector_class(T.f8e4m3fnx16) is Vector.of(fx.Float8E4M3FN, 16)
        with pytest.raises(AttributeError, match="f7"):
            _ = T.f7x2


def test_vector_kernel_compiles_to_16_byte_accesses_in_registers():
    module = vector_ops.lower(*_tensors(400, 1600, 100))
    ptx = module.ptx
    assert ptx.count("ld.global.v4.b32") == 1
    assert ptx.count("st.global.v4.b32") == 4
    assert "cvt.rn.bf16x2.f32" in ptx and "max.NaN.f32" in ptx  # f32 -> bf16 two at a time
    # bf16 -> f32 is exact: per 32-bit word, the low half shifted up and the high half masked (no cvt, no prmt)
    assert "and.b32" in ptx and "-65536" in ptx and "cvt.f32.bf16" not in ptx and "prmt" not in ptx
    assert ".local" not in ptx and "%SP" not in ptx
    assert module.cubin is not None or flyc.find_ptxas() is None


def test_vectors_are_carried_through_dynamic_loops():
    text = _trace(loop_carried, *_tensors(128, 128), 3)
    assert re.search(r"scf.for .* iter_args\(.*\) -> \(vector<4xf32>\)", text)
    assert "dense<0.000000e+00> : vector<4xf32>" in text
    loop_carried.lower(*_tensors(128, 128), 3)


def test_dynamic_element_index():
    @flyc.kernel
    def pick(x: fx.Tensor, y: fx.Tensor):
        t = gpu.thread_idx.x
        v = vector.load_op(T.f32x4, x, [t * 4])
        y[t] = v[t % 4] + vector.extract(v, dynamic_position=[(t + 1) % 4])

    text = _trace(pick, *_tensors(128, 32))
    assert re.search(r"vector.extract %\w+\[%\w+\] : f32 from vector<4xf32>", text)
    pick.lower(*_tensors(128, 32))


def test_type_errors_name_the_types():
    @flyc.kernel
    def mixed(x: fx.Tensor):
        v = vector.load_op(T.f32x4, x, [0])
        v + Vector.of(fx.Float32, 2)(1.0)

    @flyc.kernel
    def short(x: fx.Tensor):
        vector.from_elements(T.f32x4, [x[0], x[1]])

    @flyc.kernel
    def wrong_element(x: fx.Tensor):
        vector.load_op(T.i32x4, x, [0])

    with pytest.raises(TypeError, match="Float32x4 and Float32x2"):
        _trace(mixed, *_tensors(8))
    with pytest.raises(ValueError, match="needs 4 elements, got 2"):
        _trace(short, *_tensors(8))
    with pytest.raises(TypeError, match="Int32x4 from a tensor of Float32"):
        _trace(wrong_element, *_tensors(8))


# --- GPU -----------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_vector_ops_match_torch():
    torch = pytest.importorskip("torch")
    threads = 256
    x = torch.randn(threads * 4, device="cuda")
    y = torch.full((threads * 16,), float("nan"), device="cuda")
    stats = torch.full((threads,), float("nan"), device="cuda")
    vector_ops(x, y, stats).launch(grid=2, block=128)
    torch.cuda.synchronize()
    v = x.cpu().view(threads, 4)
    got = y.cpu().view(threads, 4, 4)
    assert torch.equal(got[:, 0], v * 2.0 + v[:, :1])
    assert torch.equal(got[:, 1], v.to(torch.bfloat16).float())
    built = torch.stack([v[:, 3], v[:, 2], v[:, 1] * v[:, 1], -v[:, 0]], dim=1)
    assert torch.equal(got[:, 2], built)
    assert torch.equal(got[:, 3], v - v[:, :1])
    assert torch.equal(stats.cpu(), v.max(dim=1).values)


@pytest.mark.gpu
def test_loop_carried_vectors():
    torch = pytest.importorskip("torch")
    x = torch.randn(128 * 4, device="cuda")
    y = torch.full_like(x, float("nan"))
    loop_carried(x, y, 5).launch(grid=1, block=128)
    torch.cuda.synchronize()
    expected = x.cpu() + x.cpu() + x.cpu() + x.cpu() + x.cpu()  # the kernel's order of additions
    assert torch.equal(y.cpu(), expected)


@flyc.kernel
def halves(x: fx.Tensor, y: fx.Tensor):
    """y[4t : 4t+4] = (x[4t+2], x[4t+3], x[4t], x[4t+1]): the two halves of a loaded vector, swapped by slicing."""
    t = gpu.thread_idx.x
    v = vector.load_op(T.f32x4, x, [t * 4])
    vector.store(v[2:4], y, [t * 4])
    vector.store(v[:2], y, [t * 4 + 2])


def test_vector_slices_lower_to_ptx():
    module = halves.lower(*_tensors(512, 512))
    assert "vector.extract_strided_slice" not in _trace(halves, *_tensors(512, 512))
    assert module.ptx.count("st.global.v2.b32") == 2
    assert module.cubin is not None or flyc.find_ptxas() is None


@pytest.mark.gpu
def test_vector_slices_on_gpu():
    torch = pytest.importorskip("torch")
    x = torch.randn(128 * 4, device="cuda")
    y = torch.full_like(x, float("nan"))
    halves(x, y).launch(grid=1, block=128)
    torch.cuda.synchronize()
    assert torch.equal(y.view(-1, 2, 2), x.view(-1, 2, 2).flip(1))
