"""The launch levels beneath a zoo op, for benchmarks/host_overhead.py's ``levels`` part: a trivial kernel with six
pointers written in MLIR through the native launcher (``LoadedModule.launch``), the same kernel as ``@flyc.kernel``
launched with six torch tensors, torch's ``x.add_(1)``, a Triton kernel and cuda-bindings' ``cuLaunchKernel`` (a peer
that does not import is skipped, with the reason); and beneath a forward+backward call, ``torch.autograd.grad``
through torch.softmax (C++ autograd nodes), through a Python ``autograd.Function`` that launches noop6 natively
once each way (the backward on the engine's device thread), and through one that only allocates (the floor
of any Python Function: flydsl.torch's gradients are such Functions). Not a script."""

from __future__ import annotations

import ctypes
import functools

import torch
from record import error_text

DEVICE = "cuda"


# Six global pointers; thread 0 of block 0 stores 1.0 through the first.
NOOP6_MLIR = """
module attributes {gpu.container_module} {
  gpu.module @launch_bench {
    gpu.func @noop6(%a: !llvm.ptr<1>, %b: !llvm.ptr<1>, %c: !llvm.ptr<1>, %d: !llvm.ptr<1>, %e: !llvm.ptr<1>,
                    %f: !llvm.ptr<1>) kernel {
      %tid = gpu.thread_id x
      %bid = gpu.block_id x
      %lin = arith.addi %tid, %bid : index
      %c0 = arith.constant 0 : index
      %first = arith.cmpi eq, %lin, %c0 : index
      scf.if %first {
        %one = arith.constant 1.0 : f32
        llvm.store %one, %a : f32, !llvm.ptr<1>
      }
      gpu.return
    }
  }
}
"""


def _noop6_mlir():
    import flydsl.compiler as flyc

    compiled = flyc.compile_mlir(NOOP6_MLIR)
    if compiled.kernels != {"noop6": "pppppp"}:
        raise ValueError(f"noop6: expected six pointer parameters, got {compiled.kernels}")
    return compiled


def _native_level(compiled, tensors, stream):
    from flydsl.compiler import runtime

    launch, (a, b, c, d, e, f) = runtime.load(compiled).launch, tensors

    def native():
        launch("noop6", 1, 32, a, b, c, d, e, f, stream=stream)

    return {"native launch (MLIR noop6, LoadedModule.launch)": native}


@functools.cache
def noop6_module():
    """noop6 compiled from its MLIR and loaded (``LoadedModule``: ``.launch("noop6", grid, block, *six)``)."""
    from flydsl.compiler import runtime

    return runtime.load(_noop6_mlir())


def noop6_kernel():
    """noop6 as a ``@flyc.kernel`` with six ``fx.Tensor`` parameters (defined here: flydsl is imported late, for the
    cold start's sake)."""
    global fx  # the kernel's annotations are resolved in this module's globals
    import flydsl.compiler as flyc
    import flydsl.expr as fx

    @flyc.kernel
    def noop6(a: fx.Tensor, b: fx.Tensor, c: fx.Tensor, d: fx.Tensor, e: fx.Tensor, f: fx.Tensor):
        if fx.gpu.thread_idx.x + fx.gpu.block_idx.x == 0:
            a[0] = fx.Float32(1.0)

    return noop6


def _dsl_level(tensors):
    noop6, (a, b, c, d, e, f) = noop6_kernel(), tensors
    return {"@flyc.kernel noop6(six torch tensors).launch": lambda: noop6(a, b, c, d, e, f).launch(1, 32)}


def _torch_level():
    x = torch.zeros(16, device=DEVICE)
    return {"torch x.add_(1)": lambda: x.add_(1)}


def _triton_level(tensors):
    import triton
    import triton.language as tl

    @triton.jit
    def noop6(a, b, c, d, e, f):
        if tl.program_id(0) == 0:
            tl.store(a, 1.0)

    kernel, (a, b, c, d, e, f) = noop6[(1,)], tensors
    return {f"triton {triton.__version__} noop6[(1,)]": lambda: kernel(a, b, c, d, e, f)}


class AllocatingFunction(torch.autograd.Function):
    """A Python Function that launches nothing: its output and its gradient are fresh allocations (the floor of any
    Python Function; benchmarks/host_layer_cpu.py times it too)."""

    @staticmethod
    def forward(ctx, x):
        y = torch.empty_like(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        return torch.empty_like(grad)


class LaunchingFunction(torch.autograd.Function):
    """:class:`AllocatingFunction` with one native launch (noop6 on the output and its input) in the forward and one
    in the backward, which the autograd engine runs on its device thread: the floor of a Python Function over our
    launcher, against which the zoo's fwd+bwd paths (host_overhead.py) show what their plans and checks add."""

    launch = None  # LoadedModule.launch of noop6

    @staticmethod
    def forward(ctx, x):
        y = torch.empty_like(x)
        LaunchingFunction.launch("noop6", 1, 32, y, x, y, x, y, x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        dx = torch.empty_like(grad)
        LaunchingFunction.launch("noop6", 1, 32, dx, grad, dx, grad, dx, grad)
        return dx


def _autograd_level(compiled=None):
    x = torch.randn(8, 1024, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    ones = torch.ones_like(x)
    allocating = AllocatingFunction.apply
    levels = {
        "autograd.grad(torch.softmax(x)) (fwd+bwd)": lambda: torch.autograd.grad(torch.softmax(x, -1), (x,), ones),
        "autograd.grad(Python Function, no launch)": lambda: torch.autograd.grad(allocating(x), (x,), ones),
    }
    if compiled is not None and not isinstance(compiled, Exception):
        from flydsl.compiler import runtime

        LaunchingFunction.launch = runtime.load(compiled).launch
        launching = LaunchingFunction.apply
        levels["autograd.grad(Python Function, a native launch each way)"] = lambda: torch.autograd.grad(
            launching(x), (x,), ones
        )
    return levels


def _cuda_bindings_level(compiled, tensors, stream_handle):
    from cuda.bindings import driver as cu

    def check(result, what):
        if result[0] != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"{what}: {result[0]}")
        return result[1:]

    image = compiled.image if compiled.cubin is not None else compiled.ptx.encode() + b"\0"
    (module,) = check(cu.cuModuleLoadData(image), "cuModuleLoadData")
    (kernel,) = check(cu.cuModuleGetFunction(module, b"noop6"), "cuModuleGetFunction")
    stream, types = cu.CUstream(stream_handle), (ctypes.c_void_p,) * len(tensors)

    def packed_per_call():
        params = (tuple(t.data_ptr() for t in tensors), types)
        check(cu.cuLaunchKernel(kernel, 1, 1, 1, 32, 1, 1, 0, stream, params, 0), "cuLaunchKernel")

    # The floor of this API from Python: the pointer array built once, passed as an address.
    values = (ctypes.c_uint64 * len(tensors))(*(t.data_ptr() for t in tensors))
    pointers = (ctypes.c_void_p * len(tensors))(*(ctypes.addressof(values) + 8 * i for i in range(len(tensors))))

    def prepacked():
        check(cu.cuLaunchKernel(kernel, 1, 1, 1, 32, 1, 1, 0, stream, ctypes.addressof(pointers), 0), "cuLaunchKernel")

    prepacked.keep_alive = (values, pointers, module)
    return {
        "cuda-bindings cuLaunchKernel, args packed per call": packed_per_call,
        "cuda-bindings cuLaunchKernel, args pre-packed": prepacked,
    }


def measure_levels(calls: int, repeats: int, timed) -> list[dict]:
    """One row per level: its timing by ``timed(fn, calls, repeats)`` (a dict: ``host_us``, or ``error``), its error,
    or (a peer that does not import) why it was skipped."""
    rows = []
    try:
        tensors = [torch.zeros(64, device=DEVICE) for _ in range(6)]
        stream = torch.cuda.current_stream().cuda_stream
    except Exception as error:  # noqa: BLE001
        return [{"level": "all", "error": error_text(error)}]
    try:
        compiled = _noop6_mlir()
    except Exception as error:  # noqa: BLE001 - the two levels that launch it report it
        compiled = error

    def with_compiled(build):
        if isinstance(compiled, Exception):
            raise RuntimeError(f"noop6 did not compile: {error_text(compiled)}")
        return build(compiled, tensors, stream)

    builders = {
        "native": lambda: with_compiled(_native_level),
        "flyc.kernel": lambda: _dsl_level(tensors),
        "torch": _torch_level,
        "triton": lambda: _triton_level(tensors),
        "cuda-bindings": lambda: with_compiled(_cuda_bindings_level),
        "autograd": lambda: _autograd_level(compiled),
    }
    for name, build in builders.items():
        try:
            cases = build()
        except ImportError as error:
            rows.append({"level": name, "skipped": f"does not import here: {error_text(error)}"})
            continue
        except Exception as error:  # noqa: BLE001 - a level that cannot be built is reported, not fatal
            rows.append({"level": name, "error": error_text(error)})
            continue
        for label, fn in cases.items():
            rows.append({"level": label, **timed(fn, calls, repeats)})
    return rows


def level_table(rows: list[dict]) -> str:
    lines = []
    for row in rows:
        value = f"{row['host_us']:8.2f} us" if "host_us" in row else row.get("error") or f"skipped: {row['skipped']}"
        lines.append(f"  {row['level']:<52} {value.splitlines()[0]}")
    return "\n".join(["launch levels (host time per launch):", *lines])
