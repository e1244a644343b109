"""flydsl.torch.nn.LayerNorm / RMSNorm as drop-in replacements: constructors, parameters and state_dicts as torch's,
checkpoints loading both ways, and torch's own forward on CPU tensors."""

from __future__ import annotations

import io

import pytest

torch = pytest.importorskip("torch")

from flydsl.torch import nn as fnn  # noqa: E402

CASES = [
    (fnn.LayerNorm, torch.nn.LayerNorm, dict(normalized_shape=16)),
    (fnn.LayerNorm, torch.nn.LayerNorm, dict(normalized_shape=(4, 8), eps=1e-3, bias=False)),
    (fnn.LayerNorm, torch.nn.LayerNorm, dict(normalized_shape=[16], elementwise_affine=False)),
    (fnn.RMSNorm, torch.nn.RMSNorm, dict(normalized_shape=16)),
    (fnn.RMSNorm, torch.nn.RMSNorm, dict(normalized_shape=(4, 8), eps=1e-6)),
    (fnn.RMSNorm, torch.nn.RMSNorm, dict(normalized_shape=16, elementwise_affine=False)),
]


def _shape(kwargs) -> tuple:
    ns = kwargs["normalized_shape"]
    return (ns,) if isinstance(ns, int) else tuple(ns)


@pytest.mark.parametrize("ours, theirs, kwargs", CASES)
def test_same_constructor_and_state_dict(ours, theirs, kwargs):
    mine, ref = ours(**kwargs), theirs(**kwargs)
    assert isinstance(mine, theirs)
    assert mine.normalized_shape == ref.normalized_shape and mine.eps == ref.eps
    assert repr(mine).split("(", 1)[1] == repr(ref).split("(", 1)[1]
    mine_sd, ref_sd = mine.state_dict(), ref.state_dict()
    assert list(mine_sd) == list(ref_sd)
    for key in ref_sd:
        assert mine_sd[key].shape == ref_sd[key].shape and mine_sd[key].dtype == ref_sd[key].dtype


@pytest.mark.parametrize("ours, theirs, kwargs", CASES)
def test_checkpoints_load_both_ways(ours, theirs, kwargs):
    ref = theirs(**kwargs)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn_like(p))
    buffer = io.BytesIO()
    torch.save(ref.state_dict(), buffer)
    buffer.seek(0)
    mine = ours(**kwargs)
    mine.load_state_dict(torch.load(buffer), strict=True)
    for key, value in ref.state_dict().items():
        assert torch.equal(mine.state_dict()[key], value)
    back = theirs(**kwargs)
    back.load_state_dict(mine.state_dict(), strict=True)


@pytest.mark.parametrize("ours, theirs, kwargs", CASES)
def test_cpu_tensors_take_torchs_forward(ours, theirs, kwargs):
    torch.manual_seed(0)
    ref = theirs(**kwargs)
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn_like(p))
    mine = ours(**kwargs)
    mine.load_state_dict(ref.state_dict())
    x = torch.randn(3, *_shape(kwargs), requires_grad=True)
    torch.testing.assert_close(mine(x), ref(x), rtol=0, atol=0)
    mine(x).square().sum().backward()  # gradients flow through torch's implementation
    assert x.grad.shape == x.shape


def test_rms_norm_with_residual_on_cpu():
    torch.manual_seed(0)
    m = fnn.RMSNorm(16)
    x, r = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    out, residual_out = m(x, r)
    torch.testing.assert_close(residual_out, x + r, rtol=0, atol=0)
    torch.testing.assert_close(out, torch.nn.functional.rms_norm(x + r, (16,), m.weight), rtol=0, atol=0)


def test_float64_falls_back_to_torch():
    m = fnn.LayerNorm(8, dtype=torch.float64)
    x = torch.randn(2, 8, dtype=torch.float64)
    torch.testing.assert_close(m(x), torch.nn.functional.layer_norm(x, (8,), m.weight, m.bias))
