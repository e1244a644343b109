"""Compiles MLIR holding one ``gpu.module`` to PTX (in process) and a cubin (through ptxas when present).

Every stage's IR is kept on request, can be written to a directory, and can be compiled again from that stage
(``compile_mlir(text, start_after="fly")``). By default the compile runs in a forked child of a worker process
(``isolate.py``), where an LLVM assertion or abort becomes a ``CompilationError`` instead of taking the caller down.
Before any pass: the text's nesting is bounded (``text_checks``), MLIR's verifier runs, and the LLVM dialect's
alignments and target features are checked (LLVM asserts on those the verifier lets through).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from flydsl.compiler import isolate as isolation
from flydsl.compiler import settings, toolchain
from flydsl.compiler.compiled import CompiledModule
from flydsl.compiler.context import make_context
from flydsl.compiler.errors import CompilationError, format_mlir_error, location_text
from flydsl.compiler.lazy import lazy_import
from flydsl.compiler.target import ISA_STAGE, SM90A, Target
from flydsl.compiler.text_checks import check_nesting

ir = lazy_import("mlir.ir")
passmanager = lazy_import("mlir.passmanager")
gpu = lazy_import("mlir.dialects.gpu")

__all__ = ["CompiledModule", "compile_mlir", "kernel_signatures", "launch_shapes", "shared_allocations"]


def compile_mlir(
    source: str | bytes,
    target: Target = SM90A,
    *,
    start_after: str | None = None,
    keep_stages: bool = False,
    assemble: bool | None = None,
    isolate: bool | None = None,
) -> CompiledModule:
    """Compiles MLIR text with one ``gpu.module`` of kernels, or MLIR bytecode of such a module (what kernels'
    traces pass: text's nesting check applies to text only).

    ``start_after`` names the stage whose output ``source`` is, so a dumped stage compiles again.
    ``assemble``: True runs ptxas (error if missing), False never does, None runs it when found.
    ``isolate``: True compiles in a forked child of a worker process (``flydsl.compiler.isolate``), where a
    backend abort (an LLVM assertion, ``LLVM ERROR: ...``) becomes a ``CompilationError`` instead of ending this
    process (~3 ms a compile); False compiles in this process. None follows ``FLYDSL_COMPILE_ISOLATED`` (default:
    isolated).
    """
    _stages_to_run(target, start_after)  # bad arguments fail here, not in a worker
    if isolate is None:
        isolate = settings.current().compile_isolated
    request = dict(source=source, target=target, start_after=start_after, keep_stages=keep_stages, assemble=assemble)
    compiled = isolation.compile_in_worker(request) if isolate else _compile_in_process(**request)
    toolchain.warn_performance_notes(compiled.performance_notes)  # here: a worker's warnings stay in the worker
    return compiled


# A small kernel through every stage: what the worker compiles once before it forks children (warm_up).
_WARM_UP = """
module attributes {gpu.container_module} {
  gpu.module @warm_up {
    gpu.func @warm_up(%out: !llvm.ptr<1>) kernel {
      %layout = fly.make_layout : !fly.layout<(4,8):(8,1)>
      %tid = gpu.thread_id x
      %offset = fly.crd2idx(%tid), %layout : !fly.layout<(4,8):(8,1)>
      %value = arith.index_cast %offset : index to i32
      llvm.store %value, %out : i32, !llvm.ptr<1>
      gpu.return
    }
  }
}
"""


def warm_up() -> ir.Context:
    """Compiles a small kernel in this process, so that what MLIR and LLVM initialise on first use (the NVPTX
    backend, dialects: ~12 ms) is done once in the worker and inherited by every child it forks. Returns the
    context it compiled in, for the children to compile in too (each in its copy: ~5 ms less than a new one)."""
    context = make_context()
    _compile_in_process(_WARM_UP, SM90A, start_after=None, keep_stages=False, assemble=False, context=context)
    return context


def _stages_to_run(target: Target, start_after: str | None):
    stages = target.stages()
    names = [stage.name for stage in stages]
    if start_after is not None and start_after not in names[:-1]:
        raise ValueError(f"start_after: expected one of {names[:-1]}, got {start_after!r}")
    return stages[names.index(start_after) + 1 :] if start_after else stages


def _compile_in_process(
    source: str | bytes,
    target: Target,
    start_after: str | None,
    keep_stages: bool,
    assemble: bool | None,
    on_stage: Callable[[str], None] | None = None,
    context: ir.Context | None = None,
) -> CompiledModule:
    """The compile itself; ``on_stage`` hears each stage's name before the stage runs (the worker reports it).
    ``context``: where to compile, else in a new one (a worker's child compiles in its copy of the worker's)."""
    todo = _stages_to_run(target, start_after)
    dump_dir = settings.current().dump_ir_dir
    kept: dict[str, str] = {}
    on_stage = on_stage or (lambda name: None)

    with context or make_context(), ir.Location.unknown():
        on_stage("input")
        module = _parse(source)
        gpu_module = _single_gpu_module(module)
        name = ir.StringAttr(gpu_module.attributes["sym_name"]).value
        if start_after is None:
            _refuse_memref_arguments(gpu_module)
            gpu_module.attributes["targets"] = ir.ArrayAttr.get([ir.Attribute.parse(target.attribute)])
        _verify(module)
        _record(kept, dump_dir, name, "input", module, keep_stages)
        for stage in todo:
            on_stage(stage.name)
            if stage.name == ISA_STAGE:
                kernels, shared_bytes = kernel_signatures(module)
                shapes = launch_shapes(module)
            if stage.name == "fly":
                allocations = shared_allocations(module)
            try:
                passmanager.PassManager.parse(f"builtin.module({stage.passes})").run(module.operation)
            except ir.MLIRError as error:
                raise CompilationError(stage.name, format_mlir_error(error)) from None
            if stage.name == "fly":
                _check_fly_lowered(module)
                _check_shared_memory(module, allocations, target)
            if stage.name == "llvm":
                _mark_grid_constants(module)
            if stage.name != ISA_STAGE:
                _record(kept, dump_dir, name, stage.name, module, keep_stages)
        ptx = _extract_ptx(module)
    _record(kept, dump_dir, name, ISA_STAGE, ptx, keep_stages)

    cubin, notes = None, ()
    if assemble is True or (assemble is None and toolchain.find_ptxas()):
        on_stage("ptxas")
        cubin, notes = toolchain.assemble_with_notes(ptx, target.arch)  # warned by compile_mlir
        if dump_dir is not None:
            (dump_dir / f"{name}.cubin").write_bytes(cubin)
            sass = toolchain.disassemble_cubin(cubin)
            if sass is not None:
                (dump_dir / f"{name}.sass").write_text(sass)
    return CompiledModule(
        name=name,
        target=target,
        ptx=ptx,
        cubin=cubin,
        kernels=kernels,
        shared_bytes=shared_bytes,
        stages=kept,
        launch_shapes=shapes,
        performance_notes=notes,
    )


def launch_shapes(module: ir.Module) -> dict[str, tuple]:
    """``{kernel: (block, cluster)}`` of LLVM-level IR: the ``nvvm.reqntid`` / ``nvvm.cluster_dim`` each kernel was
    compiled for, as 3-tuples, or None where it has none."""
    shapes = {}

    def dims(op, name):
        return tuple(ir.DenseI32ArrayAttr(op.attributes[name])) if name in op.attributes else None

    def visit(op):
        if op.name == "llvm.func" and "nvvm.kernel" in op.attributes:
            block, cluster = dims(op, "nvvm.reqntid"), dims(op, "nvvm.cluster_dim")
            if block is not None or cluster is not None:
                shapes[ir.StringAttr(op.attributes["sym_name"]).value] = (block, cluster)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return shapes


def kernel_signatures(module: ir.Module) -> tuple[dict[str, str], dict[str, int]]:
    """Launch signatures and dynamic shared-memory bytes of the kernels of LLVM-level IR (the ``llvm`` stage).

    Codes: 'p' pointer, 'm' 128-byte by-value tensor map (``llvm.byval = !llvm.array<128 x i8>``), 'i' i32,
    'l' i64, 'f' f32, 'd' f64.
    """
    signatures, shared_bytes = {}, {}

    def visit(op):
        if op.name == "llvm.func" and "nvvm.kernel" in op.attributes:
            kernel = ir.StringAttr(op.attributes["sym_name"]).value
            arg_attrs = op.attributes["arg_attrs"] if "arg_attrs" in op.attributes else None
            codes = []
            # The entry block's arguments carry the parameter types (the bindings do not expose !llvm.func).
            for position, argument in enumerate(op.regions[0].blocks[0].arguments):
                type_ = argument.type
                attrs = ir.DictAttr(arg_attrs[position]) if arg_attrs is not None else None
                codes.append(_signature_code(kernel, position, type_, attrs))
            signatures[kernel] = "".join(codes)
            if "fly.smem_bytes" in op.attributes:
                shared_bytes[kernel] = ir.IntegerAttr(op.attributes["fly.smem_bytes"]).value
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return signatures, shared_bytes


_SCALAR_CODES = {"i32": "i", "i64": "l", "f32": "f", "f64": "d"}


def _signature_code(kernel: str, position: int, type_: ir.Type, attrs: ir.DictAttr | None) -> str:
    text = str(type_)
    if text.startswith("!llvm.ptr"):
        if attrs is not None and "llvm.byval" in attrs:
            if str(ir.TypeAttr(attrs["llvm.byval"]).value) != "!llvm.array<128 x i8>":
                raise CompilationError(
                    "llvm", f"kernel '{kernel}' argument {position}: only 128-byte byval tensor maps"
                )
            return "m"
        return "p"
    if text in _SCALAR_CODES:
        return _SCALAR_CODES[text]
    raise CompilationError(
        "llvm",
        f"kernel '{kernel}' argument {position} has type {text}; the launcher takes pointers, 128-byte tensor maps,"
        " i32, i64, f32 and f64",
    )


def _mark_grid_constants(module: ir.Module) -> None:
    """Kernel parameters passed by value (TMA descriptors: the positions a kernel lists in ``fly.grid_constants``)
    become 128-byte ``__grid_constant__`` parameters. Done on the LLVM-level kernel: ``convert-gpu-to-nvvm`` drops
    argument attributes such as ``llvm.byval`` from ``gpu.func``, and ``nvvm.grid_constant`` is only valid on
    ``llvm.func`` kernels."""

    def visit(op):
        if op.name == "llvm.func" and "fly.grid_constants" in op.attributes:
            positions = set(ir.DenseI32ArrayAttr(op.attributes["fly.grid_constants"]))
            count = len(op.regions[0].blocks[0].arguments)
            old = op.attributes["arg_attrs"] if "arg_attrs" in op.attributes else None
            by_value = {
                "llvm.byval": ir.TypeAttr.get(ir.Type.parse("!llvm.array<128 x i8>")),
                "llvm.align": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 64),
                "nvvm.grid_constant": ir.UnitAttr.get(),
            }
            attrs = []
            for position in range(count):
                existing = {a.name: a.attr for a in ir.DictAttr(old[position])} if old is not None else {}
                attrs.append(ir.DictAttr.get({**existing, **by_value} if position in positions else existing))
            op.attributes["arg_attrs"] = ir.ArrayAttr.get(attrs)
            del op.attributes["fly.grid_constants"]
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)


def _refuse_memref_arguments(gpu_module: ir.Operation) -> None:
    """memref arguments expand into descriptors the caller would have to pass field by field: refuse them early."""
    for op in gpu_module.regions[0].blocks[0].operations:
        if op.operation.name != "gpu.func":
            continue
        kernel = ir.StringAttr(op.attributes["sym_name"]).value
        inputs = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value).inputs
        for position, type_ in enumerate(inputs):
            if str(type_).startswith("memref<"):
                raise CompilationError(
                    "input",
                    f"kernel '{kernel}' argument {position} has type {type_}; pass a pointer (!llvm.ptr) instead:"
                    " memref descriptors are not supported by the launcher",
                )


def _parse(source: str | bytes) -> ir.Module:
    if isinstance(source, str):  # (bytecode: a trace's own module)
        check_nesting(source)
    try:
        return ir.Module.parse(source)
    except ir.MLIRError as error:
        raise CompilationError("input", format_mlir_error(error)) from None


# LLVM's largest alignment (llvm::Value::MaxAlignmentExponent): larger ones, or ones not a power of two, assert.
_MAX_LLVM_ALIGNMENT = 2**32


def _verify(module: ir.Module) -> None:
    """MLIR's verifier, then what it lets through and LLVM asserts on: ``alignment`` attributes of LLVM dialect ops
    (``llvm.load``, ``llvm.store``, ``llvm.alloca``, globals) that are not a power of two up to 2^32."""
    try:
        module.operation.verify()
    except ir.MLIRError as error:
        raise CompilationError("input", format_mlir_error(error)) from None
    bad = []

    def visit(op):
        if op.name.startswith("llvm.") and "alignment" in op.attributes:
            attribute = op.attributes["alignment"]
            if isinstance(attribute, ir.IntegerAttr):
                value = attribute.value
                if value < 0 or value > _MAX_LLVM_ALIGNMENT or value & (value - 1):
                    bad.append(f"{location_text(op.location)}: error: '{op.name}' alignment = {value}")
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    if bad:
        raise CompilationError(
            "input",
            "\n".join(bad[:10]) + "\nan alignment must be 0 (none) or a power of two up to 2^32 bytes",
        )
    _check_target_features(module)


_FEATURES = re.compile(r'features\s*=\s*"([^"]*)"')


def _check_target_features(module: ir.Module) -> None:
    """The ``features`` of each ``#nvvm.target`` (a text of a dumped stage carries its own): LLVM asserts on a flag
    that does not start with '+' or '-'."""
    for op in module.body.operations:
        if op.operation.name != "gpu.module" or "targets" not in op.operation.attributes:
            continue
        for target in ir.ArrayAttr(op.operation.attributes["targets"]):
            for features in _FEATURES.findall(str(target)):
                for flag in filter(None, features.split(",")):
                    if flag[0] not in "+-":
                        raise CompilationError(
                            "input",
                            f"{location_text(op.location)}: error: target features: expected flags like '+ptx80'"
                            f" (starting with '+' or '-'), got {flag!r} in {target}",
                        )


def _single_gpu_module(module: ir.Module) -> ir.Operation:
    found = [op.operation for op in module.body.operations if op.operation.name == "gpu.module"]
    if len(found) != 1:
        raise CompilationError("input", f"expected exactly one gpu.module in the input, found {len(found)}")
    return found[0]


def shared_allocations(module: ir.Module) -> dict[str, list[tuple[str, str, int]]]:
    """``{kernel: [(location, pointer type, element count), ...]}`` of the ``fly.alloc_smem`` ops of Fly-level IR."""
    found = {}
    for function in _ops_named(module.operation, "gpu.func"):
        found[ir.StringAttr(function.attributes["sym_name"]).value] = [
            (location_text(op.location), str(op.results[0].type), ir.IntegerAttr(op.attributes["count"]).value)
            for op in _ops_named(function, "fly.alloc_smem")
        ]
    return found


def _ops_named(root: ir.Operation, name: str) -> list[ir.Operation]:
    ops = []

    def visit(op):
        if op.name == name:
            ops.append(op)
        return ir.WalkResult.ADVANCE

    root.walk(visit)
    return ops


def _check_shared_memory(module: ir.Module, allocations: dict, target: Target) -> None:
    """Kernels whose ``fly.alloc_smem`` buffers (placed by fly-lower-smem, ``fly.smem_bytes``) need more shared
    memory than one block of the target may have would only fail at launch: refuse them here, naming the buffers."""
    limit = target.shared_bytes_per_block
    for function in _ops_named(module.operation, "gpu.func"):
        if "fly.smem_bytes" not in function.attributes:
            continue
        needed = ir.IntegerAttr(function.attributes["fly.smem_bytes"]).value
        if needed <= limit:
            continue
        kernel = ir.StringAttr(function.attributes["sym_name"]).value
        listed = allocations.get(kernel, [])
        lines = [f"  {where}: {count} x {_element_of(type_)} ({type_})" for where, type_, count in listed]
        raise CompilationError(
            "fly",
            f"kernel '{kernel}' needs {needed} bytes of shared memory (with alignment padding), more than the"
            f" {limit} one block may use on {target.chip}; its shared buffers:\n" + "\n".join(lines),
        )


def _element_of(pointer_type: str) -> str:
    return pointer_type.removeprefix("!fly.ptr<").split(",")[0]


def _check_fly_lowered(module: ir.Module) -> None:
    """Fly ops left after their lowering mean a value the passes could not trace: say which, and where."""
    left = []

    def visit(op):
        if op.name.startswith("fly."):
            left.append(f"{location_text(op.location)}: '{op.name}'")
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    if left:
        raise CompilationError(
            "fly",
            "these Fly ops could not be lowered: the dynamic leaves of their layouts/tensors must be traceable to"
            " the fly.make_* ops that built them in the same region (not passed in as arguments or through"
            " control flow):\n" + "\n".join(left[:10]),
        )


def _extract_ptx(module: ir.Module) -> str:
    for op in module.body.operations:
        if op.operation.name == "gpu.binary":
            objects = ir.ArrayAttr(op.attributes["objects"])
            return gpu.ObjectAttr(objects[0]).object.decode()
    raise CompilationError(ISA_STAGE, "no gpu.binary was produced")


def _record(kept: dict[str, str], dump_dir: Path | None, name: str, stage: str, ir_or_text, keep: bool) -> None:
    if not keep and dump_dir is None:
        return
    # With locations, so that a dumped stage compiled again still reports the kernel's lines.
    text = ir_or_text if isinstance(ir_or_text, str) else ir_or_text.operation.get_asm(enable_debug_info=True)
    if keep:
        kept[stage] = text
    if dump_dir is not None:
        dump_dir.mkdir(parents=True, exist_ok=True)
        suffix = "ptx" if stage == ISA_STAGE else "mlir"
        (dump_dir / f"{name}.{stage}.{suffix}").write_text(text)
