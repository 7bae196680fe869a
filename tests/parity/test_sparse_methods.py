"""The sparse and relaxed methods on a model, both backends: ``sparse-marginal``'s loss is the
exact Σ_j q_j [log p(y, z = j | x) − log q_j] with q = sparsemax of the guide's scores — equal to
enumerating every position when the support is full, and summed over the support only when it
is not (Pyro enumerates the support's positions alone) —, its ELBO below the exact
log-likelihood; the families with exact zeros (sparsemax, α-entmax) give masked positions
exactly 0; the method options, the families a method trains and SparseMAP's structure are
checked before any work.

Planted fault shown caught once (sm2): ``SparsemaxCategorical.enumerate_support`` keeping one
position less than the largest support (``topk(k - 1)``) — ``test_sparse_marginal_is_exact``
fails under Pyro (the loss then misses the support's last position).
"""

import math

import jax
import numpy as np
import pyro
import pytest
import torch

from ppl_attention.core.errors import UserError
from ppl_attention.data import Vocab, make_batches, make_task
from ppl_attention.numpyro.inference.fit import make_loss
from ppl_attention.numpyro.jax_batches import to_jax
from ppl_attention.numpyro.models import Seq2SeqAlignment as JaxModel
from ppl_attention.pyro.inference import fit, get_method
from ppl_attention.pyro.inference.methods import differentiable_loss
from ppl_attention.pyro.models import Seq2SeqAlignment
from ppl_attention.structures import torch_ops
from ppl_attention.structures.entmax import sparsemax

TASK = make_task("reorder", n_train=12, n_eval=2, seed=3, min_len=3, max_len=6)
SV = Vocab.build(s for s, _ in TASK.train.pairs)
TV = Vocab.build(t for _, t in TASK.train.pairs)


def _model(method, scale: float, dtype=torch.float64):
    torch.manual_seed(0)
    m = Seq2SeqAlignment(len(SV), len(TV), hidden=8, family=get_method(method).family())
    with torch.no_grad():  # the guide's scores small (a full support) or large (a sparse one)
        m.q_score.W.weight.mul_(scale)
        m.score.v.weight.mul_(scale)
    return m.to(dtype)


def _batch():
    (b,) = make_batches(TASK.train.pairs[:6], SV, TV, 6)
    return b


def _enumerated_elbo(model, b, posterior="inference"):
    """Σ_{b,t} Σ_j q_j [log p(y_t | z = j) + log p(z = j) − log q_j] with q = sparsemax of the
    guide's scores, every position written out."""
    log_prior, emis = model.prior_and_emissions(b)
    H = model.encode(b.src, b.src_mask)
    scores = model.inference_scores(b, H) if posterior == "inference" else \
        model.decode(H, b.src_mask, b.tgt_in)[1]
    mask = b.src_mask[:, None].expand(scores.shape)
    q = sparsemax(torch_ops, scores, mask)
    logq = torch.where(q > 0, q.clamp_min(1e-300).log(), torch.zeros_like(q))
    terms = torch.where(q > 0, q * (emis + log_prior.clamp(min=-1e30) - logq),
                        torch.zeros_like(q)).sum(-1)
    return terms.masked_fill(~b.tgt_mask, 0).sum(), q


@pytest.mark.parametrize("scale", [0.01, 30.0])  # a full support, then a sparse one
@pytest.mark.parametrize("method", ["sparse-marginal", "hard-sparse"])
def test_sparse_marginal_is_exact(method, scale):
    model, b = _model(method, scale), _batch()
    m = get_method(method)
    posterior = m.posterior
    ref, q = _enumerated_elbo(model, b, posterior)
    support = (q > 0).sum(-1)[b.tgt_mask]
    if scale < 1:
        assert bool((support == b.src_mask.sum(-1)[:, None].expand(q.shape[:2])[b.tgt_mask])
                    .all())  # full: every real position
    else:
        assert float(support.float().mean()) < b.src.shape[1] - 1  # sparse
    pyro.clear_param_store()
    loss, surrogate = differentiable_loss(m, m.elbo(), model, b, 0, 1.0)
    assert -loss == pytest.approx(float(ref), rel=1e-9)
    model.zero_grad()
    surrogate.backward()
    g = [p.grad.clone() if p.grad is not None else torch.zeros_like(p)
         for p in model.parameters()]
    model.zero_grad()
    (-_enumerated_elbo(model, b, posterior)[0]).backward()
    for a, r in zip(g, model.parameters()):
        np.testing.assert_allclose(a.numpy(), (r.grad if r.grad is not None
                                               else torch.zeros_like(r)).numpy(),
                                   rtol=1e-7, atol=1e-10)
    # the ELBO is below the exact log-likelihood
    log_lik = float(model.exact_token_log_likelihood(b).sum())
    assert float(ref) <= log_lik + 1e-9
    # NumPyro: the same loss on the same weights (every position enumerated, zeros exact)
    jm, params = JaxModel.from_torch(_model(method, scale, torch.float32))
    jloss = make_loss(jm, method, site=jm.param_name)
    value = float(jax.jit(lambda p: jloss(p, jax.random.PRNGKey(0), to_jax(b), 1.0)[1])(params))
    assert value == pytest.approx(loss, rel=1e-4)


def test_sparse_weights_are_zero_on_padding():
    from ppl_attention.pyro.attend import recording

    for method in ("sparsemax", "entmax"):
        model, b = _model(method, 5.0), _batch()
        with recording() as calls:
            model.model(b)
        w = calls[0].weights
        assert torch.all(w.masked_select(~b.src_mask[:, None].expand(w.shape)) == 0)
        assert torch.allclose(w.sum(-1), torch.ones_like(w.sum(-1)), atol=1e-6)
        assert bool((w == 0).any() & (w > 0).all(-1).logical_not().any())  # exact zeros


def test_options_refused_before_any_work(tmp_path, capsys):
    from ppl_attention.cli import main

    cases = [(["--method", "tree-perturbed", "--task", "trees", "--temperature", "0"],
              "--temperature must be > 0"),
             (["--method", "entmax", "--task", "reorder", "--alpha", "1"], "--alpha must be > 1"),
             (["--method", "tree-imle", "--task", "trees", "--temperature", "0.5"],
              "--temperature does not apply to --method tree-imle"),
             (["--method", "soft", "--task", "reorder", "--max-active", "3"],
              "--max-active does not apply to --method soft"),
             (["--method", "tree-perturbed", "--task", "trees", "--noise-distribution", "normal"],
              "invalid choice")]
    for args, what in cases:
        out = tmp_path / "run"
        try:
            code = main(["train", *args, "--steps", "1", "--out", str(out)])
        except SystemExit as e:  # argparse refuses a choice itself
            code = e.code
        err = capsys.readouterr().err
        assert code == 2 and what in err and not out.exists(), (args, err)


def test_a_method_refuses_a_family_it_does_not_train():
    model, b = _model("vae-enum", 1.0), _batch()
    with pytest.raises(UserError, match="trains the 'sparse-categorical' family"):
        fit(model, [b], "sparse-marginal", steps=1, progress=False)
    from ppl_attention.pyro.families import make_family

    tree = make_family("tree")
    with pytest.raises(UserError, match=r"\(sparsemap=True\)"):
        from ppl_attention.common.contract import check_method

        check_method(Seq2SeqAlignment, get_method("tree-sparsemap"), tree)


def test_sparsemap_needs_an_argmax():
    from ppl_attention.pyro.sparse import SparseMAP

    with pytest.raises(UserError, match="argmax"):
        SparseMAP(torch.distributions.Normal(torch.zeros(3), 1.0))
    assert math.isfinite(0.0)
