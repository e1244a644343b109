"""What the zoo's row entry points launch, found without a GPU: each public function (softmax, layer_norm, ...) is
called on arrays of a stand-in framework, every launch is recorded instead of run (kernel, grid, block, cluster)
and the kernel is compiled for its arguments; the PTX's hash stands for the kernel. ``golden/routed_ptx.json``
holds the launches of every case: a change to the zoo that keeps them is a pure refactor of the generated code.

    python -m tests.kernels.routed_ptx --write         # rewrite the golden file (review its diff first)
    python -m tests.kernels.routed_ptx --cases smoke   # compare a few cases (the CPU test's selection)
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import itertools
import json
import sys
import types
from pathlib import Path
from typing import NamedTuple

GOLDEN = Path(__file__).with_name("golden") / "routed_ptx.json"
SMS = 132  # the H200's SMs: persistent grids are sized by them

_TYPESTR = {"f32": "<f4", "f16": "<f2", "bf16": "<bfloat16", "i32": "<i4"}
_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "i32": 4}


class _Device:
    """``with array.device:`` as cupy's arrays allow."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class DeviceArray:
    """An array of a stand-in GPU framework (named cupy, so the zoo allocates its scratch memory in it), never
    dereferenced: it has a shape, a dtype, strides and an address."""

    _next = 1 << 30

    def __init__(self, shape, dtype="f32", strides=None, offset=0):
        size = _BYTES[dtype]
        self.shape, self.dtype = tuple(shape), dtype
        dense = [1]
        for extent in reversed(self.shape[1:]):
            dense.insert(0, dense[0] * extent)
        span = 1 + sum((d - 1) * s for d, s in zip(self.shape, strides or dense, strict=True))
        pointer = DeviceArray._next + offset
        DeviceArray._next += -(-span * size // 256) * 256 + 256
        byte_strides = None if strides is None else tuple(s * size for s in strides)
        self.__cuda_array_interface__ = {
            "shape": self.shape,
            "typestr": _TYPESTR[dtype],
            "data": (pointer, False),
            "strides": byte_strides,
            "version": 3,
        }
        self.device = _Device()

    def fill(self, value):  # the zoo zeroes team exchanges: nothing to do here
        return None


DeviceArray.__module__ = "cupy"


def _framework() -> types.ModuleType:
    """The stand-in for ``import cupy`` inside the zoo's allocator."""
    module = types.ModuleType("cupy")
    module.float32, module.float16, module.int32 = "f32", "f16", "i32"
    module.empty = lambda shape, dtype: DeviceArray(shape if isinstance(shape, tuple) else (shape,), dtype)
    module.zeros = module.empty
    return module


class Launch(NamedTuple):
    kernel: str
    grid: tuple
    block: tuple
    cluster: tuple | None
    ptx: str  # sha256 of the PTX


def _dims(value) -> tuple:
    if value is None:
        return None
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


@contextlib.contextmanager
def recording():
    """Launches recorded into the yielded list instead of run; the device has :data:`SMS` SMs; cupy is the stand-in
    framework."""
    kernel_module = importlib.import_module("flydsl.compiler.kernel")  # (flydsl.compiler.kernel: the decorator)
    runtime = importlib.import_module("flydsl.compiler.runtime")

    launched: list = []
    hashes: dict = {}

    def launch(self, grid, block, smem=None, stream=None, cluster=None):
        fn = self.kernel
        spec = fn.specialize(fn._bind(self.values, {}))
        key = (fn.name, repr(spec.key))
        if key not in hashes:
            hashes[key] = hashlib.sha256(fn.compiled_module(spec).ptx.encode()).hexdigest()[:16]
        launched.append(Launch(fn.name, _dims(grid), _dims(block), _dims(cluster), hashes[key]))

    def device_attribute(attribute, device=0):
        if attribute != 16:  # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
            raise RuntimeError(f"routed_ptx: device attribute {attribute} not modelled")
        return SMS

    saved = (kernel_module.KernelCall.launch, runtime.device_attribute, sys.modules.get("cupy"))
    kernel_module.KernelCall.launch, runtime.device_attribute = launch, device_attribute
    sys.modules["cupy"] = _framework()
    try:
        yield launched
    finally:
        kernel_module.KernelCall.launch, runtime.device_attribute = saved[:2]
        if saved[2] is None:
            sys.modules.pop("cupy", None)
        else:
            sys.modules["cupy"] = saved[2]


class Case(NamedTuple):
    """One call of a zoo entry point: ``op``, the rows' ``dtype``, ``n`` columns, ``variant`` (which optional inputs
    and outputs: see :func:`_call`) and ``layout`` ("dense", "padded": rows N + 1 elements apart, so not
    16-byte aligned, "offset": the data 2 bytes past a 16-byte boundary)."""

    op: str
    dtype: str
    n: int
    variant: str = "main"
    layout: str = "dense"
    rows: int = 1000

    @property
    def name(self) -> str:
        return f"{self.op}/{self.dtype}/{self.n}/{self.variant}/{self.layout}/{self.rows}"


def _rows(case: Case, dtype: str | None = None) -> DeviceArray:
    dtype = dtype or case.dtype
    if case.layout == "padded":
        return DeviceArray((case.rows, case.n), dtype, strides=(case.n + 1, 1))
    return DeviceArray((case.rows, case.n), dtype, offset=2 if case.layout == "offset" else 0)


def _call(case: Case) -> None:
    """Calls the public entry point of ``case`` with every output given (a stand-in framework allocates no bf16)."""
    import flydsl.kernels as zoo

    n, rows = case.n, case.rows
    weight_dtype = "f32" if case.variant == "f32_weights" else case.dtype
    affine = case.variant != "plain"
    stats = case.variant in ("main", "f32_weights")

    def vec():
        return DeviceArray((n,), weight_dtype) if affine else None

    def stat():
        return DeviceArray((rows,), "f32") if stats else None

    x, out = _rows(case), _rows(case)
    if case.op == "softmax":
        zoo.softmax(x, out=out)
    elif case.op == "softmax_backward":
        zoo.softmax_backward(_rows(case), x, dx=out)
    elif case.op == "layer_norm":
        zoo.layer_norm(x, vec(), vec(), 1e-5, out=out, mean=stat(), rstd=stat())
    elif case.op == "rms_norm":
        zoo.rms_norm(x, vec(), 1e-6, out=out, rstd=stat())
    elif case.op == "fused_add_rms_norm":
        zoo.fused_add_rms_norm(x, _rows(case), vec(), 1e-6, out=out, residual_out=_rows(case), rstd=stat())
    elif case.op == "layer_norm_backward":
        mean, rstd = DeviceArray((rows,), "f32"), DeviceArray((rows,), "f32")
        w = vec()
        grads = (DeviceArray((n,), weight_dtype), DeviceArray((n,), weight_dtype)) if w is not None else (None, None)
        zoo.layer_norm_backward(_rows(case), x, w, mean, rstd, dx=out, dweight=grads[0], dbias=grads[1])
    elif case.op == "rms_norm_backward":
        w = vec()
        grad = DeviceArray((n,), weight_dtype) if w is not None else None
        zoo.rms_norm_backward(_rows(case), x, w, DeviceArray((rows,), "f32"), dx=out, dweight=grad)
    else:
        raise ValueError(f"routed_ptx: unknown op {case.op!r}")


FORWARD_OPS = ("softmax", "layer_norm", "rms_norm", "fused_add_rms_norm")
BACKWARD_OPS = ("softmax_backward", "layer_norm_backward", "rms_norm_backward")
DTYPES = ("f32", "f16", "bf16")
# Every routing edge: the register kernels' power-of-two layouts, the looped ranges, the staged shapes' CTA counts.
ROUTED_N = (
    *(1, 3, 8, 64, 100, 512, 768, 769, 1000, 1024, 1025, 1536, 1792, 1793, 2048, 2049, 3072, 3073, 4096, 4097),
    *(6144, 6145, 7168, 7169, 8192, 8193, 12288, 16384, 16385, 24576, 32768, 32769, 40960, 49152, 65536, 65537),
    *(98304, 131072, 196608, 262144, 262145, 524288),
)
_VARIANTS = {
    "softmax": ("main",),
    "softmax_backward": ("main",),
    "layer_norm": ("main", "plain", "f32_weights"),
    "rms_norm": ("main", "plain"),
    "fused_add_rms_norm": ("main",),
    "layer_norm_backward": ("main", "plain"),
    "rms_norm_backward": ("main", "plain"),
}
_FEW_N = (1000, 4096, 32768, 262144)  # the other variants and layouts: one N per regime


def all_cases() -> list[Case]:
    cases = []
    for op, dtype in itertools.product(FORWARD_OPS + BACKWARD_OPS, DTYPES):
        cases += [Case(op, dtype, n) for n in ROUTED_N]
        cases += [Case(op, dtype, n, variant) for variant in _VARIANTS[op][1:] for n in _FEW_N]
        cases += [Case(op, dtype, n, layout=layout) for layout in ("padded", "offset") for n in _FEW_N]
        cases += [Case(op, dtype, n, rows=rows) for rows in (1, 7) for n in (4096, 65536)]
    return cases


def smoke_cases() -> list[Case]:
    """A few cases per op (one per regime, both directions): what the CPU test compares."""
    picked = []
    for op in FORWARD_OPS + BACKWARD_OPS:
        picked += [Case(op, "bf16", 1024), Case(op, "f32", 4097), Case(op, "bf16", 65536), Case(op, "f32", 262144)]
    return picked


def launches(cases) -> dict:
    """``{case name: [Launch, ...]}`` (an entry point that refuses a case records its error)."""
    found = {}
    with recording() as launched:
        for case in cases:
            launched.clear()
            try:
                _call(case)
            except (TypeError, ValueError) as error:
                found[case.name] = f"{type(error).__name__}: {error}"
                continue
            found[case.name] = [list(launch) for launch in launched]
    return found


class GemmCase(NamedTuple):
    """One ``gemm(a, b)`` call: a (M, K) row-major, b (K, N) as an ``nn.Linear`` weight's ``W.t()`` ("K": K-major)
    or row-major ("MN"), ``epilogue`` "none", "bias_gelu" (bias in a's dtype), "bias32_silu" (float32 bias) or
    "relu", ``out_dtype`` None (a's) or "f32"."""

    m: int
    n: int
    k: int
    dtype: str = "bf16"
    b_major: str = "K"
    epilogue: str = "none"
    out_dtype: str | None = None

    @property
    def name(self) -> str:
        return (
            f"gemm/{self.dtype}/{self.m}x{self.n}x{self.k}/b{self.b_major}/{self.epilogue}/{self.out_dtype or 'same'}"
        )


_EPILOGUES = {
    "none": (None, None),
    "bias_gelu": ("same", "gelu"),
    "bias32_silu": ("f32", "silu"),
    "relu": (None, "relu"),
}


def _gemm_launches(case: GemmCase) -> list:
    """The launches ``gemm()`` makes for ``case`` on an H200 (:data:`SMS` SMs): its plan (``plan_gemm``, computed
    from the tensors' geometry as ``gemm()`` computes it), each launch compiled for TensorSpecs of that geometry."""
    from flydsl.kernels.gemm import MatrixSpec, plan_gemm

    m, n, k, dtype = case.m, case.n, case.k, case.dtype
    bias_kind, activation = _EPILOGUES[case.epilogue]
    a = MatrixSpec.dense((m, k), dtype)
    b = MatrixSpec.dense((n, k), dtype).transposed() if case.b_major == "K" else MatrixSpec.dense((k, n), dtype)
    out = MatrixSpec.dense((m, n), case.out_dtype or dtype)
    bias = None if bias_kind is None else MatrixSpec.dense((n,), dtype if bias_kind == "same" else "f32")
    plan = plan_gemm(a, b, out, sms=SMS, bias=bias, activation=activation)
    modules = plan.lower()
    return [
        (launch.kernel.name, launch.grid, launch.block, None, module)
        for launch, module in zip(plan.launches, modules, strict=True)
    ]


GEMM_NK = ((4096, 4096), (14336, 4096), (4096, 14336), (1536, 7168), (7168, 16384), (18432, 7168), (28672, 8192))
GEMM_NK += ((2048, 7168), (776, 520))
GEMM_M = (1, 8, 16, 17, 64, 128, 256, 512, 2048, 8192)


def all_gemm_cases() -> list[GemmCase]:
    cases = [GemmCase(m, n, k, b_major=major) for m in GEMM_M for n, k in GEMM_NK for major in ("K", "MN")]
    cases += [GemmCase(m, 4096, 4096, "f16") for m in (8, 128, 2048)]
    for epilogue, out_dtype in itertools.product(_EPILOGUES, (None, "f32")):
        cases += [GemmCase(m, 4096, 4096, epilogue=epilogue, out_dtype=out_dtype) for m in (8, 16, 128, 2048)]
    return list(dict.fromkeys(cases))


def smoke_gemm_cases() -> list[GemmCase]:
    return [
        GemmCase(8, 4096, 4096),
        GemmCase(2048, 4096, 4096, epilogue="bias_gelu"),
        GemmCase(128, 776, 520, b_major="MN"),
    ]


def gemm_launches(cases) -> dict:
    """``{case name: [Launch, ...]}`` of :func:`_gemm_launches` (PTX hashed)."""
    found = {}
    for case in cases:
        try:
            planned = _gemm_launches(case)
        except (TypeError, ValueError) as error:
            found[case.name] = f"{type(error).__name__}: {error}"
            continue
        found[case.name] = [
            list(Launch(name, _dims(grid), _dims(block), cluster, hashlib.sha256(module.ptx.encode()).hexdigest()[:16]))
            for name, grid, block, cluster, module in planned
        ]
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", choices=("all", "smoke"), default="all")
    parser.add_argument("--write", action="store_true", help="rewrite the golden file with the launches found")
    args = parser.parse_args(argv)
    if args.cases == "all":
        found = {**launches(all_cases()), **gemm_launches(all_gemm_cases())}
    else:
        found = {**launches(smoke_cases()), **gemm_launches(smoke_gemm_cases())}
    if args.write:
        lines = [f"{json.dumps(name)}: {json.dumps(found[name])}" for name in sorted(found)]
        GOLDEN.write_text("{\n" + ",\n".join(lines) + "\n}\n")
        print(f"wrote {len(found)} cases to {GOLDEN}")
        return 0
    golden = json.loads(GOLDEN.read_text())
    differ = [name for name, value in found.items() if golden.get(name) != json.loads(json.dumps(value))]
    for name in differ:
        print(f"{name}: golden {golden.get(name)} now {found[name]}")
    print(f"{len(found) - len(differ)} of {len(found)} cases launch as the golden file says")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
