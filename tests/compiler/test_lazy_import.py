"""``flydsl.compiler.lazy.lazy_import``: a module bound now and imported on its first attribute access, once, also
when threads read it at once."""

from __future__ import annotations

import subprocess
import sys

import pytest

from flydsl.compiler.lazy import LazyModule, lazy_import


@pytest.fixture
def package(tmp_path, monkeypatch):
    root = tmp_path / "lazy_pkg"
    root.mkdir()
    (root / "__init__.py").write_text("imports = 0\n")
    (root / "heavy.py").write_text(
        "import sys, time\nsys.modules['lazy_pkg'].imports += 1\ntime.sleep(0.05)\nVALUE = 42\n"
        "def __getattr__(name):\n    if name == 'DYNAMIC':\n        return 7\n    raise AttributeError(name)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("lazy_pkg.heavy", "lazy_pkg"):
        sys.modules.pop(name, None)


def test_the_module_is_imported_on_first_attribute_access(package):
    heavy = lazy_import("lazy_pkg.heavy")
    assert isinstance(heavy, LazyModule) and "lazy_pkg.heavy" not in sys.modules
    assert heavy.__name__ == "lazy_pkg.heavy"  # its name is there before the import
    assert heavy.VALUE == 42 and heavy.DYNAMIC == 7  # the module's own __getattr__ still answers
    assert sys.modules["lazy_pkg"].imports == 1 and sys.modules["lazy_pkg.heavy"].VALUE == 42
    with pytest.raises(AttributeError, match="MISSING"):
        _ = heavy.MISSING


def test_a_module_imported_already_is_returned_as_it_is(package):
    import lazy_pkg.heavy as loaded

    assert lazy_import("lazy_pkg.heavy") is loaded


def test_a_missing_module_raises_at_once(package):
    with pytest.raises(ModuleNotFoundError, match="lazy_pkg.absent"):
        lazy_import("lazy_pkg.absent")


_THREADS = """
import sys, threading
sys.path.insert(0, {root!r})
from flydsl.compiler.lazy import lazy_import
heavy = lazy_import("lazy_pkg.heavy")
barrier, errors, seen = threading.Barrier(8), [], []
def read():
    barrier.wait()
    try:
        seen.append(heavy.VALUE)
    except Exception as error:
        errors.append(repr(error))
threads = [threading.Thread(target=read) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
print(errors, seen, sys.modules["lazy_pkg"].imports)
"""


def test_threads_reading_it_at_once_wait_for_one_import(package):
    """Eight threads read an attribute at the same time while the import takes 50 ms: each gets the value (none
    sees a half-imported module, as importlib.util.LazyLoader lets them before Python 3.12.3), one import runs."""
    code = _THREADS.format(root=str(package))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == "[] [42, 42, 42, 42, 42, 42, 42, 42] 1"
