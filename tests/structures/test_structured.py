"""SegmentCRF (structured segmentation attention, Kim et al. 2017): log-partition and marginals
against brute force over all 2^S selections in both backends, ∂ log Z / ∂ e = marginals, and
the segment-crf method inside Seq2SeqAlignment (both backends, same weights)."""

import itertools
import math

import numpy as np
import pytest
import torch

from ppl_attention.pyro.families import SegmentCRF
from ppl_attention.pyro.inference import evaluate, get_method
from ppl_attention.pyro.models import Seq2SeqAlignment

MASKS = [[1] * 8, [1, 1, 1, 1, 1, 0, 0, 0], [1], [0, 1, 1, 0, 1, 1, 0, 1]]


def _brute(e, mask, A):
    """log Z and p(s_j = 1) by enumerating every selection of the unmasked positions."""
    idx = [j for j, m in enumerate(mask) if m]
    scored = []
    for sel in itertools.product([0, 1], repeat=len(idx)):
        s = sum(e[j] * b for j, b in zip(idx, sel)) + sum(A[a, c] for a, c in zip(sel, sel[1:]))
        scored.append((sel, s))
    top = max(s for _, s in scored)
    log_z = top + math.log(sum(math.exp(s - top) for _, s in scored))
    marg = np.zeros(len(mask))
    for sel, s in scored:
        for j, b in zip(idx, sel):
            marg[j] += b * math.exp(s - log_z)
    return log_z, marg


def _case(seed=0):
    rng = np.random.default_rng(seed)
    e = rng.normal(size=(len(MASKS), 8)) * 2
    A = rng.normal(size=(2, 2))
    mask = np.array([m + [0] * (8 - len(m)) for m in MASKS], bool)
    return e, A, mask


@pytest.mark.parametrize("seed", [0, 1])
def test_torch_crf_equals_brute_force_and_grad_log_z_is_the_marginals(seed):
    e, A, mask = _case(seed)
    crf = SegmentCRF().double()
    with torch.no_grad():
        crf.transitions.copy_(torch.tensor(A))
    et = torch.tensor(e, requires_grad=True)
    mt = torch.tensor(mask)
    log_z, marg = crf.log_partition(et, mt), crf.marginals(et, mt)
    lz = log_z.detach()
    for b in range(len(MASKS)):
        bz, bm = _brute(e[b], mask[b], A)
        assert float(lz[b]) == pytest.approx(bz, abs=1e-9)
        assert np.allclose(marg[b].detach().numpy(), bm, atol=1e-9)
    (grad,) = torch.autograd.grad(log_z.sum(), et)
    assert torch.allclose(grad, marg, atol=1e-12)
    assert torch.all(marg[~mt] == 0)


@pytest.mark.parametrize("seed", [0, 1])
def test_numpyro_crf_equals_brute_force_and_grad_log_z_is_the_marginals(seed):
    import jax
    import jax.numpy as jnp

    from ppl_attention.numpyro.families import SegmentCRF as JaxCRF

    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        e, A, mask = _case(seed)
        crf = JaxCRF()
        p = {"transitions": jnp.asarray(A)}
        log_z = crf.log_partition(jnp.asarray(e), jnp.asarray(mask), p)
        marg = np.asarray(crf.marginals(jnp.asarray(e), jnp.asarray(mask), p))
        for b in range(len(MASKS)):
            bz, bm = _brute(e[b], mask[b], A)
            assert float(log_z[b]) == pytest.approx(bz, abs=1e-9)
            assert np.allclose(marg[b], bm, atol=1e-9)
        grad = jax.grad(lambda x: crf.log_partition(x, jnp.asarray(mask), p).sum())(
            jnp.asarray(e))
        assert np.allclose(np.asarray(grad), marg, atol=1e-12)
    finally:  # as it was: the structure modules of this worker run in float64
        jax.config.update("jax_enable_x64", before)


def test_segment_crf_method_in_both_backends():
    """The method trains the CRF transitions, its exact NLL is the soft-style likelihood with
    marginal weights, and the NumPyro twin gives the same numbers on the same weights."""
    import jax

    from ppl_attention.data import Vocab, make_batches, make_task
    from ppl_attention.numpyro.jax_batches import to_jax
    from ppl_attention.numpyro.models import Seq2SeqAlignment as JaxModel
    from ppl_attention.pyro.inference.fit import fit

    task = make_task("reorder", n_train=64, n_eval=8, seed=0)
    sv = Vocab.build(s for s, _ in task.train.pairs)
    tv = Vocab.build(t for _, t in task.train.pairs)
    torch.manual_seed(0)
    m = get_method("segment-crf")
    model = Seq2SeqAlignment(len(sv), len(tv), hidden=16, family=m.family(16))
    batches = make_batches(task.train.pairs, sv, tv, 16, shuffle=True)
    run = fit(model, batches, "segment-crf", 8, src_vocab=sv, tgt_vocab=tv, progress=False)
    assert float(model.family.transitions.abs().sum()) > 0  # the pairwise potentials learn
    (b,) = make_batches(task.valid.pairs, sv, tv, 8)
    with torch.no_grad():
        ll = model.soft_token_log_likelihood(b).sum(-1).numpy()
    report = evaluate(run, [b])
    assert report["exact"] and report["nll_per_token"] == pytest.approx(
        -ll.sum() / b.n_tokens, rel=1e-5)
    jm, p = JaxModel.from_torch(model)
    llj = np.asarray(jax.jit(jm.soft_token_log_likelihood_of)(p, to_jax(b, 11, 4)).sum(-1))
    assert np.allclose(llj[: b.size], ll, rtol=1e-5) and np.all(llj[b.size:] == 0)
    jr = evaluate(run, [b], backend="numpyro")
    assert jr["nll_per_token"] == pytest.approx(report["nll_per_token"], rel=1e-5)
