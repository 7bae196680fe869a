"""Attention over segments (``pa.Segments``, ``pa.SegmentMarginals`` and their NumPyro twins;
:mod:`ppl_attention.structures.segment_selection`), on both backends:

- the selection is the distribution it claims: p(c | e) ∝ exp⟨c, e⟩ over coverage patterns c
  whose runs of 1s are at most ``max_len`` long — log Z and the coverage marginals against
  brute-force enumeration of those patterns (float64, ragged lengths in one batch, every
  ``max_len`` from 1 to past the length), the MAP selection against the best pattern, exact
  draws by a chi-square test on the patterns' frequencies;
- the marginal family's weights are the sampled family's expected weights, and its context the
  expected context (the context is linear in the selection);
- Pyro = NumPyro on the same scores (float32): weights, MAP, log q of a draw, the KL;
- padding: a padded position gets weight exactly 0, in draws, marginals and the MAP, and
  padding a row further changes nothing of its real positions;
- bad input refused in one line: a mask that is not a prefix, ``max_len`` < 1;
- the segmentation metric and the ``phrases`` task's gold.

Planted faults (``python tests/plant_faults.py g1 g2``): g1 the coverage forgetting a
segment's last position → 12 failed (the brute-force and chi-square tests, both backends); g2
two selected segments allowed to be adjacent → 12 failed (the same). The masked-site defects
the verification matrix found on ``segments-sample`` are planted as l6 (Pyro's estimator
scoring the masked draws → ``test_b_parity[segments-sample-pyro]`` fails) and l7 (NumPyro's
structures with a feasible zero value → ``test_d_closed_form_kl[segments-sample-numpyro]``
fails).
"""

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
from ppl_attention.common.metrics import link_segments, segment_scores
from ppl_attention.core.errors import UserError
from ppl_attention.data.tasks import make_task

jax.config.update("jax_enable_x64", True)


def family(backend, cls, **kw):
    return getattr(pa if backend == "pyro" else pn, cls)(**kw)


def patterns(L, max_len):
    """Every coverage pattern of L positions whose runs of 1s are at most ``max_len`` long."""
    for c in itertools.product([0, 1], repeat=L):
        runs = [len(list(g)) for k, g in itertools.groupby(c) if k == 1]
        if all(r <= max_len for r in runs):
            yield np.array(c, float)


def brute(e, L, max_len):
    """(log Z, coverage marginals [S], best pattern [S], {pattern: p}) of a row's scores."""
    pats = list(patterns(L, max_len))
    s = np.array([p @ e[:L] for p in pats])
    log_z = np.logaddexp.reduce(s)
    p = np.exp(s - log_z)
    mu = np.zeros(len(e))
    mu[:L] = (p[:, None] * np.stack(pats)).sum(0)
    best = np.zeros(len(e))
    best[:L] = pats[int(np.argmax(s))]
    return log_z, mu, best, {tuple(q): pq for q, pq in zip(pats, p)}


def _mask(lengths, S):
    return np.arange(S)[None, :] < np.asarray(lengths)[:, None]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("max_len", [1, 2, 3, 6])
def test_selection_equals_brute_force(backend, max_len):
    rng = np.random.default_rng(max_len)
    S, lengths = 5, [5, 3, 1, 4]
    e = rng.normal(size=(len(lengths), S)) * 1.5
    scores, mask = conv(backend, e), conv(backend, _mask(lengths, S))
    fam = family(backend, "SegmentMarginals", max_len=max_len)
    sel = fam.selection(scores, mask)
    weights = arr(fam.deterministic_weights(scores, mask))
    best = arr(fam.map_weights(scores, mask))
    reads = arr(fam.read_positions(fam.map_weights(scores, mask)))
    for b, L in enumerate(lengths):
        log_z, mu, top, _ = brute(e[b], L, max_len)
        np.testing.assert_allclose(arr(sel.log_partition)[b], log_z, rtol=1e-10)
        np.testing.assert_allclose(weights[b], mu, atol=1e-10)
        np.testing.assert_array_equal(best[b], top)
        np.testing.assert_array_equal(reads[b], top == 1)  # the MAP pattern's positions


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("k", DRAWS)
def test_draws_are_exact(backend, k):
    """Chi-square of the drawn coverage patterns against their exact probabilities."""
    e = np.array([[0.4, -0.3, 1.0, 0.2]])
    fam = family(backend, "Segments", max_len=2)
    scores, mask = conv(backend, e), conv(backend, _mask([4], 4))
    sel = fam.selection(scores, mask)
    if backend == "pyro":
        torch.manual_seed(1)
        z = sel.sample((k,))
    else:
        z = sel.sample(jax.random.PRNGKey(1), (k,))
    cov = arr(fam.weights(z, scores, mask))[:, 0]
    _, _, _, probs = brute(e[0], 4, 2)
    keys = list(probs)
    counts = np.array([np.sum(np.all(cov == np.array(q), -1)) for q in keys])
    assert counts.sum() == k  # every draw is an allowed pattern
    expected = np.array([probs[q] for q in keys]) * k
    assert stats.chisquare(counts, expected).pvalue > 1e-3


def segments(max_len):
    def make(backend, sampled):
        return family(backend, "Segments" if sampled else "SegmentMarginals", max_len=max_len)
    return make


@pytest.mark.parametrize("backend", BACKENDS)
def test_marginal_context_is_the_expected_sampled_context(backend):
    check_marginal_context(backend, segments(3))


def test_pyro_equals_numpyro_float32():
    check_pyro_equals_numpyro(segments(3))


@pytest.mark.parametrize("backend", BACKENDS)
def test_padding_gets_zero_weight_and_changes_nothing(backend):
    check_padding(backend, segments(2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_input_refused(backend):
    with pytest.raises(UserError, match="max_len"):
        family(backend, "Segments", max_len=0)
    fam = family(backend, "Segments")
    holey = conv(backend, np.array([[True, False, True]]))
    with pytest.raises(UserError, match="prefix"):
        fam.selection(conv(backend, np.zeros((1, 3))), holey)


@pytest.mark.parametrize("backend", BACKENDS)
def test_attend_writes_a_selection_site(backend):
    """``attend`` with the sampled family: the site's value is the semi-Markov event, the
    weights its coverage (0 on padding), the context coverage @ values."""
    rng = np.random.default_rng(5)
    e = rng.normal(size=(2, 3, 4))
    values = rng.normal(size=(2, 4, 2))
    mask = _mask([4, 3], 4)
    if backend == "pyro":
        import pyro

        with pyro.poutine.trace() as tr:
            ctx, w = pa.attend("z", torch.tensor(e), torch.tensor(values), "segments",
                               torch.tensor(mask))
        value = tr.trace.nodes["z"]["value"]
    else:
        import numpyro

        with numpyro.handlers.seed(rng_seed=0), numpyro.handlers.trace() as tr:
            ctx, w = pn.attend("z", jnp.asarray(e), jnp.asarray(values), "segments",
                               jnp.asarray(mask))
        value = tr["z"]["value"]
    assert tuple(value.shape) == (2, 3, 4, 3, 2, 2)
    w = arr(w)
    assert set(np.unique(w)) <= {0.0, 1.0} and (w[1, :, 3] == 0).all()
    np.testing.assert_allclose(arr(ctx), w @ values, atol=1e-12)


def test_segment_scores():
    assert link_segments({(0, 0), (1, 0), (3, 0), (2, 1)}) == {(0, 0, 1), (0, 3, 3), (1, 2, 2)}
    gold = [{(0, 0), (1, 0), (2, 1)}]
    assert segment_scores(gold, gold)["segment_f1"] == 1.0
    got = segment_scores([{(0, 0), (2, 1), (3, 1)}], gold)  # 0 of 2 predicted segments right
    assert got["segment_precision"] == 0.0 and got["segment_recall"] == 0.0
    half = segment_scores([{(0, 0), (1, 0), (3, 1)}], gold)
    assert half["segment_precision"] == 0.5 and half["segment_recall"] == 0.5


def test_phrases_task_gold_is_one_segment_per_target():
    task = make_task("phrases", n_train=50, n_eval=20)
    assert task.test.segments
    for (x, y), gold in zip(task.train.pairs, task.train.gold):
        segs = link_segments(gold)
        assert sorted(j for j, _, _ in segs) == list(range(len(y)))  # one per target token
        assert sum(b - a + 1 for _, a, b in segs) == len(x)  # they cover the source once
        for _, a, b in segs:
            assert x[a].startswith("h") and all(t.startswith("m") for t in x[a + 1:b + 1])
