"""The fertility aligner (``wordalign --model fertility``): the HMM's jumps times a fertility
factor ψ_{e_i}(n_i) per source position, sampled by single-site Gibbs sweeps.

Its sweep must leave the alignment posterior p(a | f, e, tables) ∝ w(a) invariant: alignments
drawn exactly from the brute-force posterior (every alignment of two small sentences
enumerated, the fertility cap F and the jump clipping D both binding), swept once, are still
distributed as that posterior (20,000 draws); each word's conditional it returns (``probs``,
what the Rao–Blackwellized link marginals average) is the brute-force single-site conditional
and averages to the exact link marginals; the sweep's joint weight is w of the alignment it
drew; its counts are those of that alignment.

Planted faults (``python tests/plant_faults.py f1 f2 z3``): f1 the jump out of a word (to the
next linked word) left out of its conditional → ``test_sweep_leaves_the_posterior_invariant``
fails; f2 the word's own link not removed from the fertilities before its conditional → the
same; z3 the drawn link one-hot returned instead of the conditional → the same.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppl_attention.numpyro import aligners as al

SPEC = al.aligner("fertility", max_jump=1, max_fertility=2, beta=1.0, null_prior=0.0)
# sentence 0: 3 source words (ids 0, 1, 0), 3 target words; sentence 1: 1 source, 2 target
SRC = np.array([[9, 0, 1, 0], [9, 2, 9, 9]])  # S1 = 4, NULL's id 9 at position 0
SRC_MASK = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], bool)
TGT_MASK = np.array([[1, 1, 1], [1, 1, 0]], bool)
B, S1, T = 2, 4, 3


def _tables(seed=0):
    rng = np.random.default_rng(seed)
    cell = np.arange(B * S1 * T).reshape(B, S1, T)
    log_theta = np.log(rng.dirichlet(np.ones(B * S1 * T)) + 1e-3)
    log_dist = np.log(rng.dirichlet(np.ones(SPEC.n_buckets)))
    log_psi = np.log(rng.dirichlet(np.ones(SPEC.n_fertility), size=10))
    b = {"src": jnp.asarray(SRC, jnp.int32), "src_mask": jnp.asarray(SRC_MASK),
         "tgt": jnp.zeros((B, T), jnp.int32), "tgt_mask": jnp.asarray(TGT_MASK),
         "cell": jnp.asarray(cell, jnp.int32)}
    return b, cell, log_theta, log_dist, log_psi


def _log_weight(r, a, cell, log_theta, log_dist, log_psi, relaxed=False):
    """log w(a) of sentence r's alignment a (S1 indices), written out from the model;
    ``relaxed``: log w̃(a), a fertility n > F weighted ψ(F)·e^LOG_PAST_F (mean-field VB's
    relaxation) instead of 0."""
    D, F = SPEC.max_jump, SPEC.max_fertility
    total, memory = 0.0, -1
    for j, i in enumerate(a):
        total += log_theta[cell[r, i, j]]
        if i == 0:
            total += log_dist[SPEC.null_bucket]
        else:
            total += log_dist[min(max(i - 1 - memory, -D), D) + D]
            memory = i - 1
    for i in range(1, int(SRC_MASK[r].sum())):
        n = sum(1 for x in a if x == i)
        if n > F and not relaxed:
            return -np.inf
        total += log_psi[SRC[r, i], min(n, F)] + (al.LOG_PAST_F if n > F else 0.0)
    return total


def _posterior(r, tables):
    _, cell, log_theta, log_dist, log_psi = tables
    S, Tr = int(SRC_MASK[r].sum()), int(TGT_MASK[r].sum())
    support = list(itertools.product(range(S), repeat=Tr))
    w = np.array([_log_weight(r, a, cell, log_theta, log_dist, log_psi) for a in support])
    p = np.exp(w - w.max())
    return support, p / p.sum()


def _sweep(tables, keys, prev):
    b, _, log_theta, log_dist, log_psi = tables
    C = B * S1 * T

    def one(k, pr):
        return al.batch_step(SPEC, k, jnp.asarray(log_theta, jnp.float32),
                             jnp.asarray(log_dist, jnp.float32), b, C, "draw", prev=pr,
                             log_psi=jnp.asarray(log_psi, jnp.float32))
    return jax.jit(jax.vmap(one))(keys, prev)


def test_sweep_leaves_the_posterior_invariant():
    tables = _tables()
    n = 20_000
    rng = np.random.default_rng(1)
    post = [_posterior(r, tables) for r in range(B)]
    prev = np.full((n, B, T), -1, np.int32)
    for r, (support, p) in enumerate(post):
        pick = rng.choice(len(support), n, p=p)
        prev[:, r, :len(support[0])] = np.array(support)[pick]
    assert all((p > 0.02).sum() >= min(5, len(p) - 1) for _, p in post)  # not near-deterministic
    out = _sweep(tables, jax.random.split(jax.random.PRNGKey(2), n), jnp.asarray(prev))
    align = np.asarray(out["align"])
    assert (align[:, 1, 2] == -1).all()  # padding stays padding
    for r, (support, p) in enumerate(post):
        index = {a: k for k, a in enumerate(support)}
        got = np.bincount([index[tuple(a[:len(support[0])])] for a in align[:, r]],
                          minlength=len(support)) / n
        se = np.sqrt(p * (1 - p) / n) + 1e-4
        assert (np.abs(got - p) <= 4.5 * se).all(), (r, np.abs(got - p).max())
    # each word's conditional it was drawn from (the Rao–Blackwellized marginals' summand):
    # a distribution over NULL and the real positions, 0 on padding, and — averaged over
    # states from the posterior — the exact link marginals
    probs = np.asarray(out["probs"], np.float64)  # [n, B, S1, T]
    for r, (support, p) in enumerate(post):
        S, Tr = int(SRC_MASK[r].sum()), len(support[0])
        np.testing.assert_allclose(probs[:, r, :, :Tr].sum(1), 1.0, rtol=1e-5)
        assert (probs[:, r, S:, :] == 0).all() and (probs[:, r, :, Tr:] == 0).all()
        exact = np.zeros((S, Tr))
        for a, w in zip(support, p):
            exact[list(a), range(Tr)] += w
        rb = probs[:, r, :S, :Tr].mean(0)
        se = probs[:, r, :S, :Tr].std(0) / np.sqrt(n) + 1e-4
        assert (np.abs(rb - exact) <= 4.5 * se).all(), (r, np.abs(rb - exact).max())
        # the first word's conditional given the rest of the previous state, by brute force
        _, cell, log_theta, log_dist, log_psi = tables
        for s_ in range(50):
            rest = list(prev[s_, r, 1:Tr])
            w = np.array([_log_weight(r, [i] + rest, cell, log_theta, log_dist, log_psi)
                          for i in range(S)])
            want = np.exp(w - w.max()) / np.exp(w - w.max()).sum()
            np.testing.assert_allclose(probs[s_, r, :S, 0], want, atol=1e-5)


def test_sweep_weight_and_counts_are_the_drawn_alignments():
    tables = _tables(3)
    b, cell, log_theta, log_dist, log_psi = tables
    prev = jnp.asarray([[[1, 1, 0], [1, 0, -1]]] * 4, jnp.int32)
    out = _sweep(tables, jax.random.split(jax.random.PRNGKey(5), 4), prev)
    for s in range(4):
        a = np.asarray(out["align"][s])
        want = sum(_log_weight(r, list(a[r, :TGT_MASK[r].sum()]), cell, log_theta, log_dist,
                               log_psi) for r in range(B))
        np.testing.assert_allclose(float(out["loglik"][s]), want, rtol=1e-5)
        drawn = tuple(x[s] for x in out["drawn_fert"])
        counts = np.asarray(al.fertility_counts(SPEC, drawn, 10))
        want = np.zeros((10, SPEC.n_fertility))
        for r in range(B):
            for i in range(1, int(SRC_MASK[r].sum())):
                want[SRC[r, i], (a[r] == i).sum()] += 1
        np.testing.assert_array_equal(counts, want)
        assert float(out["drawn_buckets"][s].sum()) == TGT_MASK.sum()


def test_fertility_needs_its_previous_alignment():
    b, _, log_theta, log_dist, log_psi = _tables()
    with pytest.raises(ValueError, match="only draws"):
        al.batch_step(SPEC, jax.random.PRNGKey(0), jnp.asarray(log_theta), jnp.asarray(log_dist),
                      b, B * S1 * T, "expect")
    with pytest.raises(ValueError, match="fertility aligner's"):
        al.batch_step(al.aligner("hmm", null_prior=0.0), jax.random.PRNGKey(0),
                      jnp.asarray(log_theta),
                      jnp.asarray(log_dist[:4]), b, B * S1 * T, "draw",
                      prev=jnp.zeros((B, T), jnp.int32))


# --- mean-field VB -----------------------------------------------------------------------------

def _random_q(seed):
    """A factorized q over each real target word's NULL and real source positions [B, S1, T]."""
    rng = np.random.default_rng(seed)
    q = np.zeros((B, S1, T))
    for r in range(B):
        S, Tr = int(SRC_MASK[r].sum()), int(TGT_MASK[r].sum())
        q[r, :S, :Tr] = rng.dirichlet(np.ones(S), size=Tr).T
    return q


def _mean_field(tables, q_prev):
    b, _, log_theta, log_dist, log_psi = tables
    C = B * S1 * T
    return jax.jit(lambda q: al._fertility_mean_field(
        SPEC, jnp.asarray(log_theta, jnp.float32), jnp.asarray(log_dist, jnp.float32),
        jnp.asarray(log_psi, jnp.float32), b, q, C, None))(jnp.asarray(q_prev, jnp.float32))


def test_mean_field_sets_each_word_to_its_optimum():
    """Each q_j the sweep sets is softmax_i E[log w̃(a) | a_j = i] over the other words' q —
    the words before j at their new q, those after at the previous one — by enumeration."""
    tables = _tables(4)
    _, cell, log_theta, log_dist, log_psi = tables
    q_prev = _random_q(5)
    q_new = np.asarray(_mean_field(tables, q_prev)["probs"], np.float64)
    for r in range(B):
        S, Tr = int(SRC_MASK[r].sum()), int(TGT_MASK[r].sum())
        assert (q_new[r, S:] == 0).all() and (q_new[r, :, Tr:] == 0).all()
        for j in range(Tr):
            q_other = [q_new[r, :S, k] if k < j else q_prev[r, :S, k] for k in range(Tr)]
            expect = np.zeros(S)
            for rest in itertools.product(range(S), repeat=Tr - 1):
                p = np.prod([q_other[k][x] for k, x in zip([k for k in range(Tr) if k != j],
                                                            rest)])
                for i in range(S):
                    a = list(rest[:j]) + [i] + list(rest[j:])
                    expect[i] += p * _log_weight(r, a, cell, log_theta, log_dist, log_psi,
                                                 True)
            want = np.exp(expect - expect.max())
            np.testing.assert_allclose(q_new[r, :S, j], want / want.sum(), atol=2e-5)


def test_mean_field_expectations_and_elbo_term_are_the_enumerated_ones():
    """The sweep's ``loglik`` is E_q[log w̃(a)] + H(q) under the q it returns, and its expected
    cell, bucket and fertility counts are those of that q — every alignment enumerated."""
    tables = _tables(6)
    _, cell, log_theta, log_dist, log_psi = tables
    out = _mean_field(tables, _random_q(7))
    q = np.asarray(out["probs"], np.float64)
    D, F = SPEC.max_jump, SPEC.max_fertility
    elbo, cells = 0.0, np.zeros(B * S1 * T)
    buckets, fert = np.zeros(SPEC.n_buckets), np.zeros((10, SPEC.n_fertility))
    for r in range(B):
        S, Tr = int(SRC_MASK[r].sum()), int(TGT_MASK[r].sum())
        for a in itertools.product(range(S), repeat=Tr):
            p = np.prod([q[r, i, j] for j, i in enumerate(a)])
            elbo += p * (_log_weight(r, a, cell, log_theta, log_dist, log_psi, True)
                         - np.log(p))
            memory = -1
            for j, i in enumerate(a):
                cells[cell[r, i, j]] += p
                if i == 0:
                    buckets[SPEC.null_bucket] += p
                else:
                    buckets[min(max(i - 1 - memory, -D), D) + D] += p
                    memory = i - 1
            for i in range(1, S):
                fert[SRC[r, i], min(sum(1 for x in a if x == i), F)] += p
    np.testing.assert_allclose(float(out["loglik"]), elbo, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(out["expected_cells"]), cells, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out["expected_buckets"]), buckets, atol=1e-5)
    src, dist, real = (np.asarray(x) for x in out["expected_fert"])
    got = np.zeros((10, SPEC.n_fertility))
    np.add.at(got, src[real], dist[real])
    np.testing.assert_allclose(got, fert, atol=1e-5)
