"""The word aligners' conditionals (ppl_attention.numpyro.aligners) against brute force: on a
tiny corpus and random tables, every alignment of every pair enumerated — the marginal
likelihood, each target word's posterior over NULL and the source positions, the expected
counts of the cells and buckets, and the frequencies of the drawn alignments (FFBS for the
HMM) — for IBM1, IBM2 and the HMM; the sparse Dirichlet draws of the translation rows against
the dense Dirichlet's moments.

The HMM's forward pass is the structure library's chain recursion in the probability semiring;
planted faults (``python tests/plant_faults.py w1 w2``): w1 the NULL state dropped from the
step, w2 the memory after a step read as the memory before it — each fails 2 tests here.
"""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppl_attention.data.indexed import index_pairs
from ppl_attention.numpyro import aligners as al

PAIRS = [("a b c".split(), "x y z".split()), ("b c".split(), "y w z".split()),
         ("a".split(), "x w".split())]


def _corpus():
    corpus, _, _ = index_pairs(PAIRS, batch=4, multiple=4)
    return corpus


def _tables(spec, corpus, seed=0):
    """Random tables; with ``spec.null_prior`` NULL's bucket at its fixed weight ν and the
    real buckets a distribution of their own (the weights then sum to 1 + ν)."""
    rng = np.random.default_rng(seed)
    log_theta = np.log(rng.dirichlet(np.ones(corpus.n_cells)) + 0.05).astype(np.float32)
    log_dist = np.log(rng.dirichlet(np.ones(max(spec.n_buckets, 1))))[:spec.n_buckets]
    if spec.null_prior:
        log_dist = np.log(rng.dirichlet(np.ones(spec.n_buckets - 1)))
        log_dist = np.append(log_dist, math.log(spec.null_prior))
    return jnp.asarray(log_theta), jnp.asarray(log_dist, jnp.float32)


def _batches(corpus):
    for c in corpus.classes:
        for n in range(c.shape[0]):
            yield {k: jnp.asarray(getattr(c, k)[n]) for k in
                   ("src", "src_mask", "tgt", "tgt_mask", "cell")}, c.index[n]


def _brute(spec, log_theta, log_dist, b, r):
    """Every alignment of row r: (weights, alignments, bucket lists, cell lists)."""
    S = int(b["src_mask"][r].sum()) - 1
    T = int(b["tgt_mask"][r].sum())
    cell = np.asarray(b["cell"][r])
    th, dl = np.exp(np.asarray(log_theta, np.float64)), np.exp(np.asarray(log_dist, np.float64))
    D = spec.max_jump
    out = []
    for a in itertools.product(range(S + 1), repeat=T):
        w, buckets, cells, m = 1.0, [], [], -1
        for j, i in enumerate(a):
            w *= th[cell[i, j]]
            cells.append(cell[i, j])
            if spec.model == "ibm1":
                w /= S + 1
            elif spec.model == "ibm2":
                bk = spec.null_bucket if i == 0 else \
                    int(np.clip(i - 1 - math.floor((j + 0.5) * S / T), -D, D)) + D
                w *= dl[bk]
                buckets.append(bk)
            else:
                if i == 0:
                    bk = spec.null_bucket
                else:
                    bk = int(np.clip(i - 1 - m, -D, D)) + D
                    m = i - 1
                w *= dl[bk]
                buckets.append(bk)
        out.append((w, a, buckets, cells))
    return out


#: the aligners whose alignments are drawn exactly given the tables (the fertility aligner's
#: single-site sweep has its own tests: tests/numpyro/test_fertility_aligner.py)
BLOCKED = [m for m in al.ALIGNERS if not al.ALIGNER_KINDS[m].fertility]


#: (model, NULL's fixed weight ν) — ν = 0: learned, the weights a distribution; ν > 0 for the
#: aligners with a NULL bucket: a Gibbs distribution, log Z no likelihood
WEIGHTS = [(m, 0.0) for m in BLOCKED] + [(m, 0.2) for m in BLOCKED
                                         if al.ALIGNER_KINDS[m].buckets != "none"]


@pytest.mark.parametrize("model, null_prior", WEIGHTS)
def test_conditionals_equal_brute_force(model, null_prior):
    spec = al.aligner(model, max_jump=2, null_prior=null_prior)
    corpus = _corpus()
    log_theta, log_dist = _tables(spec, corpus)
    for b, index in _batches(corpus):
        out = al.batch_step(spec, jax.random.PRNGKey(0), log_theta, log_dist, b,
                            corpus.n_cells)
        cells = np.zeros(corpus.n_cells)
        buckets = np.zeros(spec.n_buckets)
        loglik = 0.0
        for r in range(b["src"].shape[0]):
            if index[r] < 0:
                continue
            rows = _brute(spec, log_theta, log_dist, b, r)
            Z = sum(w for w, *_ in rows)
            loglik += math.log(Z)
            S1, T = int(b["src_mask"][r].sum()), int(b["tgt_mask"][r].sum())
            marg = np.zeros((S1, T))
            for w, a, bks, cls in rows:
                for j, i in enumerate(a):
                    marg[i, j] += w / Z
                for bk in bks:
                    buckets[bk] += w / Z
                for c in cls:
                    cells[c] += w / Z
            np.testing.assert_allclose(np.asarray(out["probs"][r, :S1, :T]), marg, atol=2e-5)
        np.testing.assert_allclose(float(out["loglik"]), loglik, rtol=1e-5)
        np.testing.assert_allclose(np.asarray(out["expected_cells"]), cells, atol=1e-4)
        if spec.n_buckets:
            np.testing.assert_allclose(np.asarray(out["expected_buckets"]), buckets, atol=1e-4)


@pytest.mark.parametrize("model", BLOCKED)
def test_drawn_alignments_follow_the_posterior(model):
    """The draws' frequency of each whole alignment of each pair equals its exact posterior
    probability within 4.5 standard errors (20,000 draws)."""
    spec = al.aligner(model, max_jump=2)
    corpus = _corpus()
    log_theta, log_dist = _tables(spec, corpus, seed=1)
    n = 20_000
    for b, index in _batches(corpus):
        draw = jax.jit(jax.vmap(lambda k, b=b: al.batch_step(spec, k, log_theta, log_dist, b,
                                                             corpus.n_cells)["align"]))
        a = np.asarray(draw(jax.random.split(jax.random.PRNGKey(2), n)))  # [n, B, T]
        for r in range(b["src"].shape[0]):
            if index[r] < 0:
                continue
            rows = _brute(spec, log_theta, log_dist, b, r)
            Z = sum(w for w, *_ in rows)
            T = int(b["tgt_mask"][r].sum())
            got = {}
            for row in map(tuple, a[:, r, :T]):
                got[row] = got.get(row, 0) + 1
            assert set(got) <= {al_ for _, al_, *_ in rows}
            for w, al_, *_ in rows:
                p = w / Z
                se = math.sqrt(p * (1 - p) / n) + 1e-4
                assert abs(got.get(tuple(al_), 0) / n - p) <= 4.5 * se, (model, r, al_, p)


def test_sparse_translation_draws_have_the_dirichlet_moments():
    """A row with k co-occurring cells of V target words: the sparse draw (k Gammas and one for
    the rest) has the mean and variance of the Dirichlet(α + counts) entries."""
    spec = al.aligner("ibm1", alpha=0.5)
    counts = jnp.array([3.0, 0.0, 1.0, 5.0])
    cell_src = jnp.array([0, 0, 0, 1])
    V = 6
    draws = jax.vmap(lambda k: jnp.exp(al.sample_translation(k, spec, counts, cell_src, 2, V)))(
        jax.random.split(jax.random.PRNGKey(0), 40_000))
    a = np.array([3.5, 0.5, 1.5] + [0.5] * 3)  # row 0: its 3 cells and 3 others
    mean = a / a.sum()
    var = mean * (1 - mean) / (a.sum() + 1)
    np.testing.assert_allclose(np.asarray(draws[:, :3].mean(0)), mean[:3], atol=4e-3)
    np.testing.assert_allclose(np.asarray(draws[:, :3].var(0)), var[:3], rtol=0.05)
    b = np.array([5.5] + [0.5] * 5)  # row 1: one cell
    np.testing.assert_allclose(float(draws[:, 3].mean()), b[0] / b.sum(), atol=4e-3)


@pytest.mark.parametrize("capacity", [None, 7])
@pytest.mark.parametrize("a", [0.01, 0.3, 1.0, 2.5, 40.0])
def test_log_gamma_draws_are_gamma(a, capacity):
    """The vectorized Marsaglia–Tsang draws (with the boost below 1) against Gamma(a)'s CDF:
    Kolmogorov–Smirnov on 20,000 draws of log G — the rejected proposals redrawn in slots of
    the default capacity and in slots of 7 (many rounds of gathering)."""
    from scipy import stats

    x = np.asarray(al.log_gamma_draws(jax.random.PRNGKey(3), jnp.full((20_000,), a),
                                      capacity), np.float64)
    assert np.isfinite(x).all()
    assert stats.kstest(np.exp(x) if a >= 0.3 else x,
                        (lambda v: stats.gamma.cdf(v, a)) if a >= 0.3 else
                        (lambda v: stats.gamma.cdf(np.exp(v), a))).pvalue > 1e-3


def test_gibbs_link_marginals_are_the_conditionals_of_the_kept_sweeps():
    """With no warm-up and one kept sweep, ``run_gibbs``'s link marginals are exactly the
    posterior given the starting tables (uniform rows) for every pair of every class — the
    accumulator updated in place batch by batch, none skipped or misplaced; with a warm-up of
    one, the conditionals of the second sweep's tables (rows of the simplex again)."""
    from ppl_attention.numpyro.inference import word_alignment as wa

    corpus, _, _ = index_pairs(PAIRS * 3, batch=2, multiple=4)
    spec = al.aligner("ibm1", alpha=0.5)
    res = wa.run_gibbs(spec, corpus, chains=1, warmup=0, samples=1, track=4, progress=False)
    sizes, data = wa.device_corpus(corpus)
    log_theta, log_dist = al.uniform_tables(spec, {**sizes, **data})
    _, probs, _ = wa._sweep(spec, jax.random.PRNGKey(0), log_theta, log_dist, sizes, data,
                            "expect")
    assert len(res["marginals"]) == len(probs) >= 1
    for got, want in zip(res["marginals"], probs):
        np.testing.assert_allclose(got, np.asarray(want), rtol=1e-5, atol=1e-6)
    res = wa.run_gibbs(spec, corpus, chains=2, warmup=1, samples=3, track=4, progress=False)
    for m, c in zip(res["marginals"], corpus.classes):
        s = m.sum(2)  # over NULL and the source positions
        np.testing.assert_allclose(s[c.tgt_mask], 1.0, rtol=1e-5)
        assert np.all(s[~c.tgt_mask] == 0)


def test_small_groups_join_a_larger_class():
    """A length group of fewer than ``merge_below`` pairs joins the smallest class that holds
    its shape — one compiled scan fewer — and the padding changes nothing: VB's link
    marginals of every pair are those of the unmerged corpus."""
    from ppl_attention.numpyro.inference import word_alignment as wa

    long = [("a b c d e f".split(), "x y z w v".split()), ("b c d a f e".split(),
                                                            "y z x v w".split())] * 2
    pairs = long + [("a b".split(), "x y".split()), ("c".split(), "z".split())]
    merged, _, _ = index_pairs(pairs, batch=8, multiple=4, merge_below=3)
    apart, _, _ = index_pairs(pairs, batch=8, multiple=4, merge_below=0)
    assert len(merged.classes) == 1 < len(apart.classes)
    shared, _, _ = index_pairs(pairs, batch=8, multiple=4, merge_below=5)  # no group a host
    assert len(shared.classes) == 1
    spec = al.aligner("hmm", max_jump=2, null_prior=0.0)

    def per_pair(corpus):
        sizes, data = wa.device_corpus(corpus)
        marg = wa.vb_sweeps(spec, sizes, data, iterations=3, tol=0.0,
                            progress=False)["marginals"]
        out = {}
        for c, m in zip(corpus.classes, marg):
            for (n, b), k in np.ndenumerate(c.index):
                if k >= 0:
                    out[int(k)] = m[n, b, :1 + corpus.src_len[k], :corpus.tgt_len[k]]
        return out

    want = per_pair(apart)
    for got in (per_pair(merged), per_pair(shared)):
        assert sorted(got) == list(range(len(pairs)))
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)


def test_small_groups_prefer_a_host_with_room_and_gamma_slots_are_checked():
    """A small group joins the smallest host whose last batch has room for it rather than one
    that would need a whole batch more; the Gamma draws' slot capacity is refused below 1."""
    from ppl_attention.core.errors import UserError
    from ppl_attention.data.indexed import _merge_small_groups

    full = (16, 16, np.arange(8))        # 8 rows: 2 full batches of 4
    roomy = (24, 24, np.arange(8, 14))   # 6 rows: room for 2 more
    small = (8, 8, np.arange(14, 16))    # 2 rows
    merged = {(s1, t): len(r) for s1, t, r in _merge_small_groups([full, roomy, small], 4, 4)}
    assert merged == {(16, 16): 8, (24, 24): 8}
    merged = {(s1, t): len(r) for s1, t, r in
              _merge_small_groups([full, roomy, (8, 8, np.arange(14, 17))], 4, 4)}
    assert merged == {(16, 16): 11, (24, 24): 6}  # no host has room: the smallest
    lopsided = [(8, 24, np.arange(3)), (24, 8, np.arange(3, 5)), (8, 8, np.arange(5, 6))]
    merged = {(s1, t): len(r) for s1, t, r in _merge_small_groups(lopsided, 4, 4)}
    assert merged == {(24, 24): 6}  # no host at all: the small groups share one class
    for bad in (0, -1, 2.5):
        with pytest.raises(UserError, match="capacity must be an int ≥ 1"):
            al.log_gamma_draws(jax.random.PRNGKey(0), jnp.ones(3), bad)


_SWEEP_COUNTS = """
import os, sys
from pathlib import Path
from ppl_attention.data.indexed import index_pairs
from ppl_attention.numpyro import aligners as al
from ppl_attention.numpyro.inference import word_alignment as wa

pairs = [(s.split(), t.split()) for s, t in (("a b c", "x y z"), ("b c", "y z"), ("a c", "x z"),
                                             ("c a b", "z x y"))]
corpus, _, _ = index_pairs(pairs, batch=2, multiple=4)
spec = al.aligner("fertility", null_prior=0.0)
cache = Path(os.environ["PPL_ATTENTION_JAX_CACHE"])
entries = []
for warmup, samples in ((2, 2), (6, 6)):  # 4 and 12 sweeps: 2 and 3 HMM sweeps to start
    # with progress bars, as wordalign runs (without them NumPyro's fori_collect compiles the
    # HMM start's loop of sweeps whole, its length a constant)
    wa.run_gibbs(spec, corpus, chains=2, warmup=warmup, samples=samples, track=4,
                 progress=True, init_sweeps=1)
    entries.append(sorted(p.name for p in cache.iterdir()))
new = sorted(set(entries[1]) - set(entries[0]))
print(len(entries[0]), len(new), new)
"""


def test_one_compiled_sweep_serves_every_sweep_count(tmp_path):
    """A second run with other --warmup / --samples compiles nothing new (the warm-up's length
    is an argument of the sweep, not a constant in it): a user who runs more sweeps, as the
    mixing warning advises, finds the first run's programs in the persistent cache."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PPL_ATTENTION_JAX_CACHE": str(tmp_path / "jax")}
    out = subprocess.run([sys.executable, "-c", _SWEEP_COUNTS], capture_output=True,
                         text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    first, n_new, new = out.stdout.split(" ", 2)
    assert int(first) > 0, "the first run wrote no compiled program"
    assert int(n_new) == 0, f"programs compiled again for other sweep counts: {new}"
