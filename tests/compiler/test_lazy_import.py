"""``flydsl.compiler.lazy.lazy_import``: a module bound now and executed on its first attribute access."""

from __future__ import annotations

import sys

import pytest

from flydsl.compiler.lazy import lazy_import


@pytest.fixture
def module_dir(tmp_path, monkeypatch):
    package = tmp_path / "lazy_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "heavy.py").write_text("import sys\nsys.modules['lazy_pkg'].executed = True\nVALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield package
    for name in ("lazy_pkg.heavy", "lazy_pkg"):
        sys.modules.pop(name, None)


def test_the_module_runs_on_first_attribute_access(module_dir):
    heavy = lazy_import("lazy_pkg.heavy")
    parent = sys.modules["lazy_pkg"]
    assert not hasattr(parent, "executed")
    assert parent.heavy is heavy and sys.modules["lazy_pkg.heavy"] is heavy  # bound as `import lazy_pkg.heavy` binds
    assert heavy.VALUE == 42
    assert parent.executed


def test_a_module_imported_already_is_returned_as_it_is(module_dir):
    import lazy_pkg.heavy as loaded

    assert lazy_import("lazy_pkg.heavy") is loaded


def test_a_missing_module_raises_at_once(module_dir):
    with pytest.raises(ModuleNotFoundError, match="lazy_pkg.absent"):
        lazy_import("lazy_pkg.absent")
