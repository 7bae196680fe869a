"""DependencyTree on both backends against brute-force enumeration of every tree (N ≤ 6, float64,
projective and not, one root or several, ragged lengths), the two backends against each other in
float32, exact sampling by a chi-square test, torch-struct where it is installed, and every bad
input refused.

Planted faults (``python tests/plant_faults.py t1 t2 t3 t4 t5``), each caught by this module:
Eisner's recursion is one definition for both backends (``ppl_attention.structures.eisner``).
t1 — torch's sampling semiring with its Gumbel noise halved (draws biased toward likely trees):
caught by
``test_exact_draws_pass_chi_square[pyro-projective-single]`` and its multi-root twin;
t2 — the non-projective sequential draw skips conditioning on the drawn heads: caught by
``test_exact_draws_pass_chi_square[pyro-nonprojective-*]``; t3 — the NumPyro matrix-tree
Laplacian without its first-row replacement: caught by ``test_equals_brute_force[numpyro-*]``;
t4 — Eisner's incomplete items with the arc direction swapped: caught by
``test_equals_brute_force[*-projective-*]`` on both backends (4 failed); t5 — the NumPyro
log-determinant's derivative taking x⁻¹ untransposed: caught by
``test_numpyro_marginals_are_differentiable_in_both_modes``; s10 — the PyTorch full-row
Laplacian summing the self-arcs in and subtracting them again (exact in real arithmetic, not
in float32): caught by ``test_float32_when_the_root_scores_dominate``.
"""

import jax
import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from ppl_attention.core.errors import UserError
from ppl_attention.core.heads import (
    attachment_score,
    chu_liu_edmonds,
    conll_heads,
    enumerate_trees,
    is_projective,
    parse_conll_heads,
    tree_problem,
)
from ppl_attention.numpyro.trees import DependencyTree as JaxTree
from ppl_attention.pyro.trees import DependencyTree, heads_to_arcs

jax.config.update("jax_enable_x64", True)

KINDS = [(True, True), (True, False), (False, True), (False, False)]
KIND_IDS = ["projective-single", "projective-multi", "nonprojective-single",
            "nonprojective-multi"]


def _brute(scores: np.ndarray, L: int, projective: bool, single_root: bool):
    """log Z, marginals, entropy, the MAP tree and every tree's log-probability by enumeration."""
    N = scores.shape[-1]
    trees = enumerate_trees(L, N, projective=projective, single_root=single_root)
    real = np.arange(N) < L
    sc = np.array([sum(scores[t[m], m] for m in range(L)) for t in trees])
    log_z = np.logaddexp.reduce(sc)
    p = np.exp(sc - log_z)
    arcs = np.zeros((len(trees), N, N))
    for k, t in enumerate(trees):
        for m in range(L):
            arcs[k, t[m], m] = 1.0
    mu = (p[:, None, None] * arcs).sum(0)
    mu[~real] = 0
    mu[:, ~real] = 0
    return dict(log_z=log_z, mu=mu, entropy=-(p * np.log(p)).sum(), best=trees[sc.argmax()],
                trees=trees, log_p=sc - log_z)


def _scores(rng, B=3, N=6):
    return rng.normal(size=(B, N, N)) * 1.5


class _Torch:
    name = "pyro"

    @staticmethod
    def make(scores, lengths, **kind):
        return DependencyTree(torch.tensor(scores), torch.tensor(lengths), **kind)

    @staticmethod
    def np(x):
        return x.detach().cpu().numpy()

    @staticmethod
    def kl(p, q):
        return torch.distributions.kl_divergence(p, q)

    @staticmethod
    def sample(d, n, seed):
        torch.manual_seed(seed)
        return d.sample((n,)).numpy()

    @staticmethod
    def log_prob(d, heads):
        return d.log_prob(torch.as_tensor(heads))


class _Jax:
    name = "numpyro"

    @staticmethod
    def make(scores, lengths, **kind):
        import jax.numpy as jnp

        return JaxTree(jnp.asarray(scores), jnp.asarray(lengths), **kind)

    @staticmethod
    def np(x):
        return np.asarray(x)

    @staticmethod
    def kl(p, q):
        from numpyro.distributions.kl import kl_divergence

        return kl_divergence(p, q)

    @staticmethod
    def sample(d, n, seed):
        return np.asarray(jax.jit(lambda k: d.sample(k, (n,)))(jax.random.PRNGKey(seed)))

    @staticmethod
    def log_prob(d, heads):
        import jax.numpy as jnp

        return d.log_prob(jnp.asarray(heads))


BACKENDS = [_Torch, _Jax]


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_equals_brute_force(backend, kind):
    torch.set_default_dtype(torch.float64)
    try:
        projective, single_root = kind
        rng = np.random.default_rng(7)
        s, s2 = _scores(rng), _scores(rng)
        lengths = np.array([6, 4, 1])
        d = backend.make(s, lengths, projective=projective, single_root=single_root)
        q = backend.make(s2, lengths, projective=projective, single_root=single_root)
        log_z, mu, ent = (backend.np(x) for x in (d.log_partition, d.marginals, d.entropy()))
        kl = backend.np(backend.kl(d, q))
        best = backend.np(d.argmax())
        for b, L in enumerate(lengths):
            ref = _brute(s[b], L, projective, single_root)
            ref_q = _brute(s2[b], L, projective, single_root)
            assert abs(log_z[b] - ref["log_z"]) < 1e-9
            np.testing.assert_allclose(mu[b], ref["mu"], atol=1e-9)
            assert abs(ent[b] - ref["entropy"]) < 1e-9
            p = np.exp(ref["log_p"])
            assert abs(kl[b] - (p * (ref["log_p"] - ref_q["log_p"])).sum()) < 1e-9
            np.testing.assert_array_equal(best[b], ref["best"])
            heads = _with_fixed_rows(lengths, b, ref["trees"])
            lp = backend.np(backend.log_prob(d, heads))[:, b]
            np.testing.assert_allclose(lp, ref["log_p"], atol=1e-9)
            # every real column sums to one, padding is exactly zero
            np.testing.assert_allclose(mu[b].sum(0)[:L], 1.0, atol=1e-9)
            assert (mu[b][L:] == 0).all() and (mu[b][:, L:] == 0).all()
    finally:
        torch.set_default_dtype(torch.float32)


def _with_fixed_rows(lengths, row, trees):
    """Heads ``[n, B, N]``: row ``row`` runs through ``trees``, every other row holds a fixed
    tree of its own length (word 0 heading the rest: projective, one root)."""
    n, N = trees.shape
    out = np.empty((n, len(lengths), N), np.int64)
    for r, L in enumerate(lengths):
        fixed = np.arange(N)
        fixed[1:L] = 0
        out[:, r] = trees if r == row else fixed
    return out


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_backends_agree_in_float32(kind):
    projective, single_root = kind
    rng = np.random.default_rng(3)
    s = rng.normal(size=(4, 12, 12)).astype(np.float32) * 2
    lengths = np.array([12, 9, 5, 1])
    t = _Torch.make(s, lengths, projective=projective, single_root=single_root)
    import jax.numpy as jnp

    j = JaxTree(jnp.asarray(s, jnp.float32), jnp.asarray(lengths), projective=projective,
                single_root=single_root)
    for a, b in ((t.log_partition, j.log_partition), (t.marginals, j.marginals),
                 (t.entropy(), j.entropy())):
        a, b = a.detach().numpy(), np.asarray(b)
        assert np.abs(a - b).max() <= 1e-5 * max(1.0, np.abs(a).max())
    np.testing.assert_array_equal(t.argmax().numpy(), np.asarray(j.argmax()))


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_exact_draws_pass_chi_square(backend, kind):
    projective, single_root = kind
    N, n = 4, 20_000
    rng = np.random.default_rng(11)
    s = rng.normal(size=(N, N)) * 1.2
    d = backend.make(s, np.array(N), projective=projective, single_root=single_root)
    trees = enumerate_trees(N, projective=projective, single_root=single_root)
    p = np.exp(backend.np(backend.log_prob(d, trees)))
    x = backend.sample(d, n, seed=5).reshape(n, N)
    code = (x * N ** np.arange(N)).sum(-1)
    counts = np.array([(code == c).sum() for c in (trees * N ** np.arange(N)).sum(-1)])
    assert counts.sum() == n  # every draw is a tree of this kind
    assert chisquare(counts, p * n).pvalue > 1e-3


def test_float32_at_64_words_both_kinds():
    rng = np.random.default_rng(0)
    s = rng.normal(size=(2, 64, 64)) * 3
    for projective in (True, False):
        d32 = DependencyTree(torch.tensor(s, dtype=torch.float32), projective=projective)
        d64 = DependencyTree(torch.tensor(s, dtype=torch.float64), projective=projective)
        rel = ((d32.log_partition.double() - d64.log_partition) / d64.log_partition).abs()
        assert rel.max() < 1e-5
        assert (d32.marginals.double() - d64.marginals).abs().max() < 1e-3
        assert torch.isfinite(d32.marginals).all()


def test_float32_when_the_root_scores_dominate():
    """Non-projective log Z and marginals in float32 where every word's root score dwarfs its
    arcs' (e^20 against e^±1): the Laplacian's diagonal sums the arcs alone, so nothing cancels
    against the root's weight (planted fault s10: self-arcs summed in, then subtracted)."""
    rng = np.random.default_rng(0)
    s = rng.normal(size=(3, 8, 8))
    s[:, np.arange(8), np.arange(8)] = 20.0
    for single_root in (True, False):
        d32 = DependencyTree(torch.tensor(s, dtype=torch.float32), projective=False,
                             single_root=single_root)
        d64 = DependencyTree(torch.tensor(s), projective=False, single_root=single_root)
        assert (d32.log_partition.double() - d64.log_partition).abs().max() < 1e-4
        assert (d32.marginals.double() - d64.marginals).abs().max() < 1e-4
        j32 = JaxTree(np.asarray(s, np.float32), projective=False, single_root=single_root)
        assert np.abs(np.asarray(j32.log_partition, np.float64)
                      - d64.log_partition.numpy()).max() < 1e-4


def test_marginals_are_differentiable_end_to_end():
    """The structured attention backpropagates through the marginals: d/dθ of Σ w·μ matches
    finite differences."""
    torch.set_default_dtype(torch.float64)
    try:
        g = torch.Generator().manual_seed(0)
        s = torch.randn(5, 5, generator=g, dtype=torch.float64, requires_grad=True)
        w = torch.randn(5, 5, generator=g, dtype=torch.float64)
        for projective in (True, False):
            f = lambda x: (DependencyTree(x, projective=projective).marginals * w).sum()  # noqa
            assert torch.autograd.gradcheck(f, (s,), eps=1e-6, atol=1e-6)
    finally:
        torch.set_default_dtype(torch.float32)


def test_numpyro_marginals_are_differentiable_in_both_modes():
    """The NumPyro log-determinant carries its own derivative rule (one LU for the value and the
    inverse): log Z's derivatives to second order, forward and reverse, against finite
    differences; and the rule's value and tangent equal ``jnp.linalg.slogdet``'s, a negative
    determinant included."""
    import jax.numpy as jnp
    from jax.test_util import check_grads

    from ppl_attention.numpyro.trees import log_abs_det

    s = jnp.asarray(np.random.default_rng(0).normal(size=(2, 5, 5)))
    for single_root in (True, False):
        def log_z(x, single_root=single_root):
            return JaxTree(x, projective=False, single_root=single_root).log_partition.sum()
        check_grads(log_z, (s,), order=2, modes=("fwd", "rev"), eps=1e-5)
    x = jnp.asarray(np.random.default_rng(1).normal(size=(3, 4, 4)))
    dx = jnp.asarray(np.random.default_rng(2).normal(size=(3, 4, 4)))
    assert (jnp.linalg.det(x) < 0).any()
    ours = jax.jvp(log_abs_det, (x,), (dx,))
    theirs = jax.jvp(lambda a: jnp.linalg.slogdet(a)[1], (x,), (dx,))
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-10)
    np.testing.assert_allclose(ours[1], theirs[1], rtol=1e-8)


def test_pyro_sample_site_and_expand():
    import pyro

    s = torch.randn(3, 1, 5, 5)
    d = DependencyTree(s, torch.tensor([5, 3, 2]).view(3, 1))
    with pyro.plate("batch", 3, dim=-2):
        z = pyro.sample("tree", d)
    assert z.shape == (3, 1, 5)
    e = d.expand((3, 4))
    assert e.batch_shape == (3, 4)
    assert torch.allclose(e.log_partition, d.log_partition.expand(3, 4))
    assert torch.allclose(e.log_prob(z.expand(3, 4, 5)), d.log_prob(z).expand(3, 4))


def test_tree_checks_and_helpers():
    assert tree_problem([0, 0, 1], 3, projective=True, single_root=True) is None
    assert "cycle" in tree_problem([1, 2, 0], 3, projective=False, single_root=False)
    assert "root" in tree_problem([0, 1, 2], 3, projective=False, single_root=True)
    assert "projective" in tree_problem([2, 0, 2, 0], 4, projective=True, single_root=True)
    assert "outside" in tree_problem([0, 5, 0], 3, projective=False, single_root=True)
    assert "padded" in tree_problem([0, 0, 1, 0], 3, projective=False, single_root=True)
    assert not is_projective([2, 0, 2, 0]) and is_projective([0, 0, 1, 2])
    # counts: projective single-root trees of n words are 1, 2, 7, 30, 143; all trees n^(n−1)
    assert [len(enumerate_trees(n)) for n in range(1, 6)] == [1, 2, 7, 30, 143]
    assert len(enumerate_trees(5, projective=False)) == 5 ** 4
    assert len(enumerate_trees(4, projective=False, single_root=False)) == 5 ** 3
    heads = [1, 1, 1, 2]
    assert conll_heads(heads, 4) == [2, 0, 2, 3]
    assert parse_conll_heads([2, 0, 2, 3]) == heads
    assert attachment_score([[1, 1, 1]], [[1, 1, 0]]) == pytest.approx(2 / 3)


def test_chu_liu_edmonds_is_the_best_tree():
    rng = np.random.default_rng(2)
    for _ in range(20):
        N = int(rng.integers(2, 7))
        s = rng.normal(size=(N, N)) * 2
        for single in (True, False):
            trees = enumerate_trees(N, projective=False, single_root=single)
            sc = [sum(s[t[m], m] for m in range(N)) for t in trees]
            best = chu_liu_edmonds(s, N, single_root=single)
            assert tree_problem(best, N, projective=False, single_root=single) is None
            assert sum(s[best[m], m] for m in range(N)) == pytest.approx(max(sc))


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
def test_bad_inputs_are_refused(backend):
    rng = np.random.default_rng(0)
    s = rng.normal(size=(2, 4, 4))
    with pytest.raises(UserError, match="square"):
        backend.make(rng.normal(size=(2, 4, 3)), np.array([4, 4]))
    with pytest.raises(UserError, match="length"):
        backend.make(s, np.array([0, 4]))
    with pytest.raises(UserError, match="length"):
        backend.make(s, np.array([5, 4]))
    bad = s.copy()
    bad[1, 0, 1] = np.nan
    with pytest.raises(UserError, match="finite"):
        backend.make(bad, np.array([4, 4]))
    bad[1, 0, 1] = 0.0
    bad[1, 3, 3] = np.inf  # a padded arc of a row of length 3: ignored
    d = backend.make(bad, np.array([4, 3]))
    assert np.isfinite(backend.np(d.log_partition)).all()
    d = backend.make(s, np.array([4, 3]))
    for heads, what in (([[1, 2, 0, 3], [0, 0, 0, 3]], "cycle"),
                        ([[0, 1, 1, 1], [0, 0, 0, 3]], "root"),
                        ([[0, 0, 0, 0], [0, 3, 0, 3]], "outside"),
                        ([[2, 1, 1, 1], [0, 0, 0, 3]], "projective")):
        with pytest.raises(UserError, match=what):
            backend.log_prob(d, np.array(heads))
    with pytest.raises(UserError, match="same"):
        backend.kl(backend.make(s, np.array([4, 3])), backend.make(s, np.array([4, 4])))


def test_same_as_torch_struct_at_32_words():
    torch_struct = pytest.importorskip("torch_struct")
    rng = np.random.default_rng(4)
    s = torch.tensor(rng.normal(size=(4, 32, 32)), dtype=torch.float64)
    lengths = torch.tensor([32, 30, 17, 9])
    ours = DependencyTree(s, lengths, single_root=False)
    theirs = torch_struct.DependencyCRF(s.clone().requires_grad_(True), lengths=lengths)
    assert torch.allclose(ours.log_partition, theirs.partition, rtol=1e-5)
    assert torch.allclose(ours.marginals, theirs.marginals, rtol=1e-5, atol=1e-12)
    # torch-struct's non-projective CRF adds 1e-5 to every arc weight (its log Z is biased by
    # about that much): compare with its matrix-tree functions at eps = 0
    from torch_struct.deptree import deptree_nonproj, deptree_part

    nonproj = DependencyTree(s, lengths, projective=False)
    log_z = deptree_part(s, False, lengths, eps=0.0)
    assert torch.allclose(nonproj.log_partition, log_z, rtol=1e-5)
    assert torch.allclose(nonproj.marginals, deptree_nonproj(s, False, lengths, eps=0.0),
                          atol=1e-5)


def test_heads_to_arcs():
    arcs = heads_to_arcs(torch.tensor([1, 1, 0]))
    assert arcs.tolist() == [[0, 0, 1], [1, 1, 0], [0, 0, 0]]
