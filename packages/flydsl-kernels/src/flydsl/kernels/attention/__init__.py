"""Attention for LLM serving: :func:`paged_decode` (a decode step over a paged KV cache, bf16/fp16 or fp8, split
over CTAs for long contexts) and :func:`write_kv` (the new tokens' keys and values into the cache, quantized where
it is fp8). :mod:`.reference` holds the float32 torch reference the tests and benchmarks compare with."""

from flydsl.kernels.attention.api import paged_decode

__all__ = ["paged_decode", "write_kv"]


def __getattr__(name):
    if name == "write_kv":  # its module imports the compiler: loaded on first use
        from flydsl.kernels.attention.cache import write_kv

        return write_kv
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
