"""MarkovCategorical (hard monotonic / HMM attention): the forward algorithm and Pyro's
TraceEnum_ELBO over sequential pyro.markov sites against brute force over all alignment paths."""

import itertools
import math

import pyro
import pytest
import torch
from pyro.infer import TraceEnum_ELBO

from ppl_attention.data import Vocab, make_batches
from ppl_attention.pyro.families import MarkovCategorical
from ppl_attention.pyro.inference import Run, evaluate, get_method
from ppl_attention.pyro.models import Seq2SeqAlignment

PAIRS = [(["a", "b", "c"], ["A", "B"]), (["b", "c"], ["C", "B", "A"]), (["c", "a", "b", "a"],
                                                                         ["B"])]


def _model(max_back=0, seed=0):
    sv = Vocab.build(s for s, _ in PAIRS)
    tv = Vocab.build(t for _, t in PAIRS)
    torch.manual_seed(seed)
    fam = MarkovCategorical(max_jump=2, max_back=max_back)
    with torch.no_grad():
        fam.jump_logits.normal_()
    m = Seq2SeqAlignment(len(sv), len(tv), hidden=6, family=fam).double()
    m.eval()
    return m, sv, tv


@pytest.mark.parametrize("max_back", [0, 1])
def test_forward_algorithm_and_trace_enum_equal_brute_force(max_back):
    model, sv, tv = _model(max_back)
    (b,) = make_batches(PAIRS, sv, tv, 3)  # a padded batch
    with torch.no_grad():
        ll = model.exact_token_log_likelihood(b)
        post = model.exact_posterior(b)
        H = model.encode(b.src, b.src_mask)
        h, e, _ = model.decode(H, b.src_mask, b.tgt_in)
        _, emis = model.prior_and_emissions(b)
        fam = model.family
        for r in range(3):
            S, T = int(b.src_mask[r].sum()), int(b.tgt_mask[r].sum())
            total = -math.inf
            marg = torch.zeros(T, S, dtype=torch.double)
            paths = []
            for path in itertools.product(range(S), repeat=T):
                lp = float(fam.start_log_probs(e[r:r + 1, 0], b.src_mask[r:r + 1])[0, path[0]])
                for t in range(1, T):
                    row = fam.transition_log_probs(e[r:r + 1, t], b.src_mask[r:r + 1],
                                                   torch.tensor([path[t - 1]]))
                    lp += float(row[0, path[t]])
                lp += sum(float(emis[r, t, path[t]]) for t in range(T))
                paths.append((path, lp))
                total = max(total, lp) + math.log1p(math.exp(-abs(total - lp))) \
                    if total > -math.inf else lp
            assert float(ll[r].sum()) == pytest.approx(total, abs=1e-6)
            for path, lp in paths:
                for t in range(T):
                    marg[t, path[t]] += math.exp(lp - total)
            assert torch.allclose(post[r, :T, :S], marg, atol=1e-8)
            if max_back == 0:  # monotonic: no path with a backward step has mass
                assert all(lp == -math.inf for path, lp in paths
                           if any(path[t] < path[t - 1] for t in range(1, T)))
    pyro.clear_param_store()
    with torch.no_grad():
        loss = TraceEnum_ELBO(max_plate_nesting=2).loss(
            lambda bb: model.model(bb, enumerate_z=True), lambda bb: None, b)
    assert loss == pytest.approx(-float(ll.sum()), rel=1e-9)


def test_hmm_exact_method_trains_and_evaluates_exactly():
    model, sv, tv = _model()
    m = get_method("hmm-exact")
    assert isinstance(m.family(6), MarkovCategorical)
    run = Run(model.float(), "hmm-exact", sv, tv)
    batches = make_batches(PAIRS, sv, tv, 3)
    report = evaluate(run, batches)
    assert report["exact"] and report["nll_per_token"] == pytest.approx(
        -float(model.exact_token_log_likelihood(batches[0]).sum().detach()) / batches[0].n_tokens,
        rel=1e-5)


def test_bad_arguments():
    with pytest.raises(ValueError, match="max_jump"):
        MarkovCategorical(max_jump=0)
    with pytest.raises(ValueError, match="max_back"):
        MarkovCategorical(max_back=-1)
    with pytest.raises(ValueError, match="no vectorized prior"):
        MarkovCategorical().prior(None, None, None, None)


def test_markov_beam_scores_are_the_exact_sequence_log_likelihood():
    """The decoder's running score of its best hypothesis equals the forward algorithm's
    log p(y | x) of that output (filters carried per hypothesis are exact)."""
    from ppl_attention.pyro.inference.decode import beam_search

    model, sv, tv = _model()
    run = Run(model, "hmm-exact", sv, tv)
    checked = 0
    for src, _ in PAIRS:
        for beam in (1, 3):
            hyp, score = beam_search(run, src, beam=beam, max_len=6)
            (b,) = make_batches([(src, hyp)], sv, tv, 1)
            with torch.no_grad():
                ll = model.exact_token_log_likelihood(b)[0]
            if len(hyp) == 6:  # cut at max_len: no <eos> term in the score
                assert score == pytest.approx(float(ll[:6].sum()), abs=1e-6)
            else:
                assert score == pytest.approx(float(ll.sum()), abs=1e-6)
            checked += 1
    assert checked == 6


@pytest.mark.parametrize("max_back", [0, 1])
def test_numpyro_mirror_equals_pyro_on_the_same_weights(max_back):
    """NumPyro's MarkovCategorical: the forward scan, the forward–backward marginals, the
    enumerated ``scan`` model's log density (funsor) and the hmm-exact training gradient equal
    the Pyro side's on the same weights, on a batch padded in rows and positions."""
    import functools

    import jax
    import numpy as np
    from numpyro import handlers
    from numpyro.contrib.funsor import enum, log_density

    from ppl_attention.numpyro.inference.fit import make_loss
    from ppl_attention.numpyro.jax_batches import to_jax
    from ppl_attention.numpyro.models import Seq2SeqAlignment as JaxModel

    model, sv, tv = _model(max_back)
    model = model.float()
    (b,) = make_batches(PAIRS, sv, tv, 3)
    B, S = b.src.shape
    T = b.tgt_out.shape[1]
    jb = to_jax(b, 5, 4)
    jm, p = JaxModel.from_torch(model)
    with torch.no_grad():
        ll_t = model.exact_token_log_likelihood(b).sum(-1).numpy()
        post_t = model.exact_posterior(b).numpy()
    ll_j = np.asarray(jax.jit(jm.exact_token_log_likelihood_of)(p, jb).sum(-1))
    assert np.allclose(ll_j[:B], ll_t, rtol=1e-5) and np.all(ll_j[B:] == 0)
    post_j = np.asarray(jax.jit(jm.exact_posterior_of)(p, jb))
    assert np.allclose(post_j[:B, :T, :S], post_t, atol=1e-5)
    assert np.all(post_j[:B, :, S:] == 0) and np.all(post_j[B:] == 0)

    def enumerated_log_density(params):
        mdl = handlers.substitute(functools.partial(jm.model, enumerate_z=True),
                                  data={"seq2seq": params})
        return log_density(enum(mdl, first_available_dim=-3), (jb,), {}, {})[0]

    assert float(enumerated_log_density(p)) == pytest.approx(float(ll_t.sum()), rel=1e-5)

    pyro.clear_param_store()
    model.zero_grad()
    loss_t = TraceEnum_ELBO(max_plate_nesting=2).loss_and_grads(
        lambda bb: model.model(bb, enumerate_z=True), lambda bb: None, b)
    loss = make_loss(jm, "hmm-exact", site=jm.param_name)
    loss_j, grads = jax.value_and_grad(lambda pp: loss(pp, jax.random.PRNGKey(0), jb, 1.0)[0])(p)
    assert float(loss_j) == pytest.approx(loss_t, rel=1e-5)
    for name, par in model.named_parameters():
        if name.startswith("q_"):  # the unused inference network
            continue
        g_t = par.grad.numpy() if par.grad is not None else np.zeros(par.shape)
        assert np.allclose(np.asarray(grads[name]), g_t, atol=1e-5), name
