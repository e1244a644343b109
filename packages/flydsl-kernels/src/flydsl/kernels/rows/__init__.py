"""What the row kernels (norms, softmax) share: the thread layout of a row (:mod:`.layout`), its memory accesses and
reductions on the device (:mod:`.tiles`, :mod:`.reduce`), the staged kernels' shared-memory ring and the exchange of
partial results between a row's CTAs (:mod:`.ring`, :mod:`.exchange`), the staged forward's body
(:mod:`.staged_forward`), the kernels' configurations (:mod:`.configs`), the router that picks kernel and
configuration for an input (:mod:`.router`) and the launch helpers (:mod:`.launch`)."""

from flydsl.kernels.rows.router import Route, RowKernel, RowOp, route

__all__ = ["Route", "RowKernel", "RowOp", "route"]
