"""Launch plans without a GPU (flydsl.kernels.plans): the call signature tells apart every fact validation and routing
read, arguments that cannot be keyed give no key, the plan store's bound, and calls that fail validation keep no plan.
The GPU side (plans reused, never for another signature, results right) is tests/kernels/test_plans_gpu.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import flydsl.kernels as zoo  # noqa: E402
from flydsl.kernels import plans  # noqa: E402
from flydsl.kernels.gemm import gemm  # noqa: E402
from flydsl.kernels.norms import api as norms_api  # noqa: E402
from flydsl.kernels.softmax import api as softmax_api  # noqa: E402


def test_signature_tells_apart_dtype_shape_strides_alignment_and_type():
    base = torch.zeros(8, 64, dtype=torch.bfloat16)
    variants = {
        "itself": base,
        "dtype": torch.zeros(8, 64, dtype=torch.float16),
        "rows": torch.zeros(9, 64, dtype=torch.bfloat16),
        "n": torch.zeros(8, 32, dtype=torch.bfloat16),
        "row stride": torch.zeros(8, 128, dtype=torch.bfloat16)[:, :64],
        "transposed": torch.zeros(64, 8, dtype=torch.bfloat16).t(),
        "misaligned": torch.zeros(8 * 64 + 1, dtype=torch.bfloat16)[1:].view(8, 64),
        "parameter": torch.nn.Parameter(torch.zeros(8, 64, dtype=torch.bfloat16), requires_grad=False),
    }
    keys = {name: plans.signature(t) for name, t in variants.items()}
    assert len(set(keys.values())) == len(keys), keys
    assert plans.signature(torch.zeros(8, 64, dtype=torch.bfloat16)) == keys["itself"]  # another tensor, same facts
    kind, dtype, shape, strides, low_bits, device = keys["itself"][0]
    assert (kind, dtype, tuple(shape), strides, device) == (torch.Tensor, torch.bfloat16, (8, 64), (64, 1), -1)
    assert low_bits == 0 == base.data_ptr() & 15  # the allocator's blocks are 16-byte aligned
    assert keys["misaligned"][0][4] == 2  # one bf16 element past an aligned start


def test_signature_of_other_arguments():
    assert plans.signature(None, 1e-5, "gelu", [8, 4]) == (
        (type(None), None),
        (float, 1e-5),
        (str, "gelu"),
        (list, (8, 4)),
    )
    # equal values of other types are other calls (eps=1 validates as 1.0; eps=True is refused)
    assert len({plans.signature(1), plans.signature(1.0), plans.signature(True)}) == 3
    assert plans.signature(object()) is None  # not keyed: such a call validates every time
    assert plans.signature([8, torch.zeros(1)]) is None
    assert plans.signature(torch.zeros(2), object()) is None


def test_a_store_keeps_its_limit_and_ignores_calls_without_a_key():
    store = plans.Plans("test", limit=2)
    assert store.add(None, "plan") == "plan" and len(store) == 0 and store.get(None) is None
    for i in range(3):
        store.add((i,), f"plan {i}")
    assert len(store) == 2 and store.get((0,)) is None and store.get((2,)) == "plan 2"  # the oldest went first
    plans.clear_all()
    assert len(store) == 0


@pytest.mark.parametrize(
    "call, store",
    [
        (lambda x: zoo.softmax(x), softmax_api._SOFTMAX),
        (lambda x: zoo.layer_norm(x, None, None), norms_api._LAYER_NORM),
        (lambda x: zoo.rms_norm(x, None), norms_api._RMS_NORM),
        (lambda x: zoo.fused_add_rms_norm(x, x, None), norms_api._FUSED_ADD_RMS_NORM),
        (lambda x: gemm(x, x.t()), None),
    ],
    ids=["softmax", "layer_norm", "rms_norm", "fused_add_rms_norm", "gemm"],
)
def test_a_call_that_fails_validation_keeps_no_plan_and_fails_again(call, store):
    x = torch.zeros(4, 8, dtype=torch.bfloat16)  # on the CPU: refused, naming the argument
    for _ in range(2):
        with pytest.raises(ValueError, match="expected a CUDA tensor"):
            call(x)
    stores = [store] if store is not None else [p for p in plans._ALL if p.name.startswith("flydsl.kernels.")]
    assert all(len(s) == 0 for s in stores)
