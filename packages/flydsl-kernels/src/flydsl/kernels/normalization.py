"""Kernels in progress (the API skeleton in norms.py is final; the kernels land in the next commits)."""


def forward(*args, **kwargs):
    raise NotImplementedError("flydsl.kernels: kernel not landed yet")


def backward(*args, **kwargs):
    raise NotImplementedError("flydsl.kernels: kernel not landed yet")
