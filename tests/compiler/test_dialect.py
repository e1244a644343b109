"""The Fly dialect from Python: registration, parsing/printing, verifier errors, and its lowering checked
against flydsl.layout (the one layout algebra) by constant-folding the lowered IR."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlir import ir
from mlir.passmanager import PassManager

import flydsl.compiler as flyc
from flydsl.compiler._native import dialect_extension
from flydsl.compiler.dialects import fly
from flydsl.layout import Layout

native = dialect_extension()


def test_layout_type_parses_and_prints_in_cute_notation():
    with flyc.make_context():
        for text in ["8:1", "(4,8):(1,4)", "((2,4),8):((1,16),2)", "(?,8):(8,1)", "(2,2):(4294967296,-1)"]:
            type_ = ir.Type.parse(f"!fly.layout<{text}>")
            assert str(type_) == f"!fly.layout<{text}>"
            assert native.is_layout_type(type_)


def test_layout_static_size_from_the_c_api():
    with flyc.make_context():
        assert native.layout_static_size(ir.Type.parse("!fly.layout<((2,4),8):((1,16),2)>")) == 64
        assert native.layout_static_size(ir.Type.parse("!fly.layout<(?,8):(8,1)>")) is None
        with pytest.raises(TypeError, match="expected a !fly.layout"):
            native.layout_static_size(ir.IndexType.get())


def test_dialect_is_registered_only_through_register_dialect():
    context = ir.Context()
    context.allow_unregistered_dialects = False
    with context, pytest.raises(ir.MLIRError):
        ir.Type.parse("!fly.layout<4:1>")
    dialect_extension().register_dialect(context)
    with context:
        assert str(ir.Type.parse("!fly.layout<4:1>")) == "!fly.layout<4:1>"


@pytest.mark.parametrize(
    "text, message",
    [
        ("(4,8):(1,(4,2))", "must be congruent"),
        ("(4,0):(1,4)", "has extent 0 at leaf 1"),
    ],
)
def test_invalid_layout_types_are_rejected_with_a_message(text, message):
    with flyc.make_context(), pytest.raises(ir.MLIRError, match=message):
        ir.Type.parse(f"!fly.layout<{text}>")


def test_generated_op_builders_build_fly_ops():
    with flyc.make_context(), ir.Location.unknown():
        module = ir.Module.create()
        layout_type = ir.Type.parse("!fly.layout<(4,8):(8,1)>")
        with ir.InsertionPoint(module.body):
            layout = fly.MakeLayoutOp(layout_type, []).result
            size = fly.SizeOp(layout).result
            assert isinstance(size.type, ir.IndexType)
        assert module.operation.verify()
        assert "fly.size" in str(module)


def _leaves(tuple_):
    return [tuple_] if isinstance(tuple_, int) else [leaf for mode in tuple_ for leaf in _leaves(mode)]


def _cute(tuple_, dynamic=frozenset(), counter=None) -> str:
    """CuTe notation; leaves whose flattened position is in ``dynamic`` print as ``?``."""
    counter = counter if counter is not None else [0]
    if isinstance(tuple_, int):
        position = counter[0]
        counter[0] += 1
        return "?" if position in dynamic else str(tuple_)
    return "(" + ",".join(_cute(m, dynamic, counter) for m in tuple_) + ")"


# Nested shapes with small extents (size-1 modes included) and strides that may be 0, negative or huge.
_extent = st.integers(1, 5)
_shape = st.recursive(_extent, lambda inner: st.lists(inner, min_size=1, max_size=3).map(tuple), max_leaves=5)
_stride_leaf = st.one_of(st.integers(-8, 64), st.sampled_from([0, 1, 2**31, 2**40]))


def _stride_like(shape):
    if isinstance(shape, int):
        return _stride_leaf
    return st.tuples(*[_stride_like(mode) for mode in shape])


@st.composite
def _layout_and_index(draw):
    shape = draw(_shape)
    stride = draw(_stride_like(shape))
    size = 1
    for extent in _leaves(shape):
        size *= extent
    count = len(_leaves(shape))
    # Some leaves dynamic: their values reach the lowering as fly.make_layout operands.
    dynamic_shape = frozenset(draw(st.sets(st.integers(0, count - 1))))
    dynamic_stride = frozenset(draw(st.sets(st.integers(0, count - 1))))
    return shape, stride, draw(st.integers(0, size - 1)), dynamic_shape, dynamic_stride


def _fold_crd2idx(shape, stride, index: int, dynamic_shape=frozenset(), dynamic_stride=frozenset()) -> int:
    text = _cute(shape, dynamic_shape) + ":" + _cute(stride, dynamic_stride)
    operands = [v for k, v in enumerate(_leaves(shape)) if k in dynamic_shape]
    operands += [v for k, v in enumerate(_leaves(stride)) if k in dynamic_stride]
    constants = "\n".join(f"%d{k} = arith.constant {v} : index" for k, v in enumerate(operands))
    names = ", ".join(f"%d{k}" for k in range(len(operands)))
    source = f"""
    func.func @f() -> index {{
      %i = arith.constant {index} : index
      {constants}
      %l = fly.make_layout{f"({names})" if operands else ""} : !fly.layout<{text}>
      %o = fly.crd2idx(%i), %l : !fly.layout<{text}>
      return %o : index
    }}"""
    with flyc.make_context():
        module = ir.Module.parse(source)
        PassManager.parse("builtin.module(fly-lower-layouts,canonicalize)").run(module.operation)
        func_op = module.body.operations[0]
        returned = func_op.regions[0].blocks[0].operations[-1].operands[0]
        return ir.IntegerAttr(returned.owner.attributes["value"]).value


@settings(max_examples=100, deadline=None)
@given(_layout_and_index())
def test_lowered_crd2idx_matches_flydsl_layout_with_static_and_dynamic_leaves(case):
    shape, stride, index, dynamic_shape, dynamic_stride = case
    expected = Layout(shape, stride)(index)
    # The IR computes in 64-bit two's complement index arithmetic.
    wrapped = (expected + 2**63) % 2**64 - 2**63
    assert _fold_crd2idx(shape, stride, index, dynamic_shape, dynamic_stride) == wrapped
