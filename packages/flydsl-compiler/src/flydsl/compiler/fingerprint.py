"""The part of a kernel's cache key that comes from user code: everything the traced function can read.

A kernel's code is shaped by its own code and by what that code reads: the globals and closure cells it names,
its default arguments, and, transitively, the helpers it calls, the classes and instances whose attributes it
reads, and the attributes of modules it names (``helpers.twice``, ``config.TILE``). :func:`source_fingerprint`
hashes all of that with a canonical encoder:

* ``None``, bools, ints, floats (bit-exact: ``0.0`` and ``-0.0`` differ), complex numbers, strings and bytes by value;
* tuples, lists, sets and dicts by their items; enum members by class, name and value; dataclass instances by class
  and every field (``repr=False`` ones too); other instances of user classes by class and ``vars()``;
* functions by their code (bytecode, constants, names, line table) and their own dependencies, ``functools``
  wrappers (``lru_cache``, ``partial``) by what they wrap, user classes by every attribute and method;
* modules by the attributes the code names;
* FlyDSL's own functions and classes (``fx.*``) and Python's standard library by name: the compiler fingerprint
  covers their sources; FlyDSL's objects (``T``, a ``TiledCopy``, layouts) and MLIR types by value;
* the functions and classes of packages keyed by their stamps (``__flydsl_key_by_stamps__ = True`` in the package:
  FlyDSL's kernel zoo) by name too, the package named in the result (``packages``) so that the cache key takes its
  sources' hash (:func:`flydsl.compiler.cache.package_fingerprint`) and its modules' declared run-time tunables
  (:func:`flydsl.compiler.cache.package_key`): the zoo's helpers are not walked again for every kernel (5-8 ms a
  kernel in a new process); their instances (configurations) still by value.

Anything else (an open file, a tensor, an object of a C extension) cannot be fingerprinted: the result then names
it, and the kernel is compiled without the disk cache.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import sys
import types

__all__ = ["STAMPS_MARKER", "Fingerprint", "source_fingerprint"]

# Packages whose sources the compiler fingerprint covers: their objects are keyed by name.
_COVERED = ("flydsl.compiler", "flydsl.expr", "flydsl.layout", "mlir")
_PYTHON_MODULES = frozenset(sys.stdlib_module_names) | {"builtins"}
# Objects implemented in C (builtins, slot wrappers, descriptors): keyed by name.
_NATIVE_CALLABLES = (
    types.BuiltinFunctionType,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.MethodWrapperType,
    types.ClassMethodDescriptorType,
    types.GetSetDescriptorType,
    types.MemberDescriptorType,
)
_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class created at run time (by a class statement), not a C type
# Class attributes that say nothing about the code (or are encoded through their own fields).
_CLASS_SKIP = frozenset(
    {
        "__dict__",
        "__weakref__",
        "__module__",
        "__qualname__",
        "__doc__",
        "__annotations__",
        "__dataclass_fields__",
        "__dataclass_params__",
        "__match_args__",
        "__slots__",
        "__firstlineno__",
        "__static_attributes__",
        "__orig_bases__",
        "__parameters__",
        "_abc_impl",
    }
)


STAMPS_MARKER = "__flydsl_key_by_stamps__"
_STAMPED_OF: dict[str, str | None] = {}  # module name -> the package keyed by stamps it belongs to, or None


def _stamped_package(module: str) -> str | None:
    """The package keyed by its sources' stamps that ``module`` belongs to (the outermost imported package that
    sets ``__flydsl_key_by_stamps__ = True``: a library of kernels whose modules hold no state, changed at run time,
    that a kernel could read; FlyDSL's kernel zoo does), or None."""
    found = _STAMPED_OF.get(module, False)
    if found is False:
        parts = module.split(".")
        prefixes = (".".join(parts[:i]) for i in range(1, len(parts) + 1))
        found = next((p for p in prefixes if getattr(sys.modules.get(p), STAMPS_MARKER, False) is True), None)
        _STAMPED_OF[module] = found
    return found


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    """``digest``: the hash, or None when ``unknown`` (what could not be fingerprinted, as the user names it);
    ``packages``: the packages keyed by stamps whose functions or classes it names (their sources' hashes belong in
    the key beside it)."""

    digest: str | None
    unknown: str | None = None
    packages: tuple = ()


def source_fingerprint(fn: types.FunctionType, *constexprs) -> Fingerprint:
    """The fingerprint of ``fn`` and everything it reads (see the module docstring); ``constexprs``: the Constexpr
    argument values of a specialization, encoded the same way (a config's fields and its class's methods)."""
    encoder = _Encoder()
    encoder.function(fn)
    for value in constexprs:
        encoder.value(value, "a Constexpr argument", frozenset())
    if encoder.unknown:
        return Fingerprint(None, encoder.unknown[0])
    return Fingerprint(encoder.hexdigest(), packages=tuple(sorted(encoder.packages)))


def _user_module(module: str | None) -> bool:
    """Code no fingerprint of sources covers: neither FlyDSL's compiler packages, nor a package keyed by stamps,
    nor Python's own."""
    module = module or ""
    covered = module.startswith(_COVERED) or _stamped_package(module) is not None
    return not covered and module.split(".")[0] not in _PYTHON_MODULES


def _code_objects(code: types.CodeType):
    yield code
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _code_objects(constant)


_CODE_PARTS: dict[int, tuple[types.CodeType, tuple]] = {}  # id -> (code, its parts): code objects are immutable


def _code_parts(code: types.CodeType) -> tuple:
    """Everything the compiler reads of a code object: bytecode, constants (literals), names, and the positions
    that become the kernel's source locations; computed once per code object."""
    cached = _CODE_PARTS.get(id(code))
    if cached is not None and cached[0] is code:
        return cached[1]
    parts = [
        code.co_filename,
        code.co_name,
        code.co_firstlineno,
        code.co_argcount,
        code.co_kwonlyargcount,
        code.co_flags,
        code.co_code,
        getattr(code, "co_linetable", b""),
        code.co_names,
        code.co_varnames,
        code.co_freevars,
        code.co_cellvars,
    ]
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            parts.extend(_code_parts(constant))
        else:
            literal = _Encoder()
            literal.value(constant, "a constant", frozenset())
            parts.append(literal.hexdigest())
    _CODE_PARTS[id(code)] = (code, parts := tuple(parts))
    return parts


class _Encoder:
    """Collects the encoding as a flat list of str, int and bytes parts (hashed once, through their repr, which
    keeps the parts apart); functions, classes, modules and instances met again become back-references."""

    def __init__(self):
        self.parts: list = []
        self.seen: dict[int, int] = {}  # id of a function, class, module or instance -> its visit number
        self.keep: list = []  # what ``seen`` refers to stays alive until the end
        self.unknown: list[str] = []
        self.packages: set[str] = set()  # the packages keyed by stamps met

    def put(self, *parts) -> None:
        self.parts.extend(parts)

    def hexdigest(self) -> str:
        return hashlib.blake2b(repr(self.parts).encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()

    def first_visit(self, obj) -> bool:
        """True the first time; after that a back-reference (cycles and shared helpers end here)."""
        number = self.seen.get(id(obj))
        if number is not None:
            self.put("ref", number)
            return False
        self.seen[id(obj)] = len(self.seen)
        self.keep.append(obj)
        return True

    # --- values -----------------------------------------------------------------------------------------------------
    def value(self, value, where: str, names: frozenset) -> None:
        """Encodes ``value``, read at ``where``; ``names``: the attribute names the reading code uses (for modules)."""
        kind = type(value)
        if value is None or value is Ellipsis or kind is bool or kind is int or kind is str:
            self.put(kind.__name__, value)
        elif kind is float:
            self.put("float", value.hex())
        elif kind is complex:
            self.put("complex", value.real.hex(), value.imag.hex())
        elif kind is bytes:
            self.put("bytes", value)
        elif kind in (tuple, list):
            self.put(kind.__name__, len(value))
            for item in value:
                self.value(item, where, names)
        elif kind in (dict, set, frozenset):
            self.unordered(value, where, names)
        elif issubclass(kind, types.ModuleType):  # before any isinstance, which would load a lazy module (MLIR's)
            self.module(value, where, names)
        elif isinstance(value, enum.Enum):
            self.put("enum", value.name)
            self.cls(kind, where)
            self.value(value.value, where, names)
        elif isinstance(value, types.FunctionType):
            self.function(value)
        elif isinstance(value, type):
            self.cls(value, where)
        elif isinstance(value, types.MethodType):
            self.put("method")
            self.value(value.__self__, where, names)
            self.value(value.__func__, where, names)
        elif isinstance(value, functools.partial):
            self.put("partial")
            self.value((value.func, value.args, value.keywords), where, names)
        elif callable(value) and isinstance(getattr(value, "__wrapped__", None), types.FunctionType):
            # functools.lru_cache and the like, @flyc.kernel and @flyc.jit functions called from a kernel
            self.put("wrapper", kind.__module__, kind.__qualname__)
            self.function(value.__wrapped__)
        elif isinstance(value, (tuple, list, dict)) and not kind.__module__.startswith("flydsl.layout"):
            self.cls(kind, where)  # named tuples (a zoo kernel's variant), OrderedDict, ...: class and items
            base = next(b for b in (tuple, list, dict) if isinstance(value, b))
            self.value(base(value), where, names)
        elif isinstance(value, _NATIVE_CALLABLES) or not _user_module(kind.__module__):
            self.covered(value, where)
        else:
            self.instance(value, where, names)

    def unordered(self, value, where: str, names: frozenset) -> None:
        """Sets and dicts: items sorted by their own encodings, so that insertion order does not matter."""
        encoded = []
        pairs = value.items() if isinstance(value, dict) else ((item, None) for item in value)
        for item in pairs:
            inner = _Encoder()
            inner.seen, inner.keep, inner.unknown, inner.packages = self.seen, self.keep, self.unknown, self.packages
            inner.value(item, where, names)
            encoded.append(inner.hexdigest())
        self.put(type(value).__name__, len(encoded), *sorted(encoded))

    def named(self, module: str, name: str) -> None:
        """A covered function or class by name; its package noted where it is keyed by stamps."""
        self.put("named", module, name)
        package = _stamped_package(module or "")
        if package is not None:
            self.packages.add(package)

    def covered(self, value, where: str) -> None:
        """FlyDSL's and Python's own objects: functions and classes by name (their code is in the compiler
        fingerprint, a stamped package's hash or the Python version), layouts, MLIR types and instances by
        value."""
        kind = type(value)
        if kind.__module__.startswith("flydsl.layout"):
            self.put("layout", kind.__qualname__, repr(value))
        elif dataclasses.is_dataclass(value):
            self.dataclass(value, where)
        elif hasattr(kind, "__get__") and " at 0x" not in repr(value):  # a named tuple's field getters, ...
            self.put("descriptor", kind.__module__, kind.__qualname__, repr(value))
        elif isinstance(value, _NATIVE_CALLABLES) or callable(value):
            module = getattr(value, "__module__", None) or getattr(
                getattr(value, "__objclass__", None), "__module__", ""
            )
            name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
            if name is None:
                self.unknown.append(f"{where} (a {kind.__qualname__} without a name)")
            self.named(module, name)
        elif kind.__module__.startswith("mlir"):  # types and attributes: their text is their value
            self.put("mlir", kind.__qualname__, str(value))
        else:  # FlyDSL's own objects (T, a TiledCopy): their class by name, their state by value
            self.instance(value, where, frozenset())

    def instance(self, value, where: str, names: frozenset) -> None:
        kind = type(value)
        if not self.first_visit(value):
            return
        if dataclasses.is_dataclass(value):
            self.dataclass(value, where)
            return
        state = getattr(value, "__dict__", None)
        # Slots, or a base implemented in C (an int subclass, a tensor): state that vars() does not show.
        native_base = any(not base.__flags__ & _HEAP_TYPE for base in kind.__mro__[:-1])
        if state is None or native_base or getattr(kind, "__slots__", None) is not None:
            self.unknown.append(f"{where} (a {kind.__module__}.{kind.__qualname__})")
            return
        self.put("instance")
        self.cls(kind, where)
        self.unordered(state, f"{where}'s attributes", names)

    def dataclass(self, value, where: str) -> None:
        """Every field, ``repr=False`` and ``compare=False`` ones too: each may shape the code."""
        self.put("dataclass")
        self.cls(type(value), where)
        for field in dataclasses.fields(value):
            self.put(field.name)
            self.value(getattr(value, field.name), f"{where}.{field.name}", frozenset())

    # --- code -------------------------------------------------------------------------------------------------------
    def function(self, fn: types.FunctionType) -> None:
        if not _user_module(fn.__module__):
            self.named(fn.__module__, fn.__qualname__)
            return
        if not self.first_visit(fn):
            return
        where = f"{fn.__module__}.{fn.__qualname__}"
        names = frozenset(name for code in _code_objects(fn.__code__) for name in code.co_names)
        self.put("function", where)
        self.code(fn.__code__, where)
        self.value(fn.__defaults__, f"the defaults of {where}", names)
        self.value(fn.__kwdefaults__, f"the defaults of {where}", names)
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True):
            try:
                contents = cell.cell_contents
            except ValueError:  # not yet assigned
                self.put("empty cell", name)
                continue
            self.put("cell", name)
            self.value(contents, f"'{name}' (closure of {where})", names)
        module_globals = fn.__globals__
        for name in sorted(names):
            if name in module_globals:
                self.put("global", name)
                self.value(module_globals[name], f"global '{name}' of {where}", names)

    def code(self, code: types.CodeType, where: str) -> None:
        self.put(*_code_parts(code))

    def cls(self, cls: type, where: str) -> None:
        if not _user_module(cls.__module__):
            self.named(cls.__module__, cls.__qualname__)
            return
        if not self.first_visit(cls):
            return
        self.put("class", cls.__module__, cls.__qualname__)
        for base in cls.__bases__:
            self.cls(base, where)
        if issubclass(cls, enum.Enum):
            for member in cls:
                self.put(member.name)
                self.value(member.value, f"{cls.__qualname__}.{member.name}", frozenset())
        members = sorted(vars(cls).items())
        for name, member in members:
            if name in _CLASS_SKIP or (issubclass(cls, enum.Enum) and name.startswith("_")):
                continue
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            elif isinstance(member, property):
                member = (member.fget, member.fset, member.fdel)
            self.put("attribute", name)
            self.value(member, f"{cls.__qualname__}.{name}", frozenset())

    def module(self, module: types.ModuleType, where: str, names: frozenset) -> None:
        """A user module by the attributes the reading code names (``helpers.twice``, ``config.TILE``)."""
        module_name = types.ModuleType.__getattribute__(module, "__name__")  # a lazy module's, without loading it
        if not _user_module(module_name):
            self.named(module_name, "<module>")
            return
        self.put("module", module_name)
        attributes = vars(module)
        for name in sorted(names):
            if name in attributes:
                self.put("attribute", name)
                self.value(attributes[name], f"{module_name}.{name}", names)
