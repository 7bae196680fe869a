import math

import pytest
import torch

import ppl_attention as pa


def test_additive_matches_formula():
    torch.manual_seed(0)
    m = pa.AdditiveScore(5, 3, hidden=7)
    q, k = torch.randn(2, 4, 5), torch.randn(2, 6, 3)
    out = m(q, k)
    assert out.shape == (2, 4, 6)
    b, t, s = 1, 2, 5
    manual = m.v.weight[0] @ torch.tanh(m.W(q[b, t]) + m.U.weight @ k[b, s])
    assert torch.allclose(out[b, t, s], manual, atol=1e-5)


def test_bilinear_dot_scaled_match_formulas():
    torch.manual_seed(1)
    q, k = torch.randn(3, 4, 8), torch.randn(3, 5, 8)
    bil = pa.BilinearScore(8, 8)
    assert torch.allclose(bil(q, k)[2, 1, 3], q[2, 1] @ bil.W.weight @ k[2, 3], atol=1e-5)
    assert torch.allclose(pa.DotScore()(q, k)[0, 3, 4], q[0, 3] @ k[0, 4], atol=1e-5)
    assert torch.allclose(pa.ScaledDotScore()(q, k), q @ k.transpose(-1, -2) / math.sqrt(8))


def test_multi_head_equals_per_head_scaled_dot():
    torch.manual_seed(2)
    m = pa.MultiHeadScore(6, 4, heads=3, model_dim=12)
    q, k = torch.randn(2, 5, 6), torch.randn(2, 7, 4)
    out = m(q, k)
    assert out.shape == (2, 3, 5, 7)
    h = 1
    qh = (q @ m.Wq.weight.T)[..., h * 4:(h + 1) * 4]
    kh = (k @ m.Wk.weight.T)[..., h * 4:(h + 1) * 4]
    assert torch.allclose(out[:, h], qh @ kh.transpose(-1, -2) / 2.0, atol=1e-5)


def test_bad_shapes_and_names():
    with pytest.raises(ValueError, match="queries"):
        pa.AdditiveScore(5, 3)(torch.randn(2, 4, 4), torch.randn(2, 6, 3))
    with pytest.raises(ValueError, match="equal query and key"):
        pa.DotScore()(torch.randn(4, 3), torch.randn(5, 2))
    with pytest.raises(ValueError, match="unknown score 'cosine'"):
        pa.make_score("cosine", 3, 3)
    assert isinstance(pa.make_score("bilinear", 3, 4), pa.BilinearScore)
