"""What the disk cache key covers: every input that shapes a kernel's code, else the kernel is not cached.

The two-version cases: version 1 of a kernel's dependency is lowered, the dependency is changed as a user would
(the file edited and imported again, as a new process would; or the global changed in place), and the kernel,
with an empty in-memory cache, is lowered again: its PTX must follow the change (be what a compile without the
cache gives, and differ from version 1's).
"""

from __future__ import annotations

import dataclasses
import importlib
import linecache
import sys
import textwrap
import warnings
from typing import NamedTuple

import pytest

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.compiler import cache, fingerprint, toolchain
from flydsl.compiler.fingerprint import source_fingerprint
from flydsl.compiler.kernel import KernelFunction

from .fakes import FakeGpuTensor

_KERNEL = """
import flydsl.compiler as flyc
import flydsl.expr as fx
{imports}

{definitions}

@flyc.kernel
def k(x: fx.Tensor, y: fx.Tensor{parameters}):
    y[0] = x[0] * {scale}
"""


def _kernel(scale: str, definitions: str = "", imports: str = "", parameters: str = "") -> str:
    return _KERNEL.format(imports=imports, definitions=textwrap.dedent(definitions), parameters=parameters, scale=scale)


def _edit(**files):
    """Version 2 as an edit of these files (imported again, as by a new process)."""
    return files


def _set(change):
    """Version 2 as a change of the live objects: ``change(package)``."""
    return change


_HELPERS_V1 = "def twice(v):\n    return v * 3.0\n"
_HELPERS_V2 = "def twice(v):\n    return v * 5.0\n"
_CONFIG = "S = {}\n"

# name: (version 1's files {module: source}, version 2: an edit or a change)
TWO_VERSIONS = {
    "the kernel's own source": ({"k": _kernel("3.0")}, _edit(k=_kernel("5.0"))),
    "a helper it calls": (
        {"k": _kernel("twice(1.0)", "def twice(v):\n    return v * 3.0\n")},
        _edit(k=_kernel("twice(1.0)", "def twice(v):\n    return v * 5.0\n")),
    ),
    "a helper of a helper": (
        {"k": _kernel("outer()", "def inner():\n    return 3.0\n\ndef outer():\n    return inner()\n")},
        _edit(k=_kernel("outer()", "def inner():\n    return 5.0\n\ndef outer():\n    return inner()\n")),
    ),
    "a helper called through a module": (
        {"k": _kernel("helpers.twice(1.0)", imports="from . import helpers"), "helpers": _HELPERS_V1},
        _edit(helpers=_HELPERS_V2),
    ),
    "a helper imported from a module": (
        {"k": _kernel("twice(1.0)", imports="from .helpers import twice"), "helpers": _HELPERS_V1},
        _edit(helpers=_HELPERS_V2),
    ),
    "module.CONST": (
        {"k": _kernel("config.S", imports="from . import config"), "config": _CONFIG.format(3.0)},
        _edit(config=_CONFIG.format(5.0)),
    ),
    "module.CONST set at run time": (
        {"k": _kernel("config.S", imports="from . import config"), "config": _CONFIG.format(3.0)},
        _set(lambda package: setattr(package.config, "S", 5.0)),
    ),
    "a global float": ({"k": _kernel("S", "S = 3.0")}, _edit(k=_kernel("S", "S = 5.0"))),
    "a global int": ({"k": _kernel("float(N)", "N = 3")}, _edit(k=_kernel("float(N)", "N = 5"))),
    "a global string": (
        {"k": _kernel("(3.0 if OP == 'a' else 5.0)", "OP = 'a'")},
        _set(lambda package: setattr(package.k, "OP", "b")),
    ),
    "a global tuple": ({"k": _kernel("T[1]", "T = (1, 3.0)")}, _set(lambda package: setattr(package.k, "T", (1, 5.0)))),
    "a global list": ({"k": _kernel("L[0]", "L = [3.0]")}, _set(lambda package: package.k.L.__setitem__(0, 5.0))),
    "a global dict": (
        {"k": _kernel("D['s']", "D = {'s': 3.0}")},
        _set(lambda package: package.k.D.__setitem__("s", 5.0)),
    ),
    "a class attribute": (
        {"k": _kernel("Cfg.S", "class Cfg:\n    S = 3.0\n")},
        _set(lambda package: setattr(package.k.Cfg, "S", 5.0)),
    ),
    "a nested class attribute": (
        {"k": _kernel("Outer.Inner.S", "class Outer:\n    class Inner:\n        S = 3.0\n")},
        _edit(k=_kernel("Outer.Inner.S", "class Outer:\n    class Inner:\n        S = 5.0\n")),
    ),
    "a method of a global instance": (
        {"k": _kernel("h.scale(1.0)", "class H:\n    def scale(self, v):\n        return v * 3.0\n\nh = H()\n")},
        _edit(k=_kernel("h.scale(1.0)", "class H:\n    def scale(self, v):\n        return v * 5.0\n\nh = H()\n")),
    ),
    "an attribute of a global instance": (
        {"k": _kernel("h.s", "class H:\n    def __init__(self):\n        self.s = 3.0\n\nh = H()\n")},
        _set(lambda package: setattr(package.k.h, "s", 5.0)),
    ),
    "a property of a global instance": (
        {"k": _kernel("h.s", "class H:\n    @property\n    def s(self):\n        return 3.0\n\nh = H()\n")},
        _edit(k=_kernel("h.s", "class H:\n    @property\n    def s(self):\n        return 5.0\n\nh = H()\n")),
    ),
    "an enum value": (
        {"k": _kernel("E.A.value", "class E(enum.Enum):\n    A = 3.0\n", imports="import enum")},
        _edit(k=_kernel("E.A.value", "class E(enum.Enum):\n    A = 5.0\n", imports="import enum")),
    ),
    "a default argument": (
        {"k": _kernel("twice(1.0)", "S = 3.0\n\ndef twice(v, k=S):\n    return v * k\n")},
        _edit(k=_kernel("twice(1.0)", "S = 5.0\n\ndef twice(v, k=S):\n    return v * k\n")),
    ),
    "a keyword-only default": (
        {"k": _kernel("twice(1.0)", "S = 3.0\n\ndef twice(v, *, k=S):\n    return v * k\n")},
        _edit(k=_kernel("twice(1.0)", "S = 5.0\n\ndef twice(v, *, k=S):\n    return v * k\n")),
    ),
    "an lru_cache helper": (
        {"k": _kernel("scale()", "@functools.lru_cache\ndef scale():\n    return 3.0\n", imports="import functools")},
        _edit(k=_kernel("scale()", "@functools.lru_cache\ndef scale():\n    return 5.0\n", imports="import functools")),
    ),
    "a closure cell": (
        {"k": _kernel("make()()", "S = 3.0\n\ndef make(s=S):\n    return lambda: s\n")},
        _edit(k=_kernel("make()()", "S = 5.0\n\ndef make(s=S):\n    return lambda: s\n")),
    ),
    "a frozen dataclass global": (
        {
            "k": _kernel(
                "CFG.s",
                "@dataclasses.dataclass(frozen=True)\nclass C:\n    s: float\n\nCFG = C(3.0)\n",
                imports="import dataclasses",
            )
        },
        _set(lambda package: setattr(package.k, "CFG", package.k.C(5.0))),
    ),
    "a frozen dataclass Constexpr with a repr=False field": (
        {
            "k": _kernel("c.s", imports="from .config import C", parameters=", c: fx.Constexpr"),
            "config": "import dataclasses\n\n@dataclasses.dataclass(frozen=True)\nclass C:\n"
            "    s: float = dataclasses.field(repr=False)\n\nARGS = (C(3.0),)\n",
        },
        _set(lambda package: setattr(package.config, "ARGS", (package.config.C(5.0),))),
    ),
    "the sign of a zero Constexpr": (
        {"k": _kernel("c", parameters=", c: fx.Constexpr[float]"), "config": "ARGS = (0.0,)\n"},
        _set(lambda package: setattr(package.config, "ARGS", (-0.0,))),
    ),
}


def _write(root, package: str, files: dict) -> None:
    directory = root / package
    directory.mkdir(exist_ok=True)
    (directory / "__init__.py").write_text("")
    for name, source in files.items():
        (directory / f"{name}.py").write_text(source)


def _import(package: str):
    """The package's modules imported afresh (as a new process would: no module, source line or bytecode kept)."""
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[name]
    linecache.clearcache()
    importlib.invalidate_caches()
    loaded = importlib.import_module(package)
    for module in ("k", "helpers", "config"):
        try:
            importlib.import_module(f"{package}.{module}")
        except ModuleNotFoundError:
            pass
    return loaded


def _lower(package) -> str:
    extra = getattr(getattr(package, "config", None), "ARGS", ())
    kernel = KernelFunction(package.k.k.fn)  # an empty in-memory cache
    return kernel.lower(FakeGpuTensor((8,)), FakeGpuTensor((8,), pointer=1 << 21), *extra).ptx


@pytest.mark.parametrize("case", list(TWO_VERSIONS))
def test_the_cached_ptx_follows_every_change(case, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.syspath_prepend(str(tmp_path))
    package_name = "versions_" + "".join(c if c.isalnum() else "_" for c in case)
    first_files, change = TWO_VERSIONS[case]
    _write(tmp_path, package_name, first_files)
    package = _import(package_name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every case is fingerprinted: no "not cached" warning
        first = _lower(package)
        if callable(change):
            change(package)
        else:
            _write(tmp_path, package_name, change)
            package = _import(package_name)
        second = _lower(package)
    monkeypatch.setenv("FLYDSL_RUNTIME_ENABLE_CACHE", "0")
    assert second == _lower(package), "the disk cache served a stale kernel"
    assert second != first


_STAMPED_V1 = (
    "import typing\n\nclass Pair(typing.NamedTuple):\n    a: int\n    b: int\n\ndef twice(v):\n    return v * 3.0\n"
)


def test_a_package_keyed_by_stamps_is_named_and_its_sources_hashed(tmp_path, monkeypatch):
    """A helper of a package keyed by stamps (as the zoo is) is named in the kernel's fingerprint, not walked, and
    the package's sources' hash is in the cache key: an edit of the helper (seen by a new process) compiles again."""
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(fingerprint, "_STAMPED_OF", {})
    _write(tmp_path, "stamped_lib", {"helpers": _STAMPED_V1})
    (tmp_path / "stamped_lib" / "__init__.py").write_text(f"{fingerprint.STAMPS_MARKER} = True\n")
    _write(tmp_path, "stamped_user", {"k": _kernel("twice(1.0)", imports="from stamped_lib.helpers import twice")})

    def new_process():
        cache.package_fingerprint.cache_clear()  # (computed once per process)
        _import("stamped_lib")
        return _import("stamped_user")

    package = new_process()
    first_print, first = source_fingerprint(package.k.k.fn), _lower(package)
    assert first_print.packages == ("stamped_lib",)
    (tmp_path / "stamped_lib" / "helpers.py").write_text(_STAMPED_V1.replace("3.0", "5.25"))
    package = new_process()
    second_print, second = source_fingerprint(package.k.k.fn), _lower(package)
    assert second_print == first_print  # named, not walked: the edit shows in the package's hash
    assert second != first
    monkeypatch.setenv("FLYDSL_RUNTIME_ENABLE_CACHE", "0")
    assert second == _lower(package)
    pair = sys.modules["stamped_lib.helpers"].Pair  # its instances (a zoo kernel's variant) keyed by value
    keyed = [source_fingerprint(package.k.k.fn, pair(1, b)) for b in (2, 3)]
    assert keyed[0].digest is not None and keyed[0].digest != keyed[1].digest


def test_a_stamped_packages_declared_tunables_are_in_the_key(tmp_path, monkeypatch):
    """A module of a package keyed by stamps that declares constants tunable (``cache.declare_tunables``: the zoo's
    mainloop unroll, a chooser's gains) has those that differ from its sources' values in the keys: one set at run
    time before a kernel is first compiled gets a kernel of its own from the disk cache, not the default's, and an
    unchanged one leaves the key as it was."""
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(fingerprint, "_STAMPED_OF", {})
    helpers = (
        "from flydsl.compiler import cache\n\nFACTOR = 3.0\ncache.declare_tunables(__name__, 'FACTOR')\n\n"
        "def twice(v):\n    return v * FACTOR\n"
    )
    _write(tmp_path, "tunable_lib", {"helpers": helpers})
    (tmp_path / "tunable_lib" / "__init__.py").write_text(f"{fingerprint.STAMPS_MARKER} = True\n")
    _write(tmp_path, "tunable_user", {"k": _kernel("twice(1.0)", imports="from tunable_lib.helpers import twice")})
    _import("tunable_lib")
    package = _import("tunable_user")
    first = _lower(package)
    assert "tunables" not in cache.package_key("tunable_lib")
    monkeypatch.setattr(sys.modules["tunable_lib.helpers"], "FACTOR", 5.25)
    assert "tunables [('tunable_lib.helpers', 'FACTOR', 5.25)]" in cache.package_key("tunable_lib")
    second = _lower(package)
    assert second != first
    monkeypatch.setenv("FLYDSL_RUNTIME_ENABLE_CACHE", "0")
    assert second == _lower(package)


def test_the_ptxas_in_use_is_in_the_key(tmp_path, monkeypatch):
    """Two ptxas (FLYDSL_PTXAS) whose --version differ give two cubins, not one served for both."""
    monkeypatch.setenv("FLYDSL_COMPILE_ISOLATED", "0")
    tools = []
    for version in (1, 2):
        tool = tmp_path / f"ptxas{version}"
        tool.write_text(
            "#!/bin/sh\n"
            f'if [ "$1" = --version ]; then echo "stand-in ptxas {version}"; exit 0; fi\n'
            'while [ $# -gt 0 ]; do if [ "$1" = -o ]; then out="$2"; fi; shift; done\n'
            f'printf "cubin {version}" > "$out"\n'
        )
        tool.chmod(0o755)
        tools.append(tool)

    @flyc.kernel
    def copy(x: fx.Tensor, y: fx.Tensor):
        y[0] = x[0]

    cubins = []
    for tool in tools:
        monkeypatch.setenv("FLYDSL_PTXAS", str(tool))
        cubins.append(KernelFunction(copy.fn).lower(FakeGpuTensor((8,)), FakeGpuTensor((8,))).cubin)
    assert cubins == [b"cubin 1", b"cubin 2"]
    assert "stand-in ptxas 2" in toolchain.fingerprint()


def test_zero_and_negative_zero_constexprs_have_their_own_keys_and_kernels():
    @flyc.kernel
    def scaled(x: fx.Tensor, y: fx.Tensor, c: fx.Constexpr[float]):
        y[0] = x[0] * c

    x, y = FakeGpuTensor((8,)), FakeGpuTensor((8,))
    positive, negative = scaled.specialize([x, y, 0.0]), scaled.specialize([x, y, -0.0])
    assert positive.key != negative.key
    assert "0f00000000" in scaled.lower(x, y, 0.0).ptx and "0f80000000" in scaled.lower(x, y, -0.0).ptx


def test_the_native_path_matches_float_constexprs_bit_for_bit():
    """The native dispatcher does not launch the 0.0 kernel for -0.0 (they are == and hash alike in Python)."""
    from .test_dispatch import FakeTorchTensor, _registered

    @flyc.kernel
    def scaled(x: fx.Tensor, y: fx.Tensor, c: fx.Constexpr[float], s: fx.Stream):
        y[0] = x[0] * c

    values = (FakeTorchTensor((64,)), FakeTorchTensor((64,)), 0.0, 3)
    dispatcher, _ = _registered(scaled, values)
    assert dispatcher._dry_run(values, 1, 32) is not None
    assert dispatcher._dry_run((*values[:2], float("0.0"), 3), 1, 32) is not None  # an equal float object
    assert dispatcher._dry_run((*values[:2], -0.0, 3), 1, 32) is None


@dataclasses.dataclass(frozen=True)
class _Scales:
    low: float
    high: float = 1.0


class _Pair(NamedTuple):
    low: float
    high: float


@flyc.kernel
def _scaled_by_first(x: fx.Tensor, y: fx.Tensor, c: fx.Constexpr, s: fx.Stream):
    y[0] = x[0] * (c.low if isinstance(c, _Scales) else c[0])


@pytest.mark.parametrize(
    "make",
    [lambda zero: (zero, 2), lambda zero: _Scales(zero), lambda zero: _Pair(zero, 1.0)],
    ids=["tuple", "dataclass", "named tuple"],
)
def test_negative_zeros_inside_constexprs_have_their_own_keys_and_kernels(make):
    """A tuple or dataclass Constexpr holding -0.0 equals (and hashes as) its 0.0 twin: still two kernels, in the
    Python path's keys and in the native dispatcher's matches."""
    from .test_dispatch import FakeTorchTensor, _registered

    positive, negative, twin = make(0.0), make(-0.0), make(0.0)  # twin: equal to positive, another object
    assert positive == negative and hash(positive) == hash(negative)
    x, y = FakeGpuTensor((8,)), FakeGpuTensor((8,))
    kernel = _scaled_by_first
    assert kernel.specialize([x, y, positive, 0]).key != kernel.specialize([x, y, negative, 0]).key
    assert "0f00000000" in kernel.lower(x, y, positive, 0).ptx
    assert "0f80000000" in kernel.lower(x, y, negative, 0).ptx
    values = (FakeTorchTensor((64,)), FakeTorchTensor((64,)), positive, 3)
    dispatcher, _ = _registered(kernel, values)
    assert twin is not positive and dispatcher._dry_run((*values[:2], twin, 3), 1, 32) is not None
    assert dispatcher._dry_run((*values[:2], negative, 3), 1, 32) is None


def test_a_negative_zero_is_found_anywhere_in_a_constexpr():
    from flydsl.compiler.args import holds_negative_zero as holds

    assert holds(-0.0) and holds(((1, -0.0),)) and holds(frozenset({-0.0})) and holds(_Scales(1.0, -0.0))
    assert not holds(0.0) and not holds(((1, 0.0),)) and not holds("-0.0") and not holds(_Scales(0.0)) and not holds(0)


_LOCK = __import__("threading").Lock()


def _reads_a_lock(x: fx.Tensor, y: fx.Tensor):
    y[0] = x[0] * (3.0 if _LOCK is not None else 5.0)


def test_what_cannot_be_fingerprinted_makes_the_kernel_uncached_with_one_warning(tmp_path):
    kernel = KernelFunction(_reads_a_lock)
    args = FakeGpuTensor((8,)), FakeGpuTensor((8,))
    with pytest.warns(UserWarning, match=r"kernel '_reads_a_lock' is not cached on disk: global '_LOCK'.*_thread"):
        first = kernel.lower(*args)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per kernel
        assert kernel.lower(*args) == first
    assert not list((tmp_path / "flydsl-cache").rglob("*.flyc"))


# --- the fingerprint itself ------------------------------------------------------------------------------------------


def test_the_fingerprint_follows_the_code_of_called_helpers():
    def helper_one(v):
        return v

    def helper_two(v):
        return v + v

    def make(helper):
        def k(x: fx.Tensor):
            x[0] = helper(x[0])

        return k

    assert source_fingerprint(make(helper_one)) != source_fingerprint(make(helper_two))
    assert source_fingerprint(make(helper_one)) == source_fingerprint(make(helper_one))


@dataclasses.dataclass(frozen=True)
class _Tile:
    m: int


TILE = _Tile(4)


def _reads_config(x: fx.Tensor):
    x[0] = x[TILE.m]


def test_the_fingerprint_follows_config_globals(monkeypatch):
    first = source_fingerprint(_reads_config)
    monkeypatch.setitem(globals(), "TILE", _Tile(8))
    assert source_fingerprint(_reads_config) != first


def _helper_class(body: str):
    """A class ``Helper`` with one method whose code is ``body`` (as kernels' helper classes have)."""
    namespace: dict = {"__name__": __name__}
    exec(f"class Helper:\n    def scaled(self, v):\n        return {body}\n", namespace)
    return namespace["Helper"]


def _uses_helper(x: fx.Tensor):
    x[0] = Helper().scaled(x[0])  # noqa: F821 (set by the test)


def test_the_fingerprint_follows_methods_of_helper_classes(monkeypatch):
    monkeypatch.setitem(globals(), "Helper", _helper_class("v + v"))
    first = source_fingerprint(_uses_helper)
    monkeypatch.setitem(globals(), "Helper", _helper_class("v * 3"))
    assert source_fingerprint(_uses_helper) != first


@dataclasses.dataclass(frozen=True)
class _Shape:
    m: int

    @property
    def rows(self) -> int:
        return self.m


def test_the_fingerprint_follows_the_code_of_constexpr_classes():
    """Two configs with equal reprs whose properties differ give different keys (the repr alone would not)."""
    namespace: dict = {"dataclasses": dataclasses, "__name__": __name__}
    exec(
        "@dataclasses.dataclass(frozen=True)\nclass _Shape:\n    m: int\n\n    @property\n"
        "    def rows(self) -> int:\n        return 2 * self.m\n",
        namespace,
    )
    other = namespace["_Shape"](4)
    assert repr(other) == repr(_Shape(4))
    assert source_fingerprint(_reads_config, _Shape(4)) != source_fingerprint(_reads_config, other)
    assert source_fingerprint(_reads_config, _Shape(4)) == source_fingerprint(_reads_config, _Shape(4))


def test_the_fingerprint_is_canonical():
    """Equal values encode alike whatever their insertion order; numbers keep their type and sign."""
    from flydsl.compiler.fingerprint import _Encoder

    def encode(value) -> str:
        encoder = _Encoder()
        encoder.value(value, "v", frozenset())
        assert not encoder.unknown
        return encoder.hexdigest()

    assert encode({"a": 1, "b": 2}) == encode({"b": 2, "a": 1})
    assert encode({1, 2, 3}) == encode({3, 2, 1})
    assert len({encode(v) for v in (0.0, -0.0, 0, False, None, "0", b"0", (0,), [0])}) == 9
    assert encode(("a", "b")) != encode(("ab",))


class _Scale(int):
    """An int whose value vars() does not show."""


def test_instances_with_state_outside_vars_are_not_fingerprinted():
    def reads(value):
        def k(x: fx.Tensor):
            x[0] = x[0] * float(value)

        return k

    assert source_fingerprint(reads(_Scale(3))).digest is None
    assert "_Scale" in source_fingerprint(reads(_Scale(3))).unknown


def test_flydsl_objects_read_by_a_kernel_are_keyed_by_value():
    """``T`` and a global TiledCopy (the tests' own kernels read them) are fingerprinted, the copy by its layouts."""
    import flydsl.layout as fl
    from flydsl.expr import T

    def reads(copier):
        def k(x: fx.Tensor):
            x[0] = x[0] if (T, copier) else x[1]

        return k

    def copier(values: int):
        return fx.TiledCopy(thr_layout=fl.Layout((16, 8), (8, 1)), val_layout=fl.Layout((1, values)))

    first = source_fingerprint(reads(copier(8)))
    assert first.digest is not None
    assert source_fingerprint(reads(copier(8))) == first
    assert source_fingerprint(reads(copier(4))) != first
