"""Fixtures shared by the flydsl-torch tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def op_recorder():
    """A dispatch mode that records the name of every op dispatched inside it (``with op_recorder() as rec:`` then
    ``rec.names``)."""
    pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    return Recorder


@pytest.fixture
def aot_graphs():
    """An aot_autograd backend for ``torch.compile`` that keeps the forward and backward graphs it is given:
    ``backend, graphs = aot_graphs()``."""
    pytest.importorskip("torch")

    def make():
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd

        graphs = []

        def keep(gm, _inputs):
            graphs.append(gm)
            return make_boxed_func(gm.forward)

        return aot_autograd(fw_compiler=keep, bw_compiler=keep), graphs

    return make
