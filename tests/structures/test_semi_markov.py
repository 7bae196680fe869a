"""SemiMarkovCRF on both backends, from the one recursion of ppl_attention/structures: every
operation against brute-force enumeration of every labelled segmentation (float64, ragged
lengths in one batch), exact draws by a chi-square test, the backends against each other in
float32, and bad input refused in one line."""

import jax
import numpy as np
import on_backends
import pytest
from brute_force import chi_square_pvalue, semi_markov_structures, summary
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
from ppl_attention.structures.semi_markov import event_to_segments, segments_to_event

jax.config.update("jax_enable_x64", True)


def make(backend, theta, lengths=None, dtype=np.float64):
    return on_backends.make(backend, "SemiMarkovCRF", theta, lengths, dtype)





@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n, m, t", [(1, 1, 2), (3, 2, 2), (4, 3, 2), (5, 2, 3), (5, 5, 1)])
def test_every_operation_equals_brute_force(backend, n, m, t):
    rng = np.random.default_rng(n * 100 + m * 10 + t)
    theta = rng.normal(size=(3, n, m, t, t)) * 1.5
    other = rng.normal(size=(3, n, m, t, t)) * 1.5
    lengths = np.array([n, max(1, n - 1), max(1, n - 3)])
    d, q = make(backend, theta, lengths), make(backend, other, lengths)
    got = every_operation(d, q)
    for b, L in enumerate(lengths):
        events = np.array([e for e, _ in semi_markov_structures(n, m, t, L)])
        ref = summary(events, theta[b], other[b])
        assert_row_equals_brute_force(got, b, ref)
        row = make(backend, theta[b:b + 1], lengths[b:b + 1])
        np.testing.assert_allclose(arr(row.log_prob(conv(backend, events[:, None])))[:, 0],
                                   ref["log_p"], atol=1e-10)


@pytest.mark.parametrize("k", DRAWS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_exact_draws_pass_chi_square(backend, k):
    n, m, t = 4, 2, 2
    theta = np.random.default_rng(5).normal(size=(2, n, m, t, t))
    lengths = np.array([4, 3])
    d = make(backend, theta, lengths)
    drawn = draws(backend, d, k)
    for b, L in enumerate(lengths):
        structures = list(semi_markov_structures(n, m, t, L))
        ref = summary(np.array([e for e, _ in structures]), theta[b])
        counts = counts_of(drawn[:, b], [tuple(s) for _, s in structures],
                           lambda e: tuple(event_to_segments(e)))
        assert chi_square_pvalue(counts, ref["probs"]) > 1e-3


def test_the_backends_agree_in_float32():
    rng = np.random.default_rng(7)
    theta = rng.normal(size=(3, 24, 4, 3, 3)).astype(np.float32)
    lengths = np.array([24, 11, 1])
    p, j = make("pyro", theta, lengths, np.float32), make("numpyro", theta, lengths, np.float32)
    np.testing.assert_allclose(arr(p.log_partition), arr(j.log_partition), rtol=1e-5)
    np.testing.assert_allclose(arr(p.marginals), arr(j.marginals), atol=1e-5)
    np.testing.assert_array_equal(arr(p.argmax()), arr(j.argmax()))


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_input_is_refused_in_one_line(backend):
    with pytest.raises(UserError, match=r"must be \[\.\.\., n, m, t, t\]"):
        make(backend, np.zeros((3, 2, 2, 3)))
    with pytest.raises(UserError, match=r"lengths must lie in 1 … 3"):
        make(backend, np.zeros((2, 3, 2, 2, 2)), np.array([3, 4]))
    # the segment-length axis forgotten: [B, n, t, t] with lengths [B] names the reading
    with pytest.raises(UserError, match=r"read as batch \(\) \+ event \(4, 6, 3, 3\) .* is "
                                        r"an event axis missing\?"):
        make(backend, np.zeros((4, 6, 3, 3)), np.array([6, 5, 4, 3]))
    d = make(backend, np.zeros((1, 4, 2, 2, 2)), np.array([3]))
    ok = np.array([segments_to_event([(0, 1, 1), (2, 2, 0)], 4, 2, 2)])
    assert np.isfinite(arr(d.log_prob(conv(backend, ok)))).all()
    for segs, why in (([(0, 0, 1), (2, 2, 0)], "tile the positions"),
                      ([(0, 1, 1)], "not the row's length 3"),
                      ([(0, 1, 1), (2, 3, 0)], "past it")):
        with pytest.raises(UserError, match=why):
            d.log_prob(conv(backend, np.array([segments_to_event(segs, 4, 2, 2)])))
    wrong = ok.copy()
    wrong[0, 2, 0, 1, 0] = 0
    wrong[0, 2, 0, 0, 0] = 1  # follows label 0, but the segment before has label 1
    with pytest.raises(UserError, match="follows label 0"):
        d.log_prob(conv(backend, wrong))
