"""attend(): exact enumeration against brute force, MAP, masks, gradients, bad input."""

import itertools

import pyro
import pyro.distributions as dist
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pyro.infer import Trace_ELBO, TraceEnum_ELBO, TraceGraph_ELBO, infer_discrete

import ppl_attention as pa
from ppl_attention.core.errors import UserError

D = torch.float64


def _toy(T=3, S=4, dv=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(T, S, generator=g, dtype=D), torch.randn(S, dv, generator=g, dtype=D),
            torch.randn(T, dv, generator=g, dtype=D))


def _brute_force(scores, values, y, valid=None):
    """log p(y) and the MAP alignment by listing every alignment path."""
    T, S = scores.shape
    positions = [s for s in range(S) if valid is None or valid[s]]
    logits = scores.masked_fill(~valid, -torch.inf) if valid is not None else scores
    best, best_lp, terms = None, -torch.inf, []
    for path in itertools.product(positions, repeat=T):
        lp = sum(logits[t].log_softmax(-1)[z] + dist.Normal(values[z], 1.0).to_event(1)
                 .log_prob(y[t]) for t, z in enumerate(path))
        terms.append(lp)
        if lp > best_lp:
            best, best_lp = path, lp
    return torch.logsumexp(torch.stack(terms), 0), torch.tensor(best)


def _toy_model(scores, values, y, mask=None):
    def model():
        with pyro.plate("target", scores.shape[-2], dim=-1):
            ctx, _ = pa.attend("align", scores, values, family=pa.Categorical(), mask=mask,
                               infer={"enumerate": "parallel"})
            pyro.sample("y", dist.Normal(ctx, 1.0).to_event(1), obs=y)
    return model


def _empty_guide():
    pass


def test_enumerated_loss_equals_brute_force_marginal():
    scores, values, y = _toy()
    loss = TraceEnum_ELBO(max_plate_nesting=1).loss(_toy_model(scores, values, y), _empty_guide)
    log_py, _ = _brute_force(scores, values, y)
    assert abs(loss + log_py.item()) <= 1e-5 * max(1.0, abs(log_py.item()))


def test_enumerated_loss_with_source_mask_and_batch():
    scores, values, y = _toy(T=3, S=5, seed=4)
    valid = torch.tensor([True, False, True, True, False])
    loss = TraceEnum_ELBO(max_plate_nesting=1).loss(_toy_model(scores, values, y, valid),
                                                    _empty_guide)
    log_py, _ = _brute_force(scores, values, y, valid)
    assert abs(loss + log_py.item()) <= 1e-5 * max(1.0, abs(log_py.item()))


def test_infer_discrete_returns_brute_force_map():
    for seed in range(5):
        scores, values, y = _toy(seed=seed)
        model = infer_discrete(_toy_model(scores, values, y), first_available_dim=-2,
                               temperature=0)
        z = pyro.poutine.trace(model).get_trace().nodes["align"]["value"]
        _, best = _brute_force(scores, values, y)
        assert torch.equal(z, best), (seed, z, best)


def test_sampled_categorical_returns_index_and_selected_value():
    scores, values, _ = _toy()
    with pyro.plate("target", 3, dim=-1):
        ctx, z = pa.attend("align", scores, values, family=pa.Categorical())
    assert z.shape == (3,) and z.dtype == torch.long
    assert torch.equal(ctx, values[z])


def test_soft_records_deterministic_weights():
    scores, values, _ = _toy()
    tr = pyro.poutine.trace(lambda: pa.attend("w", scores, values)).get_trace()
    ctx, w = tr.nodes["_RETURN"]["value"]
    assert torch.allclose(tr.nodes["w"]["value"], scores.softmax(-1))
    assert torch.allclose(ctx, scores.softmax(-1) @ values)


FAMILIES = [
    lambda: pa.Soft(),
    lambda: pa.Categorical(),
    lambda: pa.RelaxedCategorical(0.3),
    lambda: pa.Dirichlet(),
    lambda: pa.Weibull(k=2.0),
    lambda: pa.LogNormal(sigma=1.0),
    lambda: pa.GaussianContext(),
]


@settings(max_examples=25, deadline=None)
@given(
    B=st.integers(1, 3), T=st.integers(1, 4), S=st.integers(1, 6),
    seed=st.integers(0, 2**16), family_index=st.integers(0, len(FAMILIES) - 1),
    as_guide=st.booleans(),
)
def test_masked_positions_get_exactly_zero_weight(B, T, S, seed, family_index, as_guide):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(B, S, generator=g) < 0.6
    mask[torch.arange(B), torch.randint(S, (B,), generator=g)] = True
    scores = 3 * torch.randn(B, T, S, generator=g)
    values = torch.randn(B, S, 3, generator=g)
    family = FAMILIES[family_index]()
    with pyro.plate("batch", B, dim=-2), pyro.plate("target", T, dim=-1):
        tr = pyro.poutine.trace(
            lambda: pa.attend("a", scores, values, family=family, mask=mask, guide=as_guide)
        ).get_trace()
    _, w = tr.nodes["_RETURN"]["value"]
    hidden = ~mask.unsqueeze(-2).expand(B, T, S)
    if isinstance(family, pa.Categorical):
        probs = tr.nodes["a"]["fn"].probs
        assert torch.all(probs[hidden] == 0)
        assert torch.all(mask.unsqueeze(-2).expand(B, T, S).gather(-1, w.unsqueeze(-1)))
    else:
        assert torch.all(w[hidden] == 0)
        assert torch.allclose(w.sum(-1), torch.ones(B, T), atol=1e-5)


@pytest.mark.parametrize("make_family", FAMILIES[1:], ids=lambda f: type(f()).__name__)
def test_padded_targets_add_nothing_to_the_loss(make_family):
    """Scores and observations at padded target positions do not change the loss."""
    torch.manual_seed(0)
    B, T, S = 2, 4, 3
    target_mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    values = torch.randn(B, S, 2)
    y = torch.randn(B, T, 2)
    family = make_family()

    def run(scores, y, draws=None):
        def model():
            with pyro.plate("batch", B, dim=-2), pyro.plate("target", T, dim=-1):
                ctx, _ = pa.attend("a", scores, values, family=family, target_mask=target_mask)
                with pyro.poutine.mask(mask=target_mask):
                    pyro.sample("y", dist.Normal(ctx, 1.0).to_event(1), obs=y)

        def guide():
            with pyro.plate("batch", B, dim=-2), pyro.plate("target", T, dim=-1):
                pa.attend("a", scores * 0.5, values, family=family, target_mask=target_mask,
                          guide=True)

        # the same draws on both sides (a Gamma sampler's use of the RNG depends on its shape)
        if draws is None:
            draws = pyro.poutine.trace(guide).get_trace()
        loss = Trace_ELBO(max_plate_nesting=2).loss(model, pyro.poutine.replay(guide, draws))
        return loss, draws

    scores = torch.randn(B, T, S)
    changed_scores, changed_y = scores.clone(), y.clone()
    changed_scores[~target_mask] = 50.0 * torch.randn(int((~target_mask).sum()), S)
    changed_y[~target_mask] = 100.0
    loss, draws = run(scores, y)
    changed_loss, _ = run(changed_scores, changed_y, draws)
    assert loss == pytest.approx(changed_loss, rel=1e-6)
    y_valid_changed = y.clone()
    y_valid_changed[0, 0] += 1.0
    assert run(scores, y_valid_changed, draws)[0] != pytest.approx(loss, rel=1e-6)


def test_score_function_gradient_is_unbiased():
    """The fast form: 500 seeds, within 4 standard errors (largest |z| 1.6; 2.0 at 3000 seeds).
    Planted once, in memory: the guide's scores detached in ``Categorical.posterior`` (no
    gradient reaches φ) fails both forms; a guide drawing from softmax(0.8·φ) — the unbiased
    gradient of another ELBO — fails the full-power form only (|z| 7.4; 3.9 here)."""
    _check_score_function_gradient(500, 4.0)


@pytest.mark.statistical
def test_score_function_gradient_is_unbiased_full_power():
    """The full-power form: 3000 seeds, within 3 standard errors."""
    _check_score_function_gradient(3000, 3.0)


def _check_score_function_gradient(n, sigmas):
    """TraceGraph_ELBO's REINFORCE gradient of a Categorical guide site, averaged over ``n``
    seeds, is within ``sigmas`` standard errors of the exact gradient of the enumerated ELBO."""
    T, S = 2, 4
    _, values, y = _toy(T=T, S=S, seed=7)
    values, y = values.float(), y.float()
    theta0 = torch.tensor([0.2, -0.4, 0.9, 0.0])
    phi0 = torch.tensor([[0.5, 0.1, -0.3, 0.2], [-0.6, 0.8, 0.0, 0.3]])

    def model():
        theta = pyro.param("theta", theta0.clone())
        with pyro.plate("target", T, dim=-1):
            ctx, _ = pa.attend("a", theta.expand(T, S), values, family=pa.Categorical())
            pyro.sample("y", dist.Normal(ctx, 1.0).to_event(1), obs=y)

    def guide():
        phi = pyro.param("phi", phi0.clone())
        with pyro.plate("target", T, dim=-1):
            pa.attend("a", phi, values, family=pa.Categorical(), guide=True)

    # exact ELBO by summing over every z_t, differentiated by autograd
    theta, phi = theta0.clone().requires_grad_(), phi0.clone().requires_grad_()
    log_q = phi.log_softmax(-1)
    log_joint = theta.log_softmax(-1) + dist.Normal(values, 1.0).to_event(1).log_prob(
        y.unsqueeze(-2))
    elbo = (log_q.exp() * (log_joint - log_q)).sum()
    exact_theta, exact_phi = torch.autograd.grad(-elbo, (theta, phi))

    est = TraceGraph_ELBO(max_plate_nesting=1)
    grads = []
    for seed in range(n):
        pyro.set_rng_seed(seed)
        est.loss_and_grads(model, guide)
        store = pyro.get_param_store()
        grads.append(torch.cat([store["theta"].grad.flatten(), store["phi"].grad.flatten()]))
        for p in ("theta", "phi"):
            store[p].grad = None
    grads = torch.stack(grads)
    mean, se = grads.mean(0), grads.std(0) / len(grads) ** 0.5
    exact = torch.cat([exact_theta.flatten(), exact_phi.flatten()])
    assert torch.all((mean - exact).abs() < sigmas * se + 1e-6), (mean, exact, se)
    assert se[len(theta0):].max() > 0  # the score-function part really is stochastic


# --- bad input -------------------------------------------------------------------------------

def _call(**kw):
    args = dict(name="a", scores=torch.randn(2, 3, 4), values=torch.randn(2, 4, 5))
    args.update(kw)
    return pa.attend(args.pop("name"), args.pop("scores"), args.pop("values"), **args)


def test_mismatched_source_length():
    with pytest.raises(ValueError, match=r"source length S.*\[2, 3, 4\].*S=4.*\[2, 6, 5\].*S=6"):
        _call(values=torch.randn(2, 6, 5))


def test_mask_hiding_everything():
    mask = torch.tensor([[True, False, False, False], [False, False, False, False]])
    with pytest.raises(ValueError, match="mask hides every source position"):
        _call(mask=mask)


def test_mask_of_wrong_shape():
    with pytest.raises(ValueError, match=r"mask of shape \[2, 5\] does not broadcast"):
        _call(mask=torch.ones(2, 5, dtype=torch.bool))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_scores(bad):
    scores = torch.randn(2, 3, 4)
    scores[1, 2, 0] = bad
    with pytest.raises(ValueError, match="scores must be finite"):
        _call(scores=scores)


def test_unknown_family_in_attend():
    with pytest.raises(ValueError, match="unknown family 'sparsemaxx'"):
        _call(family="sparsemaxx")


def test_temperature_not_positive():
    with pytest.raises(ValueError, match="temperature must be a finite number > 0, got 0"):
        _call(family=pa.RelaxedCategorical(temperature=0))


def test_bad_target_mask():
    with pytest.raises(ValueError, match="target_mask of shape"):
        with pyro.plate("b", 2, dim=-2), pyro.plate("t", 3, dim=-1):
            _call(family=pa.Categorical(), target_mask=torch.ones(5, dtype=torch.bool))


def test_scores_of_one_row_per_sentence_are_refused_naming_the_plate():
    """``[B, S]`` scores where ``[B, T, S]`` was meant: refused by ``attend`` naming the site,
    the shape and the plate (it was Pyro's generic plate message), on both backends."""
    import jax.numpy as jnp
    import numpyro

    import ppl_attention.numpyro as pn

    B, T, S = 4, 3, 5
    with pyro.plate("batch", B, dim=-2), pyro.plate("target", T, dim=-1):
        pa.attend("ok", torch.randn(B, T, S), torch.randn(B, 1, S, 2), "categorical")
        with pytest.raises(UserError, match=r"attend\('z'\): scores \[4, 5\] .* plate "
                                             r"'target' has size 3"):
            pa.attend("z", torch.randn(B, S), torch.randn(B, S, 2), "categorical")
    with numpyro.handlers.seed(rng_seed=0), numpyro.plate("batch", B, dim=-2), \
            numpyro.plate("target", T, dim=-1):
        pn.attend("ok", jnp.zeros((B, T, S)), jnp.zeros((B, 1, S, 2)), "categorical")
        with pytest.raises(UserError, match=r"attend\('z'\): scores \[4, 5\] .* plate "
                                             r"'target' has size 3"):
            pn.attend("z", jnp.zeros((B, S)), jnp.zeros((B, S, 2)), "categorical")
