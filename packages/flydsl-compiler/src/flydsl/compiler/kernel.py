"""``@kernel``: device functions traced to Fly IR, specialized on their arguments, compiled, cached and launched.

    @flyc.kernel
    def scale(x: fx.Tensor, y: fx.Tensor, a: fx.Float32, n: fx.Int32): ...

    scale(x, y, 2.0, n).launch(grid=..., block=256)          # from Python or from a @flyc.jit function

Each distinct specialization (tensor element types, ranks, unit strides, 16-byte divisibility of the other strides
and of the data pointers; the numeric parameter types; ``Constexpr`` values) is traced once, compiled once per
process (in-memory cache) and once per machine (disk cache), then launched through the native launcher. Bad
arguments raise before anything is launched, naming the parameter.
"""

from __future__ import annotations

import functools
import inspect
import io
import typing
from dataclasses import dataclass, replace

import flydsl.layout as _fl
from flydsl.compiler import cache, runtime, settings, toolchain
from flydsl.compiler._native import launcher
from flydsl.compiler.args import (
    StaticDims,
    describe_tensor,
    holds_negative_zero,
    reaches_2_31,
    stride_plan,
    torch_dtype_name,
)
from flydsl.compiler.attributes import KernelAttributes, check_launch_shape
from flydsl.compiler.compiled import CompiledModule
from flydsl.compiler.fingerprint import source_fingerprint
from flydsl.compiler.frameworks import (
    ARRAY_INTERFACE_TYPES,
    TORCH_TENSOR_TYPES,
    default_stream,
    is_torch_tensor,
    register_array_interface_type,
    stream_handle,
)
from flydsl.compiler.lazy import lazy_import
from flydsl.compiler.target import SM90A, Target
from flydsl.compiler.tracing import user_traceback, warn_at_user_code
from flydsl.expr.numeric import Float, Index, Integer, Numeric, fastmath, fp_contract
from flydsl.expr.params import Stream, is_constexpr
from flydsl.expr.tensor import Tensor
from flydsl.expr.tma import TmaDescriptor, TmaTile

ir = lazy_import("mlir.ir")
gpu = lazy_import("mlir.dialects.gpu")

__all__ = ["kernel", "KernelFunction", "KernelCall"]


def _compile_mlir(source, target):
    """:func:`flydsl.compiler.pipeline.compile_mlir`, imported on a kernel's first compile: launching a kernel that
    the disk cache holds needs none of the pipeline."""
    from flydsl.compiler.pipeline import compile_mlir

    return compile_mlir(source, target)


def _user_errors(method):
    """Errors raised while tracing the user's kernel surface with a traceback of the user's frames only."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except Exception as error:
            if getattr(error, "__fly_traced__", False):
                raise error.with_traceback(user_traceback(error.__traceback__)) from None
            raise

    return wrapper


@dataclass(frozen=True)
class _Param:
    name: str
    kind: str  # "tensor", "tma", "numeric", "constexpr", "stream"
    numeric: type[Numeric] | None = None


def _classify(fn, hints: dict) -> list[_Param]:
    params = []
    for name, parameter in inspect.signature(fn).parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise TypeError(f"kernel '{fn.__name__}': *args/**kwargs parameters are not supported ('{name}')")
        annotation = hints.get(name, parameter.annotation)
        if annotation is Tensor:
            params.append(_Param(name, "tensor"))
        elif annotation is TmaDescriptor:
            params.append(_Param(name, "tma"))
        elif isinstance(annotation, type) and issubclass(annotation, Numeric):
            params.append(_Param(name, "numeric", annotation))
        elif is_constexpr(annotation):
            params.append(_Param(name, "constexpr"))
        elif annotation is Stream:
            params.append(_Param(name, "stream"))
        else:
            raise TypeError(
                f"kernel '{fn.__name__}': parameter '{name}' needs an annotation: fx.Tensor, fx.TmaDescriptor, a"
                f" numeric type such as fx.Int32 / fx.Float32, fx.Constexpr[...] or fx.Stream (got {annotation!r})"
            )
    return params


_SIGNATURE_CODES = {"i32": "i", "i64": "l", "f32": "f", "f64": "d", "index": "l"}


class _Specialization:
    """One way of calling the kernel: the cache key, the launch arguments and the stream."""

    __slots__ = ("key", "launch_args", "stream", "tensors")

    def __init__(self, key, launch_args, stream, tensors):
        self.key = key
        self.launch_args = launch_args
        self.stream = stream
        self.tensors = tensors


class KernelFunction:
    """A ``@kernel`` function: call it with arguments to get a launchable :class:`KernelCall`."""

    def __init__(self, fn, target: Target = SM90A, attributes: KernelAttributes | None = None):
        self.fn = fn
        self.name = fn.__name__
        self.target = target
        self.attributes = attributes or KernelAttributes()
        # Launches of kernels compiled for a block or cluster shape are checked on every path, the native one too.
        fixed_shape = self.attributes.threads is not None or self.attributes.cluster is not None
        self._check_launch = self.attributes.check_launch if fixed_shape else None
        self.params = _classify(fn, typing.get_type_hints(fn))
        self._signature = inspect.signature(fn)
        self._loaded: dict[tuple, _LoadedKernel] = {}
        self._warned_uncacheable = False
        self._arity = len(self.params)
        # The native launch path: every kernel in _loaded is registered with it (see KernelCall.launch).
        self._dispatcher = self.new_dispatcher()
        self._dispatch = self._dispatcher.launch
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __repr__(self):
        return f"<flyc.kernel {self.name}({', '.join(p.name for p in self.params)})>"

    def variant(self, name: str, **attributes) -> KernelFunction:
        """This kernel's body and parameters as another kernel, ``name``, with some of its :class:`KernelAttributes`
        changed (e.g. ``shared_carveout=100`` for the launches that need it): compiled, cached and loaded apart."""
        if not isinstance(name, str) or not name.isidentifier() or name == self.name:
            raise ValueError(f"variant of kernel '{self.name}': name: expected another identifier, got {name!r}")
        other = KernelFunction(self.fn, self.target, replace(self.attributes, **attributes))
        other.name = name
        return other

    def __call__(self, *args, **kwargs) -> KernelCall:
        if not kwargs and len(args) == self._arity:
            return KernelCall(self, args)  # the common case, without binding
        return KernelCall(self, self._bind(args, kwargs))

    def new_dispatcher(self):
        """A native dispatcher (``runtime.Dispatcher``) for this kernel's parameters, with no kernel registered."""
        return launcher.Dispatcher([_dispatch_param(p) for p in self.params])

    def _bind(self, args, kwargs) -> list:
        if not kwargs and len(args) == len(self.params):
            return list(args)  # the common case, without inspect's binding
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as error:
            names = ", ".join(p.name for p in self.params)
            raise TypeError(f"kernel '{self.name}({names})': {error}") from None
        bound.apply_defaults()
        return [bound.arguments[p.name] for p in self.params]

    # --- specialization ---------------------------------------------------------------------------------------------
    def specialize(self, values: list) -> _Specialization:
        """The cache key and the launch arguments of a call. This runs on every launch: torch tensors take a
        lean path (four attribute reads each); anything else goes through :func:`describe_tensor`."""
        key, launch_args, tensors, stream = [], [], [], None
        append, extend = launch_args.append, launch_args.extend
        for param, value in zip(self.params, values, strict=True):
            kind = param.kind
            if kind == "tensor":
                static = None
                if type(value) is StaticDims:
                    static, value = value.dims, value.tensor
                if type(value) in TORCH_TENSOR_TYPES or is_torch_tensor(value):
                    if not value.is_cuda:
                        raise ValueError(f"argument '{param.name}': expected a CUDA tensor, got one on {value.device}")
                    pointer, shape, strides = value.data_ptr(), value.shape, value.stride()
                    dtype = torch_dtype_name(value.dtype, param.name)
                    tensors.append(value)
                else:
                    described = describe_tensor(value, param.name)
                    if type(value) not in ARRAY_INTERFACE_TYPES and hasattr(value, "__cuda_array_interface__"):
                        register_array_interface_type(type(value))
                    pointer, shape, strides, dtype = (
                        described.pointer,
                        described.shape,
                        described.strides,
                        described.dtype,
                    )
                    tensors.append(described)
                kinds, passed = stride_plan(strides, dtype)
                append(pointer)
                wide = reaches_2_31(shape, strides)
                if static is None and not wide:
                    key.append((dtype, len(shape), kinds, not pointer & 15))
                    extend(shape)
                else:  # marked extents are in the key, not in the launch arguments; a wide tensor is marked so
                    extents = (None,) * len(shape) if static is None else _static_extents(shape, static, param.name)
                    entry = (dtype, len(shape), kinds, not pointer & 15, extents)
                    key.append(entry + (True,) if wide else entry)
                    extend(e for e, fixed in zip(shape, extents, strict=True) if fixed is None)
                for position in passed:
                    append(strides[position])
            elif kind == "tma":
                if type(value) is not TmaTile:
                    raise TypeError(
                        f"argument '{param.name}': expected a fx.TmaTile(tensor, box, swizzle),"
                        f" got {type(value).__name__}"
                    )
                key.append(value._key)
                append(value.tensor_map if value._map is not None else None)  # None: a TensorSpec, compile only
                extend(value.shape)
                source = value.source
                tensors.append(source if is_torch_tensor(source) else value.described)
            elif kind == "numeric":
                append(_scalar(param, value))
                key.append(param.numeric.__name__)
            elif kind == "constexpr":
                try:
                    hash(value)
                except TypeError:
                    raise TypeError(f"argument '{param.name}': a Constexpr must be hashable, got {value!r}") from None
                if holds_negative_zero(value):
                    # == to its 0.0 twin but other constants in the code; a key of four parts, which the native
                    # path does not take (it never matches a value holding a -0.0 to a registered one)
                    key.append(("constexpr", type(value).__name__, value, "negative zero"))
                else:
                    key.append(("constexpr", type(value).__name__, value))
            else:
                stream = value
        return _Specialization(tuple(key), launch_args, stream, tensors)

    def compiled_module(self, spec: _Specialization) -> CompiledModule:
        """The compiled module of a specialization: from the disk cache, else traced and compiled (and stored).
        A kernel that reads something the fingerprint cannot encode is compiled without the disk cache (warned
        once per kernel)."""
        constexprs = [part[2] for part in spec.key if isinstance(part, tuple) and part[:1] == ("constexpr",)]
        fingerprint = source_fingerprint(self.fn, *constexprs)
        if fingerprint.digest is None:
            _start_compile_worker()
            if not self._warned_uncacheable:
                self._warned_uncacheable = True
                warn_at_user_code(
                    f"FlyDSL: kernel '{self.name}' is not cached on disk: {fingerprint.unknown} cannot be"
                    " fingerprinted (pass it as a Constexpr, or make it a number, string, tuple, enum or dataclass)"
                )
            return _compile_mlir(self._traced(spec.key, bytecode=True), self.target)
        key = cache.key_text(
            cache.compiler_fingerprint(),
            toolchain.fingerprint(),
            fingerprint.digest,
            *(cache.package_key(package) for package in fingerprint.packages),
            (self.name, self.target, self.attributes, spec.key),
        )
        compiled = cache.load(key)
        if compiled is None:
            _start_compile_worker()
            compiled = replace(_compile_mlir(self._traced(spec.key, bytecode=True), self.target), cache_key=key)
            cache.store(key, compiled)
        else:  # what ptxas said when it was compiled, as then
            toolchain.warn_performance_notes(compiled.performance_notes)
        return compiled

    @_user_errors
    def lower(self, *args, **kwargs) -> CompiledModule:
        """Compiles for these arguments without loading (no GPU needed): PTX, cubin, launch signature."""
        return self.compiled_module(self.specialize(self._bind(args, kwargs)))

    def _compile(self, spec: _Specialization) -> _LoadedKernel:
        runtime.require_gpu(f"kernel '{self.name}'", f"{self.name}.lower(...)")
        loaded = _LoadedKernel(runtime.load(self.compiled_module(spec)), self.name)
        if self.attributes.dependent_launch:
            loaded.function.dependent_launch = True
        if self.attributes.shared_carveout is not None:
            loaded.function.shared_carveout = self.attributes.shared_carveout
        if settings.current().cache_enabled:  # FLYDSL_RUNTIME_ENABLE_CACHE=0: every launch compiles again
            self._loaded[spec.key] = loaded
            register_loaded(self._dispatcher, spec.key, loaded)
        return loaded

    def loaded(self, spec: _Specialization) -> _LoadedKernel:
        found = self._loaded.get(spec.key)
        return found if found is not None else self._compile(spec)

    def launch_specialized(self, loaded, spec, grid, block, smem, stream, cluster) -> None:
        if stream is None:
            stream = spec.stream
        handle = stream_handle(stream) if stream is not None else default_stream(spec.tensors)
        # The compiled shapes (attributes traced with set_kernel_attributes included); also for flyc.compile's
        # kernels, which launch from here.
        if loaded.block is not None or loaded.cluster is not None:
            check_launch_shape(self.name, loaded.block, loaded.cluster, block, cluster)
        shared = loaded.shared_bytes if smem is None else smem
        if shared < loaded.shared_bytes:
            raise ValueError(
                f"smem: kernel '{self.name}' needs at least {loaded.shared_bytes} bytes of shared memory, got {smem}"
            )
        loaded.function.launch(grid, block, loaded.signature, spec.launch_args, shared, handle, cluster)

    # --- tracing ----------------------------------------------------------------------------------------------------
    def trace(self, key: tuple) -> str:
        """The kernel's MLIR (with source locations) for a specialization key."""
        return self._traced(key, bytecode=False)

    def _traced(self, key: tuple, bytecode: bool) -> str | bytes:
        """:meth:`trace`'s module as text, or as MLIR bytecode (what compiles take: for a GEMM 41 KB written in
        2 ms against 860 KB of text in 24 ms, and read back 5x faster; the same module, locations included)."""
        from flydsl.compiler.ast_rewrite import rewrite_function  # (the trace path: not a cached kernel's launch)
        from flydsl.compiler.context import make_context

        fn = rewrite_function(self.fn)
        with make_context(), ir.Location.unknown():
            module = ir.Module.create()
            module.operation.attributes["gpu.container_module"] = ir.UnitAttr.get()
            with ir.InsertionPoint(module.body):
                gpu_module = gpu.GPUModuleOp(f"{self.name}_module")
                module_body = gpu_module.bodyRegion.blocks.append()
            types, builders, grid_constants = self._parameter_types(key)
            with ir.InsertionPoint(module_body):
                function = gpu.GPUFuncOp(
                    ir.TypeAttr.get(ir.FunctionType.get(types, [])), sym_name=self.name, kernel=True
                )
                for name, attribute in self.attributes.mlir_attributes().items():
                    function.attributes[name] = attribute
                if grid_constants:  # by-value parameters: the pipeline marks them after lowering to LLVM
                    function.attributes["fly.grid_constants"] = ir.DenseI32ArrayAttr.get(grid_constants)
                entry = function.body.blocks.append(*types)
            with ir.InsertionPoint(entry):
                arguments, position = [], 0
                for build, count in builders:
                    arguments.append(build(list(entry.arguments)[position : position + count]))
                    position += count
                try:
                    # Not the launching code's fp_contract / fastmath regions: one kernel, one key.
                    with fp_contract(True), fastmath(None):
                        fn(*arguments)
                except Exception as error:
                    error.__fly_traced__ = True  # the entry point re-raises it with the user's frames only
                    raise error.with_traceback(user_traceback(error.__traceback__)) from None
                gpu.ReturnOp([])
            if bytecode:
                buffer = io.BytesIO()
                module.operation.write_bytecode(buffer)
                return buffer.getvalue()
            return module.operation.get_asm(enable_debug_info=True)

    def _parameter_types(self, key: tuple):
        """The MLIR parameter types of the specialization, and how to build each Python argument from them."""
        types, builders, grid_constants = [], [], []
        # The key has no entry for fx.Stream parameters (they do not specialize the kernel).
        specs = iter(key)
        for param in self.params:
            spec = next(specs) if param.kind != "stream" else None
            if param.kind == "tensor":
                dtype_name, rank, strides, aligned, *marked = spec
                extents = marked[0] if marked else (None,) * rank
                wide = len(marked) > 1  # offsets may reach 2^31 elements: computed in 64 bits
                count = 1 + sum(1 for e in extents if e is None) + sum(1 for s in strides if s != 1)
                types.append(ir.Type.parse("!llvm.ptr<1>"))
                types.extend([ir.IntegerType.get_signless(64)] * (count - 1))
                builders.append((_tensor_builder(dtype_name, extents, strides, aligned, wide), count))
            elif param.kind == "tma":
                _, dtype_name, rank, box, swizzle = spec
                grid_constants.append(len(types))
                types.append(ir.Type.parse("!llvm.ptr"))
                types.extend([ir.IntegerType.get_signless(64)] * rank)
                builders.append((_descriptor_builder(dtype_name, box, swizzle), 1 + rank))
            elif param.kind == "numeric":
                types.append(param.numeric.mlir_type())
                builders.append((lambda values, cls=param.numeric: cls(values[0]), 1))
            elif param.kind == "constexpr":
                builders.append((lambda values, value=spec[2]: value, 0))
            else:
                builders.append((lambda values: None, 0))
        if next(specs, None) is not None:
            raise ValueError(f"kernel '{self.name}': key {key!r} does not match its parameters")
        return types, builders, grid_constants


_INT64_BOUNDS = (-(1 << 63), (1 << 63) - 1)


def _start_compile_worker() -> None:
    """Where compiles are isolated, the worker starts while the kernel is traced (``isolate.start_worker``)."""
    if settings.current().compile_isolated:
        from flydsl.compiler import isolate

        isolate.start_worker()


def _dispatch_param(param: _Param) -> tuple:
    """A parameter as the native dispatcher takes it: (kind, low, high, key entry)."""
    if param.kind == "tensor":
        return ("t", 0, 0, None)
    if param.kind == "numeric":
        cls = param.numeric
        if issubclass(cls, Float):
            return ("f", 0, 0, cls.__name__)
        if issubclass(cls, Integer):
            low, high = cls.bounds()  # wider values (UInt64 above 2**63) take the Python path
            return ("i", max(low, _INT64_BOUNDS[0]), min(high, _INT64_BOUNDS[1]), cls.__name__)
        return ("i", 1, 0, cls.__name__)  # an empty range: always the Python path, which raises
    if param.kind == "constexpr":
        return ("c", 0, 0, None)
    if param.kind == "tma":
        return ("m", 0, 0, None)
    return ("s", 0, 0, None)


def _static_extents(shape, dims, name: str) -> tuple:
    """Per dimension: the extent when ``dims`` marks it static (every one for ``"all"``), else None."""
    rank = len(shape)
    if dims == "all":
        return tuple(shape)
    marked = set()
    for d in dims:
        if not isinstance(d, int) or not -rank <= d < rank:
            raise ValueError(f"argument '{name}': mark_static dims must be ints in [{-rank}, {rank}), got {d!r}")
        marked.add(d % rank)
    return tuple(extent if k in marked else None for k, extent in enumerate(shape))


def _tensor_builder(dtype_name: str, extents: tuple, strides: tuple, aligned: bool, wide: bool):
    from flydsl.compiler.dialects import fly
    from flydsl.expr.numeric import _BY_MLIR_NAME

    dtype = _BY_MLIR_NAME[dtype_name]
    element_bytes = max(1, dtype.width // 8)
    alignment = 16 if aligned else element_bytes

    def build(values: list[ir.Value]):
        pointer_type = ir.Type.parse(f"!fly.ptr<{dtype.mlir_name}, global, {alignment}>")
        pointer = fly.MakePtrOp(pointer_type, values[0]).result
        dynamic = iter(values[1:])
        shape = tuple(extent if extent is not None else Index(_to_index(next(dynamic))) for extent in extents)
        dynamic_strides = dynamic
        stride = tuple(
            1 if kind == 1 else Index(_to_index(next(dynamic_strides)), divisibility=16 // element_bytes if kind else 1)
            for kind in strides
        )
        layout = _fl.Layout(shape[0], stride[0]) if len(extents) == 1 else _fl.Layout(shape, stride)
        return Tensor(pointer, layout, dtype, space="global", alignment=alignment, wide=wide)

    return build


def _descriptor_builder(dtype_name: str, box: tuple, swizzle: int):
    from flydsl.expr.numeric import _BY_MLIR_NAME

    def build(values: list[ir.Value]):
        shape = tuple(Index(_to_index(v)) for v in values[1:])
        return TmaDescriptor(values[0], _BY_MLIR_NAME[dtype_name], box, swizzle, shape)

    return build


def _to_index(value: ir.Value) -> ir.Value:
    from mlir.dialects import arith

    return arith.index_cast(ir.IndexType.get(), value)


def _scalar(param: _Param, value):
    cls = param.numeric
    if isinstance(value, Numeric):
        raise TypeError(
            f"argument '{param.name}': pass a Python number to a kernel, not a traced {type(value).__name__}"
        )
    if issubclass(cls, Float):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise TypeError(f"argument '{param.name}': expected a float for {cls.__name__}, got {value!r}")
        return float(value)
    if issubclass(cls, Integer):
        if not isinstance(value, int) or isinstance(value, bool):  # True is an int to Python, not a count
            raise TypeError(f"argument '{param.name}': expected an int for {cls.__name__}, got {value!r}")
        low, high = cls.bounds()
        if not low <= value <= high:
            raise OverflowError(f"argument '{param.name}': {value} does not fit {cls.__name__} [{low}, {high}]")
        return value
    raise TypeError(f"argument '{param.name}': {cls.__name__} parameters are not supported")


class _LoadedKernel:
    __slots__ = ("module", "function", "signature", "shared_bytes", "block", "cluster")

    def __init__(self, module: runtime.LoadedModule, name: str):
        self.module = module
        self.function = module.function(name)
        self.signature = module.compiled.kernels[name]
        self.shared_bytes = module.compiled.shared_bytes.get(name, 0)
        # The shapes compiled in: from @kernel(...) or set_kernel_attributes while tracing (None: any).
        self.block, self.cluster = module.compiled.launch_shapes.get(name, (None, None))


launcher._register_negative_zero_check(holds_negative_zero)


def register_loaded(dispatcher, key, loaded) -> None:
    """Registers a loaded kernel with a native dispatcher under specialization ``key`` (its signature, shared
    bytes and compiled-in block/cluster shapes)."""
    dispatcher.add(key, loaded.function, loaded.signature, loaded.shared_bytes, loaded.block, loaded.cluster)


class KernelCall:
    """A kernel bound to its arguments; ``launch`` runs it."""

    __slots__ = ("kernel", "values")

    def __init__(self, kernel: KernelFunction, values: list):
        self.kernel = kernel
        self.values = values

    def launch(self, grid, block, smem: int | None = None, stream=None, cluster=None) -> None:
        """Launches on ``grid`` x ``block`` (ints or 1-3 ints); ``smem`` defaults to what the kernel's shared
        buffers need; ``stream`` to the ``fx.Stream`` argument, else the tensors' current stream.

        One native call when the arguments are torch tensors and numbers of an already loaded specialization;
        else (first launch, other tensor types, bad arguments) the Python path below."""
        kernel = self.kernel
        if kernel._check_launch is not None:
            kernel._check_launch(kernel.name, block, cluster)
        if not kernel._dispatch(self.values, grid, block, smem, stream, cluster):
            self._launch(grid, block, smem, stream, cluster)

    @_user_errors
    def _launch(self, grid, block, smem, stream, cluster) -> None:
        kernel = self.kernel
        spec = kernel.specialize(self.values)
        kernel.launch_specialized(kernel.loaded(spec), spec, grid, block, smem, stream, cluster)


def kernel(
    fn=None,
    *,
    target: Target = SM90A,
    threads=None,
    max_registers=None,
    min_blocks_per_sm=None,
    cluster=None,
    dependent_launch: bool = False,
    shared_carveout: int | None = None,
):
    """Decorates a device function; ``@kernel``, ``@kernel(target=flyc.SM80)``, ``@kernel(threads=384,
    min_blocks_per_sm=1)`` (see :class:`KernelAttributes`)."""
    attributes = KernelAttributes(threads, max_registers, min_blocks_per_sm, cluster, dependent_launch, shared_carveout)
    if fn is None:
        return lambda f: KernelFunction(f, target, attributes)
    return KernelFunction(fn, target, attributes)
