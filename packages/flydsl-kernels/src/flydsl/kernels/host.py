"""Where the GEMM's host code imports its device queries and stream scratch key from until it moves to
:mod:`flydsl.kernels.device` and :mod:`flydsl.kernels.memory` (their one implementation)."""

from flydsl.kernels.device import sm_count
from flydsl.kernels.memory import stream_key

__all__ = ["sm_count", "stream_key"]
