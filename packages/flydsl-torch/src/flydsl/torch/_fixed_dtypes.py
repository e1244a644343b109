"""Modules whose fp8 weights and float32 scales keep their dtypes under ``module.to(dtype)``, ``.half()`` and the like:
torch casts every floating-point buffer, float8 included, which would turn e4m3 weights into bf16 ones and round
their scales (the kernels then refuse them, or read wrong values). Device moves still apply."""

from __future__ import annotations

import torch

__all__ = ["FixedDtypeBuffers"]


class FixedDtypeBuffers(torch.nn.Module):
    """A mixin: the buffers named in ``fixed_dtype_buffers`` go through ``_apply``'s function for their device only,
    keeping their dtype (and values) when the function casts."""

    fixed_dtype_buffers: tuple = ()

    def _apply(self, fn, recurse=True):
        held = {name: self._buffers.pop(name) for name in self.fixed_dtype_buffers if name in self._buffers}
        try:
            return super()._apply(fn, recurse)
        finally:
            for name, tensor in held.items():
                if tensor is not None:
                    applied = fn(tensor)
                    tensor = applied if applied.dtype == tensor.dtype else tensor.to(applied.device)
                self._buffers[name] = tensor
