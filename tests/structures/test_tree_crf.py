"""TreeCRF (constituency) on both backends, from the one inside recursion of
ppl_attention/structures: every operation against brute-force enumeration of every labelled
binary tree (float64, ragged lengths in one batch), exact draws by a chi-square test, the
backends against each other in float32, and bad input refused in one line."""

import jax
import numpy as np
import on_backends
import pytest
from brute_force import chi_square_pvalue, summary, tree_crf_structures
from on_backends import (
    BACKENDS,
    DRAWS,
    arr,
    assert_row_equals_brute_force,
    conv,
    counts_of,
    draws,
    every_operation,
)

from ppl_attention.core.errors import UserError
from ppl_attention.structures.tree_crf import event_to_spans, spans_to_event

jax.config.update("jax_enable_x64", True)


def make(backend, theta, lengths=None, dtype=np.float64):
    return on_backends.make(backend, "TreeCRF", theta, lengths, dtype)





@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n, labels", [(1, 2), (3, 2), (4, 2), (5, 1)])
def test_every_operation_equals_brute_force(backend, n, labels):
    rng = np.random.default_rng(n * 10 + labels)
    theta = rng.normal(size=(3, n, n, labels))
    other = rng.normal(size=(3, n, n, labels))
    lengths = np.array([n, max(1, n - 1), max(1, n - 3)])
    d, q = make(backend, theta, lengths), make(backend, other, lengths)
    got = every_operation(d, q)
    for b, L in enumerate(lengths):
        events = np.array([e for e, _ in tree_crf_structures(n, labels, L)])
        ref = summary(events, theta[b], other[b])
        assert_row_equals_brute_force(got, b, ref)
        row = make(backend, theta[b:b + 1], lengths[b:b + 1])
        np.testing.assert_allclose(arr(row.log_prob(conv(backend, events[:, None])))[:, 0],
                                   ref["log_p"], atol=1e-10)


@pytest.mark.parametrize("k", DRAWS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_exact_draws_pass_chi_square(backend, k):
    n, labels = 4, 2
    theta = np.random.default_rng(4).normal(size=(2, n, n, labels))
    lengths = np.array([4, 3])
    d = make(backend, theta, lengths)
    drawn = draws(backend, d, k)
    for b, L in enumerate(lengths):
        structures = list(tree_crf_structures(n, labels, L))
        ref = summary(np.array([e for e, _ in structures]), theta[b])
        counts = counts_of(drawn[:, b], [tuple(sorted(s)) for _, s in structures],
                           lambda e: tuple(event_to_spans(e)))
        assert chi_square_pvalue(counts, ref["probs"]) > 1e-3


def test_the_backends_agree_in_float32():
    theta = np.random.default_rng(8).normal(size=(3, 12, 12, 4)).astype(np.float32)
    lengths = np.array([12, 5, 1])
    p, j = make("pyro", theta, lengths, np.float32), make("numpyro", theta, lengths, np.float32)
    np.testing.assert_allclose(arr(p.log_partition), arr(j.log_partition), rtol=1e-5)
    np.testing.assert_allclose(arr(p.marginals), arr(j.marginals), atol=1e-5)
    np.testing.assert_array_equal(arr(p.argmax()), arr(j.argmax()))


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_input_is_refused_in_one_line(backend):
    with pytest.raises(UserError, match=r"must be \[\.\.\., n, n, l\]"):
        make(backend, np.zeros((2, 3, 4, 2)))
    with pytest.raises(UserError, match=r"lengths must lie in 1 … 3"):
        make(backend, np.zeros((2, 3, 3, 2)), np.array([0, 3]))
    d = make(backend, np.zeros((1, 4, 4, 2)), np.array([3]))
    ok = [((0, 2), 0), ((0, 0), 1), ((1, 2), 0), ((1, 1), 0), ((2, 2), 1)]
    assert np.isfinite(arr(d.log_prob(conv(backend, np.array([spans_to_event(ok, 4, 2)]))))).all()
    for spans in (ok[1:], ok + [((3, 3), 0)], [((0, 2), 0), ((0, 1), 0), ((1, 2), 0),
                                                ((0, 0), 0), ((1, 1), 0), ((2, 2), 0)]):
        with pytest.raises(UserError, match="one binary tree"):
            d.log_prob(conv(backend, np.array([spans_to_event(spans, 4, 2)])))
    two = np.array([spans_to_event(ok, 4, 2)])
    two[0, 0, 2, 1] = 1
    with pytest.raises(UserError, match="one label"):
        d.log_prob(conv(backend, two))
