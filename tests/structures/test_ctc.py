"""CTC on both backends, from the one recursion of ppl_attention/structures: log Z equal to
−ctc_loss of torch and optax on every row (padded rows, repeated labels), every operation
against brute-force enumeration of every frame labelling (float64), exact draws by a
chi-square test, and bad input refused in one line."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from brute_force import chi_square_pvalue, ctc_structures, summary
from on_backends import (
    BACKENDS,
    DRAWS,
    arr,
    assert_row_equals_brute_force,
    counts_of,
    every_operation,
)

from ppl_attention.core.errors import UserError
from ppl_attention.numpyro.crfs import CTC as JaxCTC
from ppl_attention.pyro.crfs import CTC as TorchCTC
from ppl_attention.structures.ctc import event_to_frame_labels

jax.config.update("jax_enable_x64", True)



def make(backend, x, labels, ll=None, il=None, blank=0):
    if backend == "pyro":
        t = (lambda a: None if a is None else torch.tensor(a))  # noqa: E731
        return TorchCTC(torch.tensor(x), torch.tensor(labels), t(ll), t(il), blank)
    return JaxCTC(jnp.asarray(x), jnp.asarray(labels), ll, il, blank)



def registered_kl(backend):
    if backend == "pyro":
        return torch.distributions.kl_divergence
    from numpyro.distributions.kl import kl_divergence
    return kl_divergence


@pytest.mark.parametrize("backend", BACKENDS)
def test_kl_between_ctcs_of_other_labels_is_refused(backend):
    x = np.random.default_rng(3).normal(size=(1, 5, 3))
    d = make(backend, x, np.array([[1, 2]]))
    with pytest.raises(UserError, match="the same labels"):
        registered_kl(backend)(d, make(backend, x, np.array([[2, 1]])))
    with pytest.raises(UserError, match="the same labels"):
        registered_kl(backend)(d, make(backend, x, np.array([[1, 2]]), il=np.array([4])))


def test_log_partition_is_minus_ctc_loss_of_torch_and_optax_on_every_row():
    rng = np.random.default_rng(0)
    B, T, V, L = 6, 30, 6, 8
    x = rng.normal(size=(B, T, V)) * 2
    labels = rng.integers(1, V, size=(B, L))
    labels[1, :4] = 3  # repeated labels
    labels[2] = [2, 2, 2, 2, 5, 5, 1, 1]
    ll = np.array([8, 4, 8, 1, 0, 5])
    il = np.array([30, 12, 30, 1, 7, 20])
    torch_loss = torch.nn.functional.ctc_loss(
        torch.tensor(x).log_softmax(-1).transpose(0, 1), torch.tensor(labels),
        torch.tensor(il), torch.tensor(ll), reduction="none").numpy()
    optax_loss = np.asarray(optax.ctc_loss(
        jnp.asarray(x), jnp.asarray((np.arange(T) >= il[:, None]).astype(float)),
        jnp.asarray(labels), jnp.asarray((np.arange(L) >= ll[:, None]).astype(float))))
    np.testing.assert_allclose(torch_loss, optax_loss, rtol=1e-8)
    for backend in BACKENDS:
        d = make(backend, x, labels, ll, il)
        np.testing.assert_allclose(arr(d.log_partition), -torch_loss, rtol=1e-9)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_operation_equals_brute_force(backend):
    rng = np.random.default_rng(1)
    T, V = 5, 3
    x, y = rng.normal(size=(3, T, V)) * 1.5, rng.normal(size=(3, T, V)) * 1.5
    labels = np.array([[1, 2], [2, 2], [1, 0]])
    ll, il = np.array([2, 2, 1]), np.array([5, 4, 3])
    d, q = make(backend, x, labels, ll, il), make(backend, y, labels, ll, il)
    got = every_operation(d, q)
    registered = arr(registered_kl(backend)(d, q))  # the backend's kl_divergence dispatch
    for b in range(3):
        lp = x[b] - np.logaddexp.reduce(x[b], -1, keepdims=True)
        lq = y[b] - np.logaddexp.reduce(y[b], -1, keepdims=True)
        found = list(ctc_structures(lp, labels[b, :ll[b]], il[b]))
        events = np.zeros((len(found), 2 * labels.shape[1] + 1, T))  # the padded event shape
        for j, (e, _) in enumerate(found):
            events[j, :e.shape[0]] = e
        theta = np.zeros(events.shape[1:])  # each (state, frame) part: log p of its label
        other = np.zeros(events.shape[1:])
        ext = np.zeros(events.shape[1], int)
        ext[1::2] = labels[b]
        for s in range(len(ext)):
            theta[s], other[s] = lp[:, ext[s]], lq[:, ext[s]]
        ref = summary(events, theta, other)
        assert_row_equals_brute_force(got, b, ref)
        np.testing.assert_allclose(registered[b], ref["kl"], atol=1e-10)
        conv = torch.tensor if backend == "pyro" else jnp.asarray
        row = make(backend, x[b:b + 1], labels[b:b + 1], ll[b:b + 1], il[b:b + 1])
        np.testing.assert_allclose(arr(row.log_prob(conv(events[:, None])))[:, 0],
                                   ref["log_p"], atol=1e-10)


@pytest.mark.parametrize("k", DRAWS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_exact_draws_pass_chi_square(backend, k):
    rng = np.random.default_rng(2)
    T, V = 5, 3
    x = rng.normal(size=(1, T, V))
    labels, ll, il = np.array([[1, 1]]), np.array([2]), np.array([5])
    d = make(backend, x, labels, ll, il)
    if backend == "pyro":
        torch.manual_seed(0)
        draws = arr(d.sample((k,)))[:, 0]
    else:
        draws = arr(d.sample(jax.random.PRNGKey(0), (k,)))[:, 0]
    lp = x[0] - np.logaddexp.reduce(x[0], -1, keepdims=True)
    found = list(ctc_structures(lp, [1, 1], 5))
    probs = np.exp([sum(lp[t, c] for t, c in enumerate(pi)) for _, pi in found])
    probs /= probs.sum()
    counts = counts_of(draws, [pi for _, pi in found],
                       lambda e: tuple(event_to_frame_labels(e, d.extended[0])))
    assert chi_square_pvalue(counts, probs) > 1e-3


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_input_is_refused_in_one_line(backend):
    x = np.zeros((2, 4, 3))
    cases = [
        (dict(labels=[[1, 0], [1, 2]]), "equals the blank"),
        (dict(labels=[[1, 3], [1, 2]]), r"vocabulary indices in 0 … 2"),
        (dict(labels=[[1, 2], [1, 2]], ll=[3, 1]), r"label_lengths must lie in 0 … 2"),
        (dict(labels=[[1, 2], [1, 2]], il=[0, 4]), r"input_lengths must lie in 1 … 4"),
        (dict(labels=[[1, 1], [1, 2]], il=[2, 4]), "has 2 frames but its labels need at least 3"),
        (dict(labels=[[1, 2]]), r"labels must be \[\.\.\., L\]"),
        (dict(labels=[[1, 2], [1, 2]], blank=3), "blank_id must be"),
    ]
    for kw, why in cases:
        with pytest.raises(UserError, match=why):
            make(backend, x, kw["labels"], kw.get("ll"), kw.get("il"), kw.get("blank", 0))
    bad = x.copy()
    bad[0, 0, 0] = np.nan
    with pytest.raises(UserError, match="NaN"):
        make(backend, bad, [[1, 2], [1, 2]])
    d = make(backend, x, [[1, 2], [1, 2]], [2, 1], [4, 3])
    conv = torch.tensor if backend == "pyro" else jnp.asarray
    ok = np.zeros((2, 5, 4))
    ok[0, [0, 1, 3, 4], [0, 1, 2, 3]] = 1  # blank, 1, 2, blank
    ok[1, [1, 2, 2], [0, 1, 2]] = 1  # 1, blank, blank
    assert np.isfinite(arr(d.log_prob(conv(ok)))).all()
    skip_blank = ok.copy()
    skip_blank[1] = 0
    skip_blank[1, [0, 0, 0], [0, 1, 2]] = 1  # never emits its label
    with pytest.raises(UserError, match="ends at one of the last two states"):
        d.log_prob(conv(skip_blank))
    jump = ok.copy()
    jump[1] = 0
    jump[1, [0, 2, 2], [0, 1, 2]] = 1  # blank straight to blank: no move skips a label
    with pytest.raises(UserError, match="skips a blank between two different labels"):
        d.log_prob(conv(jump))
    past = ok.copy()
    past[1, 2, 3] = 1  # a state at frame 3, past the input length 3
    with pytest.raises(UserError, match="none past it"):
        d.log_prob(conv(past))
