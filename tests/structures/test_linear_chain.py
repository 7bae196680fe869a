"""LinearChainCRF on both backends, from the one recursion of ppl_attention/structures: every
operation against brute-force enumeration of every label sequence (float64, ragged lengths in
one batch), exact draws by a chi-square test, the backends against each other in float32, and
bad input refused in one line.

Planted faults (``python tests/plant_faults.py s1 s2 s3 s4``), each caught: s1 — the torch
sampling semiring's Gumbel noise halved, s2 — the JAX one drawing from softmax(2x): both caught
by ``test_exact_draws_pass_chi_square``; s3 — the recursion ignoring the lengths: caught by
``test_every_operation_equals_brute_force`` (ragged rows); s4 — an event leaving position 0
from a label other than the initial state accepted: caught by
``test_bad_input_is_refused_in_one_line``. ``top_k`` (the k-best semiring) is checked with every
operation, on every structure: s5 — the JAX k-best ⊗ taken elementwise, caught by
``test_tree_crf.py::test_every_operation_equals_brute_force`` (3 failed); s6 — the torch k-best
⊕ keeping only the first term's k, caught here (4 failed); s9 — the path for full rows (no
``lengths``: no per-position selection) stopping one position short, caught here (3 failed).
"""

import jax
import jax.numpy as jnp
import numpy as np
import on_backends
import pytest
import torch
from brute_force import chain_structures, chi_square_pvalue, summary
from on_backends import (
    BACKENDS,
    DRAWS,
    arr,
    assert_row_equals_brute_force,
    counts_of,
    draws,
    every_operation,
)

from ppl_attention.core.errors import UserError
from ppl_attention.numpyro.crfs import LinearChainCRF as JaxChain
from ppl_attention.pyro.crfs import LinearChainCRF as TorchChain
from ppl_attention.structures.linear_chain import event_to_labels, labels_to_event

jax.config.update("jax_enable_x64", True)


def make(backend, theta, lengths=None, dtype=np.float64):
    return on_backends.make(backend, "LinearChainCRF", theta, lengths, dtype)




def potentials(rng, batch, n, t):
    return rng.normal(size=(batch, n, t, t)) * 1.5


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n, t", [(1, 3), (3, 2), (4, 3), (5, 2)])
def test_every_operation_equals_brute_force(backend, n, t):
    rng = np.random.default_rng(n * 10 + t)
    theta, other = potentials(rng, 3, n, t), potentials(rng, 3, n, t)
    lengths = np.array([n, max(1, n - 1), max(1, n - 2)])  # ragged in one batch
    d, q = make(backend, theta, lengths), make(backend, other, lengths)
    got = every_operation(d, q)
    for b, L in enumerate(lengths):
        events = np.array([e for e, _ in chain_structures(n, t, L)])
        ref = summary(events, theta[b], other[b])
        assert_row_equals_brute_force(got, b, ref)
        np.testing.assert_allclose(arr(d.max_score())[b], ref["best_score"], rtol=1e-10)
        assert np.all(got["marginals"][b, L:] == 0)  # nothing past the length
        # log_prob of every structure, that row's potentials broadcast over the events
        row = make(backend, theta[b:b + 1], lengths[b:b + 1])
        ev = events[:, None]
        ev = torch.tensor(ev) if backend == "pyro" else jnp.asarray(ev)
        np.testing.assert_allclose(arr(row.log_prob(ev))[:, 0], ref["log_p"], atol=1e-10)


@pytest.mark.parametrize("backend", BACKENDS)
def test_kl_is_registered_and_enumerate_support_lists_every_structure(backend):
    rng = np.random.default_rng(0)
    theta, other = potentials(rng, 2, 3, 2), potentials(rng, 2, 3, 2)
    d, q = make(backend, theta), make(backend, other)
    if backend == "pyro":
        kl = torch.distributions.kl_divergence(d, q)
    else:
        from numpyro.distributions import kl_divergence

        kl = kl_divergence(d, q)
    np.testing.assert_allclose(arr(kl), arr(d.kl_divergence(q)))
    support = arr(d.enumerate_support())
    assert support.shape == (8, 2, 3, 2, 2)
    total = np.logaddexp.reduce(arr(d.log_prob(d.enumerate_support())), axis=0)
    np.testing.assert_allclose(total, 0.0, atol=1e-10)



@pytest.mark.parametrize("k", DRAWS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_exact_draws_pass_chi_square(backend, k):
    n, t = 3, 3
    theta = potentials(np.random.default_rng(3), 2, n, t)
    lengths = np.array([3, 2])
    d = make(backend, theta, lengths)
    drawn = draws(backend, d, k)  # [k, 2, n, t, t]
    assert drawn.shape == (k, 2, n, t, t)
    for b, L in enumerate(lengths):
        events = [e for e, _ in chain_structures(n, t, L)]
        ref = summary(np.array(events), theta[b])
        counts = counts_of(drawn[:, b], [tuple(event_to_labels(e)) for e in events],
                           lambda e: tuple(event_to_labels(e)))
        assert chi_square_pvalue(counts, ref["probs"]) > 1e-3


def test_the_backends_agree_in_float32():
    rng = np.random.default_rng(7)
    theta = potentials(rng, 4, 16, 5).astype(np.float32)
    lengths = np.array([16, 9, 1, 12])
    p, j = make("pyro", theta, lengths, np.float32), make("numpyro", theta, lengths, np.float32)
    np.testing.assert_allclose(arr(p.log_partition), arr(j.log_partition), rtol=1e-5)
    np.testing.assert_allclose(arr(p.marginals), arr(j.marginals), atol=1e-5)
    np.testing.assert_allclose(arr(p.entropy()), arr(j.entropy()), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(arr(p.argmax()), arr(j.argmax()))


def test_marginals_are_differentiable_and_a_site_in_both_ppls():
    import numpyro
    import pyro
    from numpyro import handlers as nh

    theta = torch.randn(2, 4, 3, 3, dtype=torch.float64, requires_grad=True)
    loss = (TorchChain(theta).marginals ** 2).sum()
    loss.backward()  # structured attention trains through its marginals
    assert torch.isfinite(theta.grad).all() and theta.grad.abs().sum() > 0

    def model():
        return pyro.sample("y", TorchChain(theta.detach()))

    tr = pyro.poutine.trace(model).get_trace()
    assert tr.nodes["y"]["value"].shape == (2, 4, 3, 3)
    tr.compute_log_prob()
    assert torch.all(tr.nodes["y"]["log_prob"] < 0)

    def jmodel():
        return numpyro.sample("y", JaxChain(jnp.asarray(theta.detach().numpy())))

    jtr = nh.trace(nh.seed(jmodel, 0)).get_trace()
    assert jtr["y"]["value"].shape == (2, 4, 3, 3)
    assert np.all(np.asarray(jtr["y"]["fn"].log_prob(jtr["y"]["value"])) < 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_input_is_refused_in_one_line(backend):
    good = np.zeros((2, 3, 2, 2))
    with pytest.raises(UserError, match=r"must be \[\.\.\., n, t, t\]"):
        make(backend, np.zeros((2, 3, 2, 3)))
    with pytest.raises(UserError, match=r"lengths must lie in 1 … 3, got 0 … 3"):
        make(backend, good, np.array([0, 3]))
    with pytest.raises(UserError, match=r"lengths must lie in 1 … 3, got 2 … 4"):
        make(backend, good, np.array([4, 2]))
    bad = good.copy()
    bad[0, 1, 0, 1] = np.nan
    with pytest.raises(UserError, match="NaN"):
        make(backend, bad)
    bad[0, 1, 0, 1] = np.inf
    with pytest.raises(UserError, match=r"\+inf"):
        make(backend, bad)
    bad[0, 1, 0, 1] = -np.inf  # a forbidden transition: allowed
    assert np.isfinite(arr(make(backend, bad).log_partition)).all()
    d = make(backend, good, np.array([3, 2]))
    ev = np.array([labels_to_event([0, 1, 1], 3, 2), labels_to_event([1, 0, 1], 3, 2)])
    conv = torch.tensor if backend == "pyro" else jnp.asarray
    with pytest.raises(UserError, match="past a row's length"):
        d.log_prob(conv(ev))  # the second row has length 2
    ev[1] = labels_to_event([1, 0], 3, 2)
    assert np.isfinite(arr(d.log_prob(conv(ev)))).all()
    broken = ev.copy()
    broken[0, 1] = 0
    broken[0, 1, 1, 0] = 1  # position 1 leaves from 1, but position 0 ended in 0
    with pytest.raises(UserError, match="must start from the label"):
        d.log_prob(conv(broken))
    with pytest.raises(UserError, match="0 or 1"):
        d.log_prob(conv(ev * 0.5))
    start = ev.copy()
    start[0, 0] = 0
    start[0, 0, 1, 0] = 1  # position 0 leaving from label 1: not the initial state
    with pytest.raises(UserError, match="only row a = 0"):
        d.log_prob(conv(start))


def test_labels_and_events_convert_both_ways():
    for labels in ([2, 0, 1], [1], [0, 0]):
        assert event_to_labels(labels_to_event(labels, 4, 3)) == labels
