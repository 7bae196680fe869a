"""Attention over spans (``pa.Spans``, ``pa.SpanMarginals`` and their NumPyro twins;
:mod:`ppl_attention.structures.span_selection`), on both backends:

- the selection is the distribution it claims: p(z | e) ∝ exp⟨w(z), e⟩ over labelled binary
  trees z (each span read or not), w_k(z) = Σ_{read spans ∋ k} 1/width — log Z, the marginal
  weights E[w(z)], each span's probability of being read (the parts calibration reads) and the
  MAP tree's weights against a brute-force enumeration of the trees written here (float64,
  ragged lengths in one batch); exact draws by a chi-square test on the labelled trees'
  frequencies;
- the marginal family's weights are the sampled family's expected weights, and its context the
  expected context (the context is linear in the tree);
- Pyro = NumPyro on the same scores (float32): weights, MAP, log q of a tree, the KL, the parts;
- padding: a padded position gets weight exactly 0, in draws, marginals and the MAP, and
  padding a row further changes nothing of its real positions;
- ``attend`` writes the constituency event as the site, its weights and context; a mask that is
  not a prefix is refused in one line.

Planted fault (``python tests/plant_faults.py g3``): a read span weighted by 1 instead of its
average (1/width) → 8 failed: the brute-force, chi-square (both forms) and attend tests,
on both backends.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from on_backends import BACKENDS, DRAWS, arr, conv
from scipy import stats
from selection_checks import check_marginal_context, check_padding, check_pyro_equals_numpyro

import ppl_attention as pa
import ppl_attention.numpyro as pn
from ppl_attention.core.errors import UserError

jax.config.update("jax_enable_x64", True)


def family(backend, cls):
    return getattr(pa if backend == "pyro" else pn, cls)()


@functools.cache
def brackets(i, j):
    """Every binary bracketing of words i … j: tuples of its spans (the leaves and [i, j])."""
    if i == j:
        return [((i, i),)]
    return [((i, j),) + left + right for k in range(i, j)
            for left in brackets(i, k) for right in brackets(k + 1, j)]


def labelled_trees(L):
    """Every labelled tree over L words: (spans, read flags)."""
    for spans in brackets(0, L - 1):
        for read in itertools.product([0, 1], repeat=len(spans)):
            yield spans, read


def weights_of(spans, read, S):
    w = np.zeros(S)
    for (i, j), r in zip(spans, read):
        w[i:j + 1] += r / (j - i + 1)
    return w


def brute(e, L):
    """(log Z, E[w] [S], p(span read) [S, S], MAP weights [S], {tree: p}) of a row's scores."""
    S = len(e)
    trees = list(labelled_trees(L))
    ws = np.stack([weights_of(s, r, S) for s, r in trees])
    score = ws @ e
    log_z = np.logaddexp.reduce(score)
    p = np.exp(score - log_z)
    read = np.zeros((S, S))
    for (spans, flags), pt in zip(trees, p):
        for (i, j), r in zip(spans, flags):
            read[i, j] += pt * r
    key = {(tuple(sorted(s)), tuple(f for _, f in sorted(zip(s, r)))): pt
           for (s, r), pt in zip(trees, p)}
    return log_z, p @ ws, read, ws[int(np.argmax(score))], key


def _mask(lengths, S):
    return np.arange(S)[None, :] < np.asarray(lengths)[:, None]


def tree_key(event):
    """A labelled tree's key from its event ``[S, S, 2]`` (spans sorted, their read flags)."""
    spans = sorted((int(i), int(j)) for i, j in np.argwhere(event.sum(-1) > 0))
    return tuple(spans), tuple(int(event[i, j, 1]) for i, j in spans)


@pytest.mark.parametrize("backend", BACKENDS)
def test_selection_equals_brute_force(backend):
    rng = np.random.default_rng(0)
    S, lengths = 5, [5, 3, 1, 4]
    e = rng.normal(size=(len(lengths), S)) * 1.5
    scores, mask = conv(backend, e), conv(backend, _mask(lengths, S))
    fam = family(backend, "SpanMarginals")
    tree = fam.selection(scores, mask)
    weights = arr(fam.deterministic_weights(scores, mask))
    parts = arr(fam.part_marginals(scores, mask))
    best = arr(fam.map_weights(scores, mask))
    reads = arr(fam.read_positions(fam.map_weights(scores, mask)))
    part_mask = arr(fam.part_mask(mask))
    for b, L in enumerate(lengths):
        log_z, mu, read, top, _ = brute(e[b], L)
        np.testing.assert_allclose(arr(tree.log_partition)[b], log_z, rtol=1e-10)
        np.testing.assert_allclose(weights[b], mu, atol=1e-10)
        np.testing.assert_allclose(parts[b], read, atol=1e-10)
        np.testing.assert_allclose(best[b], top, atol=1e-12)
        np.testing.assert_array_equal(reads[b], top > 0)  # the MAP tree's covered positions
        np.testing.assert_array_equal(part_mask[b], np.triu(np.ones((S, S), bool))
                                      & _mask([L], S)[0][:, None] & _mask([L], S)[0][None, :])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("k", DRAWS)
def test_draws_are_exact(backend, k):
    """Chi-square of the drawn labelled trees against their exact probabilities."""
    e = np.array([[0.4, -0.3, 0.8]])
    fam = family(backend, "Spans")
    scores, mask = conv(backend, e), conv(backend, _mask([3], 3))
    tree = fam.selection(scores, mask)
    if backend == "pyro":
        torch.manual_seed(1)
        z = tree.sample((k,))
    else:
        z = tree.sample(jax.random.PRNGKey(1), (k,))
    z = arr(z)[:, 0]
    *_, probs = brute(e[0], 3)
    keys = list(probs)
    drawn = [tree_key(ev) for ev in z]
    counts = np.array([sum(d == q for d in drawn) for q in keys])
    assert counts.sum() == k  # every draw is a labelled tree
    expected = np.array([probs[q] for q in keys]) * k
    assert stats.chisquare(counts, expected).pvalue > 1e-3
    np.testing.assert_allclose(arr(fam.weights(conv(backend, z[:5]), scores, None)),
                               [weights_of(*tree_key(ev), 3) for ev in z[:5]], atol=1e-12)


def spans(backend, sampled):
    return family(backend, "Spans" if sampled else "SpanMarginals")


@pytest.mark.parametrize("backend", BACKENDS)
def test_marginal_context_is_the_expected_sampled_context(backend):
    check_marginal_context(backend, spans, seed=1)


def test_pyro_equals_numpyro_float32():
    check_pyro_equals_numpyro(spans)


@pytest.mark.parametrize("backend", BACKENDS)
def test_padding_gets_zero_weight_and_changes_nothing(backend):
    check_padding(backend, spans)


@pytest.mark.parametrize("backend", BACKENDS)
def test_attend_writes_a_constituency_site(backend):
    """``attend`` with the sampled family: the site's value is the constituency event, the
    weights the read spans' averages (0 on padding), the context weights @ values."""
    rng = np.random.default_rng(5)
    e = rng.normal(size=(2, 3, 4))
    values = rng.normal(size=(2, 4, 2))
    mask = _mask([4, 3], 4)
    if backend == "pyro":
        import pyro

        with pyro.poutine.trace() as tr:
            ctx, w = pa.attend("z", torch.tensor(e), torch.tensor(values), "spans",
                               torch.tensor(mask))
        value = tr.trace.nodes["z"]["value"]
    else:
        import numpyro

        with numpyro.handlers.seed(rng_seed=0), numpyro.handlers.trace() as tr:
            ctx, w = pn.attend("z", jnp.asarray(e), jnp.asarray(values), "spans",
                               jnp.asarray(mask))
        value = tr["z"]["value"]
    assert tuple(value.shape) == (2, 3, 4, 4, 2)
    value, w = arr(value), arr(w)
    for b, t in itertools.product(range(2), range(3)):
        spans, read = tree_key(value[b, t])
        assert len(spans) == 2 * int(mask[b].sum()) - 1  # a whole tree over the real words
        np.testing.assert_allclose(w[b, t], weights_of(spans, read, 4), atol=1e-12)
    assert (w[1, :, 3] == 0).all()
    np.testing.assert_allclose(arr(ctx), w @ values, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_input_refused(backend):
    fam = family(backend, "Spans")
    holey = conv(backend, np.array([[True, False, True]]))
    with pytest.raises(UserError, match="prefix"):
        fam.selection(conv(backend, np.zeros((1, 3))), holey)
    with pytest.raises(UserError, match="no parameter"):
        (pa if backend == "pyro" else pn).make_family("spans", max_len=3)
