"""DSL kernels on the GPU: results against torch in higher precision, outputs poisoned first (marked ``gpu``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import gpu, math

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu


@flyc.kernel
def vadd(a: fx.Tensor, b: fx.Tensor, c: fx.Tensor, n: fx.Int32):
    i = gpu.block_idx.x * gpu.block_dim.x + gpu.thread_idx.x
    if i < n:
        c[i] = a[i] + b[i]


@flyc.kernel
def row_sums(x: fx.Tensor, out: fx.Tensor, rows: fx.Int32, cols: fx.Int32):
    row = gpu.block_idx.x * gpu.block_dim.x + gpu.thread_idx.x
    if row < rows:
        acc = fx.Float32(0.0)
        for j in range(cols):
            acc = acc + x[row, j]
        out[row] = acc


@flyc.kernel
def next_power_of_two(x: fx.Tensor, out: fx.Tensor, n: fx.Int32):
    i = gpu.block_idx.x * gpu.block_dim.x + gpu.thread_idx.x
    if i < n:
        value = x[i]
        p = fx.Int32(1)
        while p < value:
            p = p * 2
        out[i] = p


@flyc.kernel
def clamp_sign(x: fx.Tensor, out: fx.Tensor, n: fx.Int32):
    i = gpu.block_idx.x * gpu.block_dim.x + gpu.thread_idx.x
    if i < n:
        v = x[i]
        if v < 0.0:
            r = fx.Float32(-1.0)
        elif v > 0.0:
            r = fx.Float32(1.0)
        else:
            r = fx.Float32(0.0)
        out[i] = r


@flyc.kernel
def guarded_scale(x: fx.Tensor, out: fx.Tensor, n: fx.Int32):
    i = gpu.block_idx.x * gpu.block_dim.x + gpu.thread_idx.x
    if i >= n:  # an early exit: the rest of the kernel is the else of an scf.if
        return
    out[i] = x[i] * 2.0


@flyc.kernel
def first_negative(x: fx.Tensor, out: fx.Tensor, rows: fx.Int32, cols: fx.Int32):
    """Per row, the index of the first negative value (cols where none): a break in a dynamic loop."""
    row = gpu.block_idx.x * gpu.block_dim.x + gpu.thread_idx.x
    if row >= rows:
        return
    found = cols
    for j in range(cols):
        if x[row, j] < 0.0:
            found = j
            break
    out[row] = found


@flyc.kernel
def positive_sums(x: fx.Tensor, out: fx.Tensor, rows: fx.Int32, cols: fx.Int32):
    """Per row, the sum of its positive values: a continue in a dynamic loop."""
    row = gpu.block_idx.x * gpu.block_dim.x + gpu.thread_idx.x
    if row >= rows:
        return
    acc = fx.Float32(0.0)
    for j in range(cols):
        if x[row, j] <= 0.0:
            continue
        acc = acc + x[row, j]
    out[row] = acc


@flyc.kernel
def prefix_until_negative(x: fx.Tensor, out: fx.Tensor, rows: fx.Int32, cols: fx.Int32):
    """Per row, out = 1 where x is at or past zero up to the first negative value, and the row's last column 2 only
    where it has none: a return in a dynamic loop (the kernel's rest skipped)."""
    row = gpu.block_idx.x * gpu.block_dim.x + gpu.thread_idx.x
    if row >= rows:
        return
    for j in range(cols):
        if x[row, j] < 0.0:
            return
        out[row, j] = 1.0
    out[row, cols - 1] = 2.0


@flyc.kernel
def first_negative_or_sum(x: fx.Tensor, out: fx.Tensor, rows: fx.Int32, cols: fx.Int32):
    """Per row, the index of the first negative value, or (a loop's else: no break) -1 - the row's sum."""
    row = gpu.block_idx.x * gpu.block_dim.x + gpu.thread_idx.x
    if row >= rows:
        return
    acc = fx.Float32(0.0)
    for j in range(cols):
        if x[row, j] < 0.0:
            out[row] = j.to(fx.Float32)
            break
        acc = acc + x[row, j]
    else:
        out[row] = -1.0 - acc


@flyc.kernel
def transcendental(x: fx.Tensor, out: fx.Tensor, n: fx.Int32):
    i = gpu.block_idx.x * gpu.block_dim.x + gpu.thread_idx.x
    if i < n:
        v = x[i]
        out[i, 0] = math.exp(v)
        out[i, 1] = math.tanh(v)
        out[i, 2] = math.rsqrt(v * v + 1.0)
        out[i, 3] = math.exp2(v, fastmath="fast")


@flyc.kernel
def block_sums(x: fx.Tensor, out: fx.Tensor, warps: fx.Constexpr[int]):
    scratch = fx.SmemAllocator().allocate(fx.Float32, warps)
    i = gpu.block_idx.x * gpu.block_dim.x + gpu.thread_idx.x
    total = gpu.block_reduce(x[i], "add", scratch=scratch, num_warps=warps)
    if gpu.thread_idx.x == 0:
        out[gpu.block_idx.x] = total


def _blocks(n, threads=256):
    return (n + threads - 1) // threads


@pytest.mark.parametrize("n", [1, 255, 256, 1000, 1 << 20])
def test_vadd(n):
    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    c = torch.full((n,), float("nan"), device="cuda")
    vadd(a, b, c, n).launch(grid=_blocks(n), block=256)
    torch.cuda.synchronize()
    assert torch.equal(c, a + b)


def test_vadd_on_a_side_stream_and_bad_devices():
    n = 4096
    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    c = torch.full((n,), float("nan"), device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        vadd(a, b, c, n).launch(grid=_blocks(n), block=256)  # the tensors' current stream
    stream.synchronize()
    assert torch.equal(c, a + b)
    with pytest.raises(ValueError, match="argument 'a': expected a CUDA tensor"):
        vadd(a.cpu(), b, c, n).launch(grid=1, block=256)


@pytest.mark.parametrize("rows, cols", [(1, 1), (37, 53), (1000, 257)])
def test_dynamic_loop_carries_the_sum(rows, cols):
    x = torch.randn(rows, cols, device="cuda")
    out = torch.full((rows,), float("nan"), device="cuda")
    row_sums(x, out, rows, cols).launch(grid=_blocks(rows, 128), block=128)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x.double().sum(1).float(), rtol=1e-5, atol=1e-4)


def test_strided_views_specialize_and_stay_correct():
    base = torch.randn(64, 80, device="cuda")
    x = base[:, :50]  # row stride 80: a multiple of 16 bytes, not contiguous
    out = torch.full((64,), float("nan"), device="cuda")
    row_sums(x, out, 64, 50).launch(grid=1, block=64)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x.double().sum(1).float(), rtol=1e-5, atol=1e-4)


def test_dynamic_while():
    x = torch.randint(1, 5000, (3000,), device="cuda", dtype=torch.int32)
    out = torch.full_like(x, -1)
    next_power_of_two(x, out, x.numel()).launch(grid=_blocks(x.numel()), block=256)
    torch.cuda.synchronize()
    expected = torch.exp2(torch.ceil(torch.log2(x.double()))).round().to(torch.int32)
    assert torch.equal(out, expected)


def test_if_elif_else_results():
    x = torch.randn(5000, device="cuda")
    x[::7] = 0.0
    out = torch.full_like(x, float("nan"))
    clamp_sign(x, out, x.numel()).launch(grid=_blocks(x.numel()), block=256)
    torch.cuda.synchronize()
    assert torch.equal(out, torch.sign(x))


@pytest.mark.parametrize("n", [1, 255, 1000])
def test_an_early_return_guards_the_tail(n):
    x = torch.randn(n, device="cuda")
    out = torch.full((n + 64,), float("nan"), device="cuda")  # past n: never written
    guarded_scale(x, out, n).launch(grid=_blocks(n + 64), block=256)
    torch.cuda.synchronize()
    assert torch.equal(out[:n], x * 2.0) and out[n:].isnan().all()


@pytest.mark.parametrize("rows, cols", [(1, 1), (37, 53), (1000, 257)])
def test_break_and_continue_in_dynamic_loops(rows, cols):
    x = torch.randn(rows, cols, device="cuda") + 0.5
    x[::3] = x[::3].abs()  # rows with no negative value
    found = torch.full((rows,), -1, device="cuda", dtype=torch.int32)
    first_negative(x, found, rows, cols).launch(grid=_blocks(rows, 128), block=128)
    sums = torch.full((rows,), float("nan"), device="cuda")
    positive_sums(x, sums, rows, cols).launch(grid=_blocks(rows, 128), block=128)
    torch.cuda.synchronize()
    negative = x < 0
    expected = torch.where(negative.any(1), negative.int().argmax(1), cols).to(torch.int32)
    assert torch.equal(found, expected)
    torch.testing.assert_close(sums, x.double().clamp(min=0).sum(1).float(), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("rows, cols", [(1, 1), (37, 53), (1000, 257)])
def test_a_return_in_a_dynamic_loop_ends_the_kernel(rows, cols):
    x = torch.randn(rows, cols, device="cuda") + 1.0
    x[::3] = x[::3].abs()  # rows with no negative value
    out = torch.zeros(rows, cols, device="cuda")
    prefix_until_negative(x, out, rows, cols).launch(grid=_blocks(rows, 128), block=128)
    torch.cuda.synchronize()
    negative = x < 0
    first = torch.where(negative.any(1), negative.int().argmax(1), cols)
    expected = (torch.arange(cols, device="cuda")[None, :] < first[:, None]).float()
    expected[~negative.any(1), cols - 1] = 2.0
    assert torch.equal(out, expected)


@pytest.mark.parametrize("rows, cols", [(1, 1), (37, 53), (1000, 257)])
def test_a_loops_else_runs_where_no_break_did(rows, cols):
    x = torch.randn(rows, cols, device="cuda") + 1.0
    x[::3] = x[::3].abs()  # rows with no negative value: their else runs
    out = torch.full((rows,), float("nan"), device="cuda")
    first_negative_or_sum(x, out, rows, cols).launch(grid=_blocks(rows, 128), block=128)
    torch.cuda.synchronize()
    negative = x < 0
    expected = torch.where(negative.any(1), negative.int().argmax(1).float(), -1.0 - x.double().sum(1).float())
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-3)


def test_math_functions_against_float64():
    x = torch.rand(4096, device="cuda") * 4 - 2
    out = torch.full((4096, 4), float("nan"), device="cuda")
    transcendental(x, out, 4096).launch(grid=_blocks(4096), block=256)
    torch.cuda.synchronize()
    d = x.double()
    expected = torch.stack([d.exp(), d.tanh(), (d * d + 1).rsqrt(), torch.exp2(d)], dim=1).float()
    torch.testing.assert_close(out, expected, rtol=2e-6 * 8, atol=1e-6)


@pytest.mark.parametrize("threads", [32, 256, 1024])
def test_block_reduce(threads):
    blocks = 40
    x = torch.randn(blocks * threads, device="cuda")
    out = torch.full((blocks,), float("nan"), device="cuda")
    block_sums(x, out, threads // 32).launch(grid=blocks, block=threads)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x.double().view(blocks, threads).sum(1).float(), rtol=1e-5, atol=1e-4)


def _example(name):
    path = Path(__file__).resolve().parents[2] / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("swizzle", [True, False])
@pytest.mark.parametrize("m, n", [(64, 64), (192, 320), (1024, 2048)])
def test_tiled_copy_example(m, n, swizzle):
    example = _example("tiled_copy")
    src = torch.randn(m, n, device="cuda", dtype=torch.float16)
    dst = torch.full_like(src, float("nan"))
    example.copy_matrix(src, dst, swizzle)
    torch.cuda.synchronize()
    assert torch.equal(src, dst)


@pytest.mark.parametrize("n", [1, 5, 1023, 1 << 20, 1000003])
def test_vector_add_example_handles_tails_through_the_buffer_range(n):
    example = _example("vector_add")
    a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    c = torch.full_like(a, float("nan"))
    example.add(a, b, c)
    torch.cuda.synchronize()
    assert torch.equal(c, a + b)


def test_warp_reduce_of_a_tuple_finds_each_warps_argmax():
    from .test_dsl_kernel import warp_argmax

    warps = 64
    x = torch.randn(warps * 32, device="cuda")
    x[5] = x[7] = x[:32].max() + 1  # a tie: the lower index wins
    best = torch.full((warps,), float("nan"), device="cuda")
    where = torch.full((warps,), -1, device="cuda", dtype=torch.int32)
    warp_argmax(x, best, where).launch(grid=warps, block=32)
    torch.cuda.synchronize()
    values, indices = x.view(warps, 32).max(1)
    torch.testing.assert_close(best, values, rtol=0, atol=0)
    assert where[0].item() == 5
    torch.testing.assert_close(where.long(), indices + torch.arange(warps, device="cuda") * 32)
