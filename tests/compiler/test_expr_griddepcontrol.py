"""Programmatic dependent launch: ``@flyc.kernel(dependent_launch=True)`` and ``fx.nvvm.griddepcontrol_wait`` /
``griddepcontrol_launch_dependents``. CPU: the PTX (the trigger first, loads after the wait), ptxas accepts it, the
attribute is checked. GPU (``gpu``): a chain of dependent launches, each reading what the previous one wrote while
that one lets it start early, adds up exactly; the loaded function carries the launch attribute."""

from __future__ import annotations

import re

import pytest

import flydsl.compiler as flyc
import flydsl.expr as fx
from flydsl.expr import gpu, nvvm

BLOCK = 256


@flyc.kernel(dependent_launch=True)
def add_one(src: fx.Tensor, dst: fx.Tensor, n: fx.Int32):
    """dst[i] = src[i] + 1, launched as a dependent of the previous kernel, which it reads after the wait. The
    trigger comes first: the next launch may start while this one still runs."""
    nvvm.griddepcontrol_launch_dependents()
    i = gpu.block_idx.x * BLOCK + gpu.thread_idx.x
    after_wait = nvvm.griddepcontrol_wait()
    if i < n:
        dst[i + after_wait] = src[i + after_wait] + 1


def test_dependent_launch_lowers_and_assembles():
    spec = flyc.TensorSpec((1 << 20,), "i32")
    compiled = add_one.lower(spec, spec, 1 << 20)
    ptx = compiled.ptx
    trigger, wait = ptx.index("griddepcontrol.launch_dependents;"), ptx.index("griddepcontrol.wait;")
    load = re.search(r"ld\.global[.\w]*\s", ptx)
    assert trigger < wait < load.start()
    assert compiled.cubin is not None or flyc.toolchain.find_ptxas() is None


@flyc.kernel(dependent_launch=True)
def scaled_add_one(src: fx.Tensor, weights: fx.Tensor, dst: fx.Tensor, n: fx.Int32):
    """dst[i] = src[i] * weights[i] + 1: ``weights`` (not the previous kernel's) is read before the wait, which
    takes a word of it, so that the load is issued (and lands) while the previous kernel finishes."""
    i = gpu.block_idx.x * BLOCK + gpu.thread_idx.x
    words = nvvm.ld_global_nc(weights, i, 4)
    after_wait = nvvm.griddepcontrol_wait(after=[words[0]])
    if i < n:
        dst[i + after_wait] = src[i + after_wait] * words[0] + 1


def test_wait_takes_the_loads_issued_before_it():
    spec = flyc.TensorSpec((1 << 20,), "i32")
    ptx = scaled_add_one.lower(spec, spec, spec, 1 << 20).ptx
    early, wait = ptx.index("ld.global.nc.b32"), ptx.index("griddepcontrol.wait;")
    assert early < wait < re.search(r"ld\.global\.(?!nc)[.\w]*\s", ptx).start()


@flyc.kernel(dependent_launch=True)
def wait_after_a_float(out: fx.Tensor):
    nvvm.griddepcontrol_wait(after=[fx.Float32(1.0)])


def test_wait_takes_32_bit_integers():
    with pytest.raises(TypeError, match="griddepcontrol_wait after: expected a 32-bit integer"):
        wait_after_a_float.lower(flyc.TensorSpec((4,), "i32"))


def test_dependent_launch_is_checked():
    with pytest.raises(ValueError, match="dependent_launch: expected a bool"):
        flyc.kernel(dependent_launch=1)(lambda out: None)
    assert add_one.attributes.dependent_launch and not flyc.KernelAttributes().dependent_launch


@pytest.mark.gpu
def test_chained_dependent_launches_read_what_the_previous_wrote():
    import torch

    n, steps = 1 << 24, 16  # 64 MB per buffer: many waves, so launches overlap their predecessor's tail
    buffers = [torch.zeros(n, dtype=torch.int32, device="cuda"), torch.full((n,), -7, dtype=torch.int32, device="cuda")]
    for step in range(steps):
        add_one(buffers[step % 2], buffers[(step + 1) % 2], n).launch(grid=n // BLOCK, block=BLOCK)
    torch.cuda.synchronize()
    assert torch.equal(buffers[steps % 2], torch.full((n,), steps, dtype=torch.int32, device="cuda"))
    spec = next(iter(add_one._loaded.values()))
    assert spec.function.dependent_launch


@flyc.kernel(dependent_launch=True, shared_carveout=100)
def add_one_on_shared_configured_sms(out: fx.Tensor):
    nvvm.griddepcontrol_wait()
    out[gpu.thread_idx.x] = out[gpu.thread_idx.x] + 1


def test_shared_carveout_is_checked():
    """A percent of the most shared memory (a function attribute set at load, not a PTX directive)."""
    for bad in (101, -1, 50.0, "max"):
        with pytest.raises(ValueError, match="shared_carveout: expected a percent"):
            flyc.kernel(shared_carveout=bad)(lambda out: None)
    assert add_one_on_shared_configured_sms.attributes.shared_carveout == 100
    ptx = add_one_on_shared_configured_sms.lower(flyc.TensorSpec((32,), "i32")).ptx
    assert "carveout" not in ptx


def test_a_variant_is_the_same_kernel_with_other_attributes():
    """KernelFunction.variant: the same body and parameters under another name (its own entry symbol, compiled and
    cached apart), some attributes changed, the others kept."""
    plain = flyc.kernel(dependent_launch=True)(add_one_on_shared_configured_sms.fn)
    wide = plain.variant("add_one_wide", shared_carveout=100)
    assert wide.name == "add_one_wide" and wide.attributes.shared_carveout == 100 and wide.attributes.dependent_launch
    assert plain.attributes.shared_carveout is None and [p.name for p in wide.params] == [p.name for p in plain.params]
    spec = flyc.TensorSpec((32,), "i32")
    assert ".entry add_one_wide(" in wide.lower(spec).ptx and ".entry add_one_wide(" not in plain.lower(spec).ptx
    for bad in (plain.name, "not a name", 3):
        with pytest.raises(ValueError, match="name: expected another identifier"):
            plain.variant(bad, shared_carveout=100)
    with pytest.raises(ValueError, match="shared_carveout: expected a percent"):
        plain.variant("add_one_bad", shared_carveout=200)


@pytest.mark.gpu
def test_a_loaded_kernel_takes_its_shared_carveout():
    import torch

    out = torch.zeros(32, dtype=torch.int32, device="cuda")
    add_one_on_shared_configured_sms(out).launch(grid=1, block=32)
    torch.cuda.synchronize()
    assert torch.equal(out, torch.ones_like(out))
    (loaded,) = add_one_on_shared_configured_sms._loaded.values()
    assert loaded.function.shared_carveout == 100
