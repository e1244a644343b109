"""fx.math and float division on float32: CUDA's defaults without -use_fast_math (IEEE sqrt and division, libdevice's
expf/logf, the 2-ulp rsqrt and exp2 instructions), its fast versions under ``fastmath="afn"`` or ``fx.fastmath()``.
CPU: the PTX instructions. GPU (``gpu``): sqrt and division are correctly rounded, bit for bit against torch."""

from __future__ import annotations

import re

import pytest

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import gpu, math

F32 = flyc.TensorSpec((256,), "f32")


def _ptx_of(op) -> str:
    """The PTX of ``y[i] = op(x[i])`` over float32."""

    @flyc.kernel
    def apply(x: fx.Tensor, y: fx.Tensor):
        i = gpu.thread_idx.x
        y[i] = op(x[i])

    return apply.lower(F32, F32).ptx


def _opcodes(ptx: str) -> set[str]:
    return {line.split()[0] for line in ptx.splitlines() if re.match(r"\s+[a-z]", line)}


@pytest.mark.parametrize(
    "op, cuda, absent",
    [
        (math.sqrt, "sqrt.rn.f32", "sqrt.approx.f32"),  # sqrtf; math.sqrt alone gave sqrt.approx.f32
        (lambda v: v / (v + 1.0), "div.rn.f32", "div.approx.f32"),  # x / y
        (lambda v: 1.0 / v, "rcp.rn.f32", "rcp.approx.f32"),  # 1.0f / x
        (math.rsqrt, "rsqrt.approx.f32", None),  # rsqrtf is the 2-ulp instruction
        (math.exp2, "ex2.approx.f32", None),  # exp2f is the 2-ulp instruction
        (math.exp, "ex2.approx.ftz.f32", "lg2.approx.f32"),  # __nv_expf: a range reduction around ex2
        (math.log, "fma.rn.f32", "lg2.approx.f32"),  # __nv_logf: a polynomial, no lg2.approx
    ],
)
def test_float32_defaults_are_cudas(op, cuda, absent):
    opcodes = _opcodes(_ptx_of(op))
    assert cuda in opcodes, sorted(opcodes)
    assert absent not in opcodes


def test_exp_is_libdevice_not_the_fast_version():
    # expf: ex2 of a two-part product x * log2(e) (an error-compensated reduction), not __expf's single multiply.
    default, fast = _ptx_of(math.exp), _ptx_of(lambda v: math.exp(v, fastmath="afn"))
    assert len(default.splitlines()) > len(fast.splitlines()) + 5
    assert "ex2.approx.f32" in _opcodes(fast) and "mul.rn.f32" in _opcodes(fast)


@pytest.mark.parametrize(
    "op, fast",
    [
        (lambda v: math.sqrt(v, fastmath="afn"), "sqrt.approx.f32"),
        (lambda v: math.sqrt(v, fastmath="fast"), "sqrt.approx.f32"),
        (lambda v: math.log(v, fastmath="afn"), "lg2.approx.f32"),
        (lambda v: math.exp(v, fastmath="fast"), "ex2.approx.f32"),
    ],
)
def test_fastmath_flag_asks_for_the_approximation(op, fast):
    assert fast in _opcodes(_ptx_of(op))


def test_fastmath_region():
    def body(v):
        with fx.fastmath():
            s = math.sqrt(v) + v / (v + 2.0)
            precise = math.sqrt(v + 1.0, fastmath="none")  # a call's own flags win over the region's
        return s + precise + math.sqrt(v + 3.0) + v / (v + 4.0)  # after the region: the defaults again

    opcodes = _opcodes(_ptx_of(body))
    assert {"sqrt.approx.f32", "div.approx.f32", "sqrt.rn.f32", "div.rn.f32"} <= opcodes


def test_fastmath_region_of_the_launching_code_does_not_reach_the_kernel():
    with fx.fastmath():
        opcodes = _opcodes(_ptx_of(lambda v: math.sqrt(v) / (v + 1.0)))
    assert "sqrt.rn.f32" in opcodes and "div.rn.f32" in opcodes


def test_other_widths():
    # Float64 is IEEE; 16-bit floats round an approximate float32 square root, as CUDA's hsqrt.
    assert "sqrt.rn.f64" in _opcodes(_ptx_of(lambda v: math.sqrt(v.to(fx.Float64)).to(fx.Float32)))
    half = _opcodes(_ptx_of(lambda v: math.sqrt(v.to(fx.BFloat16)).to(fx.Float32)))
    assert "sqrt.approx.f32" in half
    with pytest.raises(TypeError, match="sqrt: expected a float"):
        _ptx_of(lambda v: math.sqrt(v.to(fx.Int32)))


@flyc.kernel
def sqrt_and_divide(x: fx.Tensor, y: fx.Tensor, root: fx.Tensor, quotient: fx.Tensor, n: fx.Int32):
    i = gpu.block_idx.x * gpu.block_dim.x + gpu.thread_idx.x
    if i < n:
        root[i] = math.sqrt(x[i])
        quotient[i] = x[i] / y[i]


@pytest.mark.gpu
def test_sqrt_and_division_are_correctly_rounded():
    torch = pytest.importorskip("torch")
    n = 1 << 20
    generator = torch.Generator(device="cuda").manual_seed(0)
    # Every exponent from subnormals to 2^127, random mantissas: where sqrt.approx.f32 differs from IEEE.
    bits = torch.randint(1, 0x7F800000, (n,), device="cuda", generator=generator, dtype=torch.int32)
    x = bits.view(torch.float32)
    y = torch.randint(1, 0x7F800000, (n,), device="cuda", generator=generator, dtype=torch.int32).view(torch.float32)
    root, quotient = torch.full_like(x, float("nan")), torch.full_like(x, float("nan"))
    sqrt_and_divide(x, y, root, quotient, n).launch(grid=n // 256, block=256)
    torch.cuda.synchronize()
    assert torch.equal(root, torch.sqrt(x.double()).float())  # rounding the exact double root is IEEE sqrt
    assert torch.equal(quotient, (x.double() / y.double()).float())
