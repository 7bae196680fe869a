"""Checks every selection family (``family.selects``: attention over segments, over spans) must
pass, on either backend; the families are built by ``make(backend, sampled: bool)``. Each check
compares numbers: the marginal family against the sampled family's expectation, Pyro against
NumPyro, padded against unpadded rows."""

import jax
import numpy as np
from on_backends import BACKENDS, arr, conv


def _mask(lengths, S):
    return np.arange(S)[None, :] < np.asarray(lengths)[:, None]


def _draw(backend, d, k):
    return d.sample((k,)) if backend == "pyro" else d.sample(jax.random.PRNGKey(0), (k,))


def check_marginal_context(backend, make, seed=0):
    """The marginal family's weights are the sampled family's weights of the exact marginals,
    and its context the expected context (the context is linear in the selection)."""
    rng = np.random.default_rng(seed)
    S, dv = 5, 3
    e = rng.normal(size=(2, 3, S))
    values = rng.normal(size=(2, S, dv))
    mask = conv(backend, _mask([5, 3], S)[:, None, :].repeat(3, 1))
    scores = conv(backend, e)
    sampled, marg = make(backend, True), make(backend, False)
    d = sampled.selection(scores, mask)
    mu = arr(marg.deterministic_weights(scores, mask))
    np.testing.assert_allclose(arr(sampled.weights(d.marginals, scores, mask)), mu, atol=1e-12)
    np.testing.assert_allclose(arr(sampled.context(d.marginals, conv(backend, values))),
                               mu @ values, atol=1e-12)


def check_pyro_equals_numpyro(make, seed=3):
    """Pyro = NumPyro on the same scores (float32): the marginal weights, the MAP selection's
    weights, each part's probability, log p of q's MAP selection, KL(q ‖ p)."""
    rng = np.random.default_rng(seed)
    S = 6
    e = rng.normal(size=(2, 4, S)).astype(np.float32)
    q = rng.normal(size=(2, 4, S)).astype(np.float32)
    m = _mask([6, 4], S)[:, None, :].repeat(4, 1)
    out = {}
    for backend in BACKENDS:
        fam, marg = make(backend, True), make(backend, False)
        scores, qs = conv(backend, e), conv(backend, q)
        mask = conv(backend, m)
        p_sel, q_sel = fam.prior(scores, mask, None, None), fam.posterior(qs, mask, None)
        event = q_sel.argmax()
        out[backend] = dict(w=arr(marg.deterministic_weights(scores, mask)),
                            best=arr(fam.map_weights(scores, mask)),
                            parts=arr(fam.part_marginals(scores, mask)),
                            logp=arr(p_sel.log_prob(event)),
                            kl=arr(q_sel.kl_divergence(p_sel)))
    for key in out["pyro"]:
        np.testing.assert_allclose(out["pyro"][key], out["numpyro"][key], rtol=1e-5, atol=1e-5,
                                   err_msg=key)


def check_padding(backend, make, seed=4):
    """A padded position gets weight exactly 0 in the marginals, in draws and in the MAP; padding
    a row further changes nothing of its real positions."""
    rng = np.random.default_rng(seed)
    e = rng.normal(size=(2, 3, 4))
    wider = np.concatenate([e, rng.normal(size=(2, 3, 3)) * 5], -1)
    m4 = _mask([4, 2], 4)[:, None, :].repeat(3, 1)
    m7 = _mask([4, 2], 7)[:, None, :].repeat(3, 1)
    marg, sampled = make(backend, False), make(backend, True)
    w4 = arr(marg.deterministic_weights(conv(backend, e), conv(backend, m4)))
    w7 = arr(marg.deterministic_weights(conv(backend, wider), conv(backend, m7)))
    assert (w7[~m7] == 0).all() and (w4[~m4] == 0).all()
    np.testing.assert_allclose(w7[..., :4], w4, atol=1e-12)
    z = _draw(backend, sampled.selection(conv(backend, wider), conv(backend, m7)), 50)
    drawn = arr(sampled.weights(z, conv(backend, wider), None))
    assert (drawn[:, ~m7] == 0).all()
    best = arr(sampled.map_weights(conv(backend, wider), conv(backend, m7)))
    assert (best[~m7] == 0).all()
