"""The kernel cache: compiled modules in memory and on disk (``~/.cache/flydsl`` or ``FLYDSL_CACHE_DIR``).

The key covers the kernel's source and every user function, class and simple global it reaches, the specialization
(argument types, strides, alignment, constexpr values), the target, and a fingerprint of the compiler itself (its
Python sources and native library), so that a development build never reuses a stale binary. Globals reached only
through attributes (``config.TILE``) are not followed: pass such values as ``Constexpr`` parameters. Entries are written
atomically (a temporary file renamed into place), so processes compiling the same kernel at once are safe; an entry
that cannot be read is compiled again with a warning. ``FLYDSL_RUNTIME_ENABLE_CACHE=0`` bypasses the disk cache.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import pickle
import sys
import tempfile
import types
import warnings
from pathlib import Path

from flydsl.compiler import settings
from flydsl.compiler.pipeline import CompiledModule

__all__ = ["compiler_fingerprint", "source_fingerprint", "load", "store"]

_FORMAT = 2  # 2: modules keep ptxas's performance notes


@functools.lru_cache(maxsize=1)
def compiler_fingerprint() -> str:
    """A hash of FlyDSL's own Python sources (layout, compiler, expr) and of its native library's file stamp."""
    import flydsl.compiler as compiler_package
    import flydsl.expr as expr_package
    import flydsl.layout as layout_package

    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"format {_FORMAT}".encode())
    for package in (layout_package, compiler_package, expr_package):
        root = Path(package.__file__).parent
        for path in sorted(root.rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(path.read_bytes())
    from flydsl.compiler import _fly

    stat = os.stat(_fly.__file__)
    digest.update(f"{_fly.__file__}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()


_SIMPLE = (int, float, str, bool, bytes, type(None))


def source_fingerprint(fn: types.FunctionType, *constexprs) -> str:
    """A hash of ``fn``'s source, of the functions and kernels it calls outside FlyDSL's own packages (whose
    sources the compiler fingerprint covers), of the classes it reads (every method: a helper class's, a config's
    properties), and of the globals it reads whose repr is their value (numbers, strings, tuples, layouts, frozen
    dataclasses such as tile configurations), transitively. ``constexprs``: the Constexpr argument values of a
    specialization, whose classes' code shapes the kernel as their values do."""
    digest = hashlib.blake2b(digest_size=16)
    seen: set[int] = set()

    def visit(function: types.FunctionType):
        if id(function) in seen:
            return
        seen.add(id(function))
        try:
            digest.update(inspect.getsource(function).encode())
        except (OSError, TypeError):
            digest.update(function.__code__.co_code)
        for code in _code_objects(function.__code__):
            for name in code.co_names:
                see(name, function.__globals__.get(name))
        for cell in function.__closure__ or ():
            try:
                see("<closure>", cell.cell_contents)
            except ValueError:
                continue

    def visit_class(cls: type):
        if id(cls) in seen or not _user_module(cls.__module__):
            return
        seen.add(id(cls))
        digest.update(f"class {cls.__module__}.{cls.__qualname__}".encode())
        for member in vars(cls).values():
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            elif isinstance(member, property):
                member = member.fget
            if isinstance(member, types.FunctionType):
                visit(member)
        for base in cls.__bases__:
            visit_class(base)

    def see(name: str, value):
        if isinstance(value, types.FunctionType):
            if _user_module(value.__module__):
                visit(value)  # user code, flydsl.kernels helpers included
        elif isinstance(getattr(value, "fn", None), types.FunctionType):
            visit(value.fn)  # a @kernel called from this one
        elif isinstance(value, type):
            visit_class(value)
        elif _by_value(value):
            digest.update(f"{name}={value!r}".encode())
            for item in value if isinstance(value, tuple) else (value,):
                visit_class(type(item))

    visit(fn)
    for value in constexprs:
        see("<constexpr>", value)
    return digest.hexdigest()


def _user_module(module: str | None) -> bool:
    """Code the compiler fingerprint does not cover: neither FlyDSL's compiler packages nor Python's own."""
    module = module or ""
    return not module.startswith(_FINGERPRINTED) and module.split(".")[0] not in _PYTHON_MODULES


# Packages whose sources the compiler fingerprint already covers.
_FINGERPRINTED = ("flydsl.compiler", "flydsl.expr", "flydsl.layout", "mlir")
_PYTHON_MODULES = frozenset(sys.stdlib_module_names) | {"builtins"}


def _by_value(value) -> bool:
    """Globals whose repr is their value: numbers, strings, tuples of them, layouts, frozen dataclasses (configs)."""
    if isinstance(value, _SIMPLE):
        return True
    if isinstance(value, tuple):
        return all(_by_value(v) for v in value)
    module = type(value).__module__
    if module.startswith("flydsl.layout"):
        return True
    params = getattr(type(value), "__dataclass_params__", None)
    return params is not None and params.frozen


def _code_objects(code: types.CodeType):
    yield code
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _code_objects(constant)


def _entry_path(key: str) -> Path:
    return settings.current().cache_dir / key[:2] / f"{key}.pkl"


def load(key: str) -> CompiledModule | None:
    """The cached module for ``key``, or None (also when the disk cache is disabled or the entry is unreadable)."""
    if not settings.current().cache_enabled:
        return None
    path = _entry_path(key)
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        entry = pickle.loads(data)
        if not isinstance(entry, CompiledModule):
            raise TypeError(f"unexpected {type(entry).__name__}")
        return entry
    except Exception as error:  # noqa: BLE001 - any unreadable entry is recompiled
        warnings.warn(f"FlyDSL: ignoring the unreadable cache entry {path} ({error}); compiling again", stacklevel=3)
        return None


def store(key: str, compiled: CompiledModule) -> None:
    """Writes the entry atomically (temporary file + rename); failures to write only warn."""
    if not settings.current().cache_enabled:
        return
    path = _entry_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        slim = CompiledModule(
            name=compiled.name,
            target=compiled.target,
            ptx=compiled.ptx,
            cubin=compiled.cubin,
            kernels=compiled.kernels,
            shared_bytes=compiled.shared_bytes,
            launch_shapes=compiled.launch_shapes,
            performance_notes=compiled.performance_notes,
        )
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".tmp") as handle:
            handle.write(pickle.dumps(slim, protocol=pickle.HIGHEST_PROTOCOL))
            temporary = handle.name
        os.replace(temporary, path)
    except OSError as error:
        warnings.warn(f"FlyDSL: could not write the cache entry {path}: {error}", stacklevel=3)
