"""MonotonicAlignment (the Markov family's chain marginalized inside one distribution): the
parallel scan = the sequential recursion = brute force over every path, in float64, for
log p(y | x) per token, the marginals, the Viterbi path and posterior draws (chi-square) — both
backends, on ragged batches; and the hmm-exact model through it = the enumerated pyro.markov
sites it replaced (loss and gradients).

Both backends run one definition of the chain (``ppl_attention.structures.monotonic`` on the
library's chain recursion). Each property caught a planted fault (``python tests/plant_faults.py
m1 m2 m3 m4 m5``): m1 torch's banded windows not flipped (j − d + m read as j + d − …) → log Z
wrong, 2 failed; m2 the banded step without max_back → 1 failed; m3 FFBS without the transition
term → chi-square p = 0, 4 failed; m4 the parallel path's per-token likelihood shifted by 1e-7 →
log Z off by more than 1e-9 (JAX), 2 failed; m5 JAX's draw ignoring its logits → draws outside the
support, 4 failed."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pyro
import pytest
import torch
from pyro.infer import TraceEnum_ELBO
from scipy.stats import chisquare

from ppl_attention.numpyro.families import MarkovCategorical as JaxMarkov
from ppl_attention.numpyro.structured import MonotonicAlignment as JaxChain
from ppl_attention.pyro.families import MarkovCategorical
from ppl_attention.pyro.structured import MonotonicAlignment, associative_scan, logmatmulexp

B, T, S = 3, 5, 4
SRC = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]]).bool()
TGT = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]]).bool()


def _chain(max_back, seed=0):
    g = torch.Generator().manual_seed(seed)
    fam = MarkovCategorical(max_jump=2, max_back=max_back).double()
    with torch.no_grad():
        fam.jump_logits.copy_(torch.randn(fam.width, generator=g, dtype=torch.float64))
    scores = torch.randn(B, T, S, generator=g, dtype=torch.float64)
    emis = torch.randn(B, T, S, generator=g, dtype=torch.float64)
    return fam, scores, emis


def _brute(fam, scores, emis):
    """log p(y | x) per row, per-token log-likelihoods, marginals, the best path and every
    path's posterior probability, by enumerating all S^T paths of each row."""
    out = []
    for r in range(B):
        n, s = int(TGT[r].sum()), int(SRC[r].sum())
        paths = {}
        for path in itertools.product(range(s), repeat=n):
            lp, prev = 0.0, None
            for t, j in enumerate(path):
                row = (fam.start_log_probs(scores[r:r + 1, t], SRC[r:r + 1]) if prev is None else
                       fam.transition_log_probs(scores[r:r + 1, t], SRC[r:r + 1],
                                                torch.tensor([prev])))[0]
                lp += float(row[j]) + float(emis[r, t, j])
                prev = j
            if lp > -1e20:
                paths[path] = lp
        log_z = np.logaddexp.reduce(list(paths.values()))
        prefix = []  # log p(y_≤t | x) for the per-token likelihoods
        for t in range(n):
            agg = {}
            for path, lp in paths.items():  # marginalize the suffix's emissions back out
                head = path[: t + 1]
                agg.setdefault(head, []).append(lp - sum(float(emis[r, u, path[u]])
                                                         for u in range(t + 1, n)))
            prefix.append(np.logaddexp.reduce([np.logaddexp.reduce(v) for v in agg.values()]))
        ll = np.diff([0.0, *prefix])
        marg = np.zeros((T, S))
        for path, lp in paths.items():
            for t, j in enumerate(path):
                marg[t, j] += math.exp(lp - log_z)
        best = max(paths, key=paths.get)
        post = {p: math.exp(lp - log_z) for p, lp in paths.items()}
        out.append((log_z, ll, marg, best, post))
    return out


@pytest.mark.parametrize("max_back", [0, 1])
@pytest.mark.parametrize("method", ["sequential", "parallel"])
def test_torch_chain_equals_brute_force(max_back, method):
    fam, scores, emis = _chain(max_back)
    chain = fam.alignment_distribution(scores, SRC, emis, TGT, method=method)
    ref = _brute(fam, scores, emis)
    ll, marg, vit = chain.token_log_likelihood(), chain.marginals(), chain.viterbi()
    draws = chain.sample(3000, torch.Generator().manual_seed(1))
    dense = fam.dense_chain(scores, SRC, emis, TGT)  # the library's chain, dense transitions
    assert torch.allclose(chain.log_partition(), dense.log_partition, atol=1e-9)
    assert torch.allclose(marg, dense.marginals.sum(-2), atol=1e-9)
    for r, (log_z, ll_r, marg_r, best, post) in enumerate(ref):
        n = int(TGT[r].sum())
        assert float(chain.log_partition()[r]) == pytest.approx(log_z, abs=1e-9)
        assert np.allclose(ll[r, :n].detach().numpy(), ll_r, atol=1e-9)
        assert torch.all(ll[r, n:] == 0)
        assert np.allclose(marg[r].numpy(), marg_r, atol=1e-9)
        assert tuple(vit[r, :n].tolist()) == best
        _chi_square([tuple(d) for d in draws[:, r, :n].tolist()], post)
        path = torch.zeros(T, dtype=torch.long)
        path[:n] = torch.tensor(best)
        assert float(chain.log_prob(path.expand(B, T))[r]) == pytest.approx(
            math.log(post[best]), abs=1e-9)


def _chi_square(seen, post):
    keys = sorted(post, key=lambda k: -post[k])
    counts = np.array([seen.count(k) for k in keys])
    assert counts.sum() == len(seen)  # no draw outside the support
    expected = np.array([post[k] for k in keys]) * len(seen)
    big = expected > 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    assert chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue > 1e-3


@pytest.mark.parametrize("max_back", [0, 1])
@pytest.mark.parametrize("method", ["sequential", "parallel"])
def test_jax_chain_equals_brute_force(max_back, method):
    fam, scores, emis = _chain(max_back)
    ref = _brute(fam, scores, emis)
    jfam = JaxMarkov(max_jump=2, max_back=max_back)
    with jax.enable_x64(True):
        params = {"jump_logits": jnp.asarray(fam.jump_logits.detach().numpy())}

        @jax.jit  # one compilation for every operation (each eager lax.scan compiles its own)
        def operations(sc, src, em, tgt, params, key):
            chain = jfam.alignment_distribution(sc, src, em, tgt, params, method=method)
            return (chain.token_log_likelihood(), chain.marginals(), chain.viterbi(),
                    chain.sample(key, 3000), chain.log_partition())

        ll, marg, vit, draws, log_z = map(np.asarray, operations(
            jnp.asarray(scores.numpy()), jnp.asarray(SRC.numpy()), jnp.asarray(emis.numpy()),
            jnp.asarray(TGT.numpy()), params, jax.random.PRNGKey(0)))
        dense = jfam.dense_chain(jnp.asarray(scores.numpy()), jnp.asarray(SRC.numpy()),
                                 jnp.asarray(emis.numpy()), jnp.asarray(TGT.numpy()), params)
        dense_z, dense_marg = np.asarray(dense.log_partition), np.asarray(dense.marginals)
    assert ll.dtype == np.float64
    np.testing.assert_allclose(dense_z, log_z, atol=1e-9)  # the library's chain, dense
    np.testing.assert_allclose(dense_marg.sum(-2), marg, atol=1e-9)
    for r, (lz, ll_r, marg_r, best, post) in enumerate(ref):
        n = int(TGT[r].sum())
        assert log_z[r] == pytest.approx(lz, abs=1e-9)
        assert np.allclose(ll[r, :n], ll_r, atol=1e-9) and np.all(ll[r, n:] == 0)
        assert np.allclose(marg[r], marg_r, atol=1e-9)
        assert tuple(vit[r, :n].tolist()) == best
        _chi_square([tuple(d) for d in draws[:, r, :n].tolist()], post)


def test_the_associative_scan_is_the_sequential_product():
    """Prefix products by the odd/even scan = the left-to-right products, for odd and even
    lengths (a planted off-by-one in the recursion's odd case fails here)."""
    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 5, 8, 13):
        m = torch.randn(2, n, 3, 3, generator=g, dtype=torch.float64)
        out = associative_scan(logmatmulexp, m, 1)
        acc = m[:, 0]
        for t in range(n):
            if t:
                acc = logmatmulexp(acc, m[:, t])
            assert torch.allclose(out[:, t], acc, atol=1e-12)


def test_hmm_exact_through_the_chain_equals_the_enumerated_sites():
    """The hmm-exact model (the chain summed out in MonotonicAlignment) gives TraceEnum_ELBO the
    loss and gradients of the T sequential enumerated pyro.markov sites it replaced."""
    from ppl_attention.data import Vocab, make_batches, make_task
    from ppl_attention.pyro.inference import get_method
    from ppl_attention.pyro.models import Seq2SeqAlignment

    task = make_task("reorder", n_train=10, n_eval=2, seed=0, min_len=3, max_len=6)
    sv = Vocab.build(s for s, _ in task.train.pairs)
    tv = Vocab.build(t for _, t in task.train.pairs)
    torch.manual_seed(0)
    model = Seq2SeqAlignment(len(sv), len(tv), hidden=8,
                             family=get_method("hmm-exact").family()).double()
    with torch.no_grad():
        model.family.jump_logits.normal_()
    (b,) = make_batches(task.train.pairs[:6], sv, tv, 6)
    grads = []
    for fn in (model.model, model.markov_model_enumerated):
        pyro.clear_param_store()
        model.zero_grad()
        loss = TraceEnum_ELBO(max_plate_nesting=2).differentiable_loss(
            lambda bb, fn=fn: fn(bb, enumerate_z=True), lambda bb: None, b)
        loss.backward()
        grads.append((float(loss), [torch.zeros_like(p) if p.grad is None else p.grad.clone()
                                    for p in model.parameters()]))
    (l1, g1), (l2, g2) = grads
    assert l1 == pytest.approx(l2, rel=1e-10)
    for a, c in zip(g1, g2):
        assert torch.allclose(a, c, atol=1e-10)


def test_bad_shapes_and_methods_are_refused():
    from ppl_attention.core.errors import UserError

    with pytest.raises(UserError, match="auto, sequential or parallel"):
        MonotonicAlignment(torch.zeros(1, 2), torch.zeros(1, 3, 2, 2), torch.zeros(1, 3, 2),
                           torch.ones(1, 3, dtype=torch.bool), method="fast")
    with pytest.raises(UserError, match="do not agree"):
        MonotonicAlignment(torch.zeros(1, 3), torch.zeros(1, 3, 2, 2), torch.zeros(1, 3, 2),
                           torch.ones(1, 3, dtype=torch.bool))
    with pytest.raises(UserError, match="auto, sequential or parallel"):
        JaxChain(jnp.zeros((1, 2)), jnp.zeros((1, 3, 2, 2)), jnp.zeros((1, 3, 2)),
                 jnp.ones((1, 3), bool), method="fast")
    with pytest.raises(UserError, match="do not agree"):
        JaxChain(jnp.zeros((1, 3)), jnp.zeros((1, 3, 2, 2)), jnp.zeros((1, 3, 2)),
                 jnp.ones((1, 3), bool))


def test_paths_with_leading_dimensions_score_alike_on_both_backends():
    """``score`` / ``log_prob`` of paths ``[..., B, T]`` on both backends (the NumPyro side
    took ``[B, T]`` only before the chain was written once), equal to the rows scored one by
    one."""
    fam, scores, emis = _chain(1)
    chain = fam.alignment_distribution(scores, SRC, emis, TGT, method="sequential")
    z = chain.sample(6, torch.Generator().manual_seed(2)).view(2, 3, B, T)
    lp = chain.log_prob(z)
    assert lp.shape == (2, 3, B)
    for a in range(2):
        for c in range(3):
            assert torch.allclose(lp[a, c], chain.log_prob(z[a, c]), atol=1e-12)
    jfam = JaxMarkov(max_jump=2, max_back=1)
    with jax.enable_x64(True):
        params = {"jump_logits": jnp.asarray(fam.jump_logits.detach().numpy())}
        jchain = jfam.alignment_distribution(jnp.asarray(scores.numpy()),
                                             jnp.asarray(SRC.numpy()), jnp.asarray(emis.numpy()),
                                             jnp.asarray(TGT.numpy()), params)
        jlp = np.asarray(jchain.log_prob(jnp.asarray(z.numpy())))
    np.testing.assert_allclose(jlp, lp.detach().numpy(), atol=1e-9)
