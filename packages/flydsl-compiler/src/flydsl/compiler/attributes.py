"""What ``@kernel(...)`` promises the compiler about every launch (block and cluster shapes, register caps,
programmatic dependent launch), as PTX directives and as checks of each launch; also settable while tracing."""

from __future__ import annotations

from dataclasses import dataclass

from flydsl.compiler.lazy import lazy_import

ir = lazy_import("mlir.ir")


__all__ = ["KernelAttributes", "check_launch_shape", "set_kernel_attributes"]


@dataclass(frozen=True)
class KernelAttributes:
    """What ``@kernel(...)`` promises the compiler about every launch (PTX performance-tuning directives):

    * ``threads``: the exact block size (``.reqntid``); launches with another block size are refused. With
      ``min_blocks_per_sm`` it gives the kernel the register cap that ``nvvm.setmaxnreg`` needs.
    * ``max_registers``: registers per thread (``.maxnreg``).
    * ``min_blocks_per_sm``: blocks that must fit on one SM at once (``.minnctapersm``).
    * ``cluster``: the cluster shape, compiled in (``.reqnctapercluster``); the grid must be a multiple of it.
    * ``dependent_launch``: launched with programmatic dependent launch (a launch attribute, not a directive): the
      kernel may start while the stream's previous kernel finishes, and must call
      :func:`flydsl.expr.nvvm.griddepcontrol_wait` before touching memory that kernel may write or read.
    * ``shared_carveout``: the SMs that run the kernel are configured with this percent of the most shared memory
      (100: all of it, the least L1; a function attribute set when the kernel loads, not a directive). An SM changes
      its configuration only when idle, so a kernel whose dependents' CTAs need much shared memory beside its own
      CTAs sets 100 for them to start while it runs.
    """

    threads: tuple[int, ...] | None = None
    max_registers: int | None = None
    min_blocks_per_sm: int | None = None
    cluster: tuple[int, ...] | None = None
    dependent_launch: bool = False
    shared_carveout: int | None = None

    def __post_init__(self):
        for name in ("threads", "cluster"):
            value = getattr(self, name)
            if value is None:
                continue
            dims = (value,) if isinstance(value, int) else tuple(value)
            if not 1 <= len(dims) <= 3 or not all(isinstance(d, int) and d >= 1 for d in dims):
                raise ValueError(f"kernel {name}: expected 1 to 3 positive ints, got {value!r}")
            object.__setattr__(self, name, dims + (1,) * (3 - len(dims)))
        if self.threads is not None and self.threads[0] * self.threads[1] * self.threads[2] > 1024:
            raise ValueError(f"kernel threads: a block has at most 1024 threads, got {self.threads}")
        if self.max_registers is not None and not (
            isinstance(self.max_registers, int) and 24 <= self.max_registers <= 255
        ):
            raise ValueError(f"kernel max_registers: expected an int in 24..255, got {self.max_registers!r}")
        if self.min_blocks_per_sm is not None and not (
            isinstance(self.min_blocks_per_sm, int) and self.min_blocks_per_sm >= 1
        ):
            raise ValueError(f"kernel min_blocks_per_sm: expected a positive int, got {self.min_blocks_per_sm!r}")
        if not isinstance(self.dependent_launch, bool):
            raise ValueError(f"kernel dependent_launch: expected a bool, got {self.dependent_launch!r}")
        carveout = self.shared_carveout
        if carveout is not None and not (isinstance(carveout, int) and 0 <= carveout <= 100):
            raise ValueError(f"kernel shared_carveout: expected a percent, an int in 0..100, got {carveout!r}")

    def mlir_attributes(self) -> dict[str, ir.Attribute]:
        attributes = {}
        if self.threads is not None:
            attributes["nvvm.reqntid"] = ir.DenseI32ArrayAttr.get(list(self.threads))
        if self.max_registers is not None:
            attributes["nvvm.maxnreg"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(32), self.max_registers)
        if self.min_blocks_per_sm is not None:
            attributes["nvvm.minctasm"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(32), self.min_blocks_per_sm)
        if self.cluster is not None:
            attributes["nvvm.cluster_dim"] = ir.DenseI32ArrayAttr.get(list(self.cluster))
        return attributes

    def check_launch(self, name: str, block, cluster) -> None:
        check_launch_shape(name, self.threads, self.cluster, block, cluster)


def check_launch_shape(name: str, required_block, required_cluster, block, cluster) -> None:
    """Refuses a launch whose block (or given cluster) contradicts the 3-tuples a kernel was compiled for (None:
    any), naming the argument."""
    if required_block is not None:
        dims = (block,) if isinstance(block, int) else tuple(block)
        if dims + (1,) * (3 - len(dims)) != tuple(required_block):
            raise ValueError(f"block: kernel '{name}' was compiled for blocks of {tuple(required_block)}, got {block}")
    if required_cluster is not None and cluster is not None:
        dims = (cluster,) if isinstance(cluster, int) else tuple(cluster)
        if dims + (1,) * (3 - len(dims)) != tuple(required_cluster):
            raise ValueError(
                f"cluster: kernel '{name}' was compiled for clusters of {tuple(required_cluster)}, got {cluster}"
            )


def set_kernel_attributes(threads=None, max_registers=None, min_blocks_per_sm=None, cluster=None) -> None:
    """``@kernel(...)``'s attributes decided while tracing, from values the kernel only knows then (e.g. a block size
    computed from a Constexpr configuration): called from the kernel body, it sets them on the kernel being traced.
    Launches are checked against them as against ``@kernel(...)``'s, once compiled (the first launch of a
    specialization compiles it, then refuses a contradicting block or cluster)."""
    checked = KernelAttributes(threads, max_registers, min_blocks_per_sm, cluster)
    try:
        operation = ir.InsertionPoint.current.block.owner.operation
    except (RuntimeError, ValueError):
        raise RuntimeError("set_kernel_attributes: call it from a kernel body while it is traced") from None
    attributes = checked.mlir_attributes()
    while operation.name != "gpu.func":  # up through the enclosing scf.if / scf.for regions
        parent = operation.parent
        if parent is None:
            raise RuntimeError("set_kernel_attributes: call it from a kernel body while it is traced")
        operation = parent.operation
    for name, attribute in attributes.items():
        operation.attributes[name] = attribute
