"""AttentionSeqVAE: bounds (ELBO ≤ IWAE_K, rising with K), the analytic KL against Monte Carlo,
free bits, the z-ablation gap, exact enumeration of a categorical alignment, padding
invariance, the CLI (train / evaluate / sample) and bad input."""

import json
import math
from functools import partial

import pyro
import pyro.poutine as poutine
import pytest
import torch
from pyro.infer import Trace_ELBO, TraceEnum_ELBO

from ppl_attention.cli import main
from ppl_attention.data import DataError, Vocab, make_batches, make_task, read_sequences
from ppl_attention.pyro.models.seq_vae import AttentionSeqVAE, free_bits_kl, kl_normal_per_dim
from ppl_attention.pyro.models.seq_vae_diagnostics import _iwae, _sequence_elbo, latent_diagnostics

SEQS = [t for _, t in make_task("reorder", n_train=60, n_eval=6, seed=0).train.pairs]


def _setup(n=12, **kw):
    v = Vocab.build(SEQS)
    torch.manual_seed(0)
    m = AttentionSeqVAE(len(v), hidden=16, latent=4, **kw)
    m.eval()
    (b,) = make_batches([(s, s) for s in SEQS[:n]], v, v, n)
    return m, v, b


def test_analytic_kl_equals_monte_carlo():
    torch.manual_seed(1)
    mu, sigma = torch.randn(5), torch.rand(5) + 0.3
    z = mu + sigma * torch.randn(200_000, 5)
    q = torch.distributions.Normal(mu, sigma)
    p = torch.distributions.Normal(0.0, 1.0)
    draws = q.log_prob(z) - p.log_prob(z)
    se = draws.std(0) / math.sqrt(draws.shape[0])
    assert torch.all((draws.mean(0) - kl_normal_per_dim(mu, sigma)).abs() < 3 * se + 1e-6)


@pytest.mark.parametrize("kw", [{}, {"attention": "none"}, {"family": "categorical"},
                                {"encoder": "transformer", "decoder": "transformer"}])
def test_iwae_is_above_the_elbo_and_rises_with_k(kw):
    m, _, b = _setup(**kw)
    g = torch.Generator().manual_seed(0)
    elbo = torch.stack([_sequence_elbo(m, b, g) for _ in range(200)]).mean(0)
    iw = {k: torch.stack([_iwae(m, b, k, g) for _ in range(20)]).mean(0) for k in (1, 10, 100)}
    # IWAE_1 is the ELBO in expectation; IWAE_K ≥ ELBO and rises with K on average
    assert float((iw[1] - elbo).abs().mean()) < 0.05 * float(elbo.abs().mean())
    assert float(iw[10].mean()) >= float(elbo.mean())
    assert float(iw[100].mean()) >= float(iw[10].mean()) >= float(iw[1].mean())


def test_free_bits_hold_each_dimension_at_the_floor():
    m, _, b = _setup()
    floor = 0.5
    with torch.no_grad():
        _, mu, sigma = m.encode(b)
    kl = kl_normal_per_dim(mu, sigma)
    assert bool((kl < floor).any())  # the floor binds somewhere
    term = free_bits_kl(mu, sigma, floor)
    assert torch.allclose(term, torch.maximum(kl, torch.tensor(floor)).sum(-1))
    assert bool((term >= floor * m.latent - 1e-6).all())
    # in the training objective: the same draw, the loss rises by exactly Σ_d relu(λ − KL_d)
    losses = []
    for fb in (0.0, floor):
        m.config["free_bits"] = fb
        pyro.set_rng_seed(3)
        losses.append(Trace_ELBO(max_plate_nesting=2).loss(m.model, m.guide, b))
    m.config["free_bits"] = 0.0
    assert losses[1] - losses[0] == pytest.approx(float((floor - kl).clamp(min=0).sum()),
                                                  rel=1e-4)
    # and no gradient pushes a dimension's KL below the floor
    mu_ = mu.clone().requires_grad_(True)
    free_bits_kl(mu_, sigma, 10.0).sum().backward()
    assert torch.all(mu_.grad == 0)


def test_z_ablation_gap_is_zero_when_q_is_the_prior():
    m, _, b = _setup()
    with torch.no_grad():
        m.q_mu.weight.zero_()
        m.q_mu.bias.zero_()
        m.q_log_sigma.weight.zero_()
        m.q_log_sigma.bias.fill_(math.log(math.expm1(1.0 - 1e-4)))  # softplus + 1e-4 = 1
    report = latent_diagnostics(m, [b], iwae_k=5)
    assert report["z_ablation_gap"] == pytest.approx(0.0, abs=1e-6)
    assert report["kl"] == pytest.approx(0.0, abs=1e-5)
    assert report["active_units"] == 0
    assert abs(report["mutual_info"]) < 1e-4


def test_enumerated_categorical_alignment_equals_the_exact_marginal():
    """TraceEnum_ELBO over the model's alignment site = −(Σ_t log Σ_j p(a_t=j) p(x_t | a_t=j, z)
    + log p(z) − log q(z | x)) with the guide's z; padded tokens add nothing."""
    m, _, b = _setup(family="categorical")
    m.double()
    pyro.set_rng_seed(5)
    tr = poutine.trace(m.guide).get_trace(b)
    z = tr.nodes["z"]["value"].squeeze(-2)
    with torch.no_grad():
        ll = m.token_log_likelihood(b, z).sum()
        _, mu, sigma = m.encode(b)
        log_q = torch.distributions.Normal(mu, sigma).log_prob(z).sum()
        log_p = torch.distributions.Normal(0.0, 1.0).log_prob(z).sum()
    pyro.set_rng_seed(5)
    loss = TraceEnum_ELBO(max_plate_nesting=2).loss(
        lambda bb: m.model(bb, enumerate_z=True), m.guide, b)
    assert loss == pytest.approx(-float(ll + log_p - log_q), rel=1e-9)


@pytest.mark.parametrize("encoder", ["gru", "transformer"])
def test_padding_changes_no_number(encoder):
    m, v, b = _setup(encoder=encoder, family="categorical")
    with torch.no_grad():
        _, mu, _ = m.encode(b)
        ll = m.token_log_likelihood(b, mu)
        for row in range(b.size):
            i = int(b.index[row])
            (one,) = make_batches([(SEQS[i], SEQS[i])], v, v, 1)
            _, mu1, _ = m.encode(one)
            assert torch.allclose(mu1[0], mu[row], atol=1e-5)
            n = one.tgt_out.shape[1]
            assert torch.allclose(m.token_log_likelihood(one, mu1)[0], ll[row, :n], atol=1e-5)
            assert torch.all(ll[row, n:] == 0)


def test_bad_options_and_input():
    with pytest.raises(ValueError, match="encoder must be one of"):
        AttentionSeqVAE(10, encoder="lstm")
    with pytest.raises(ValueError, match="needs decoder='gru'"):
        AttentionSeqVAE(10, decoder="transformer", family="categorical")
    m, v, _ = _setup(max_len=5)
    (b,) = make_batches([(SEQS[0] + SEQS[1], SEQS[0] + SEQS[1])], v, v, 1)
    with pytest.raises(ValueError, match="more than max_len=5"):
        m.encode(b)


def test_cli_train_evaluate_sample_and_bad_files(tmp_path, capsys):
    d = tmp_path / "data"
    d.mkdir()
    for name, seqs in (("train", SEQS[:40]), ("test", SEQS[40:46])):
        (d / f"{name}.tsv").write_text("".join(" ".join(s) + "\n" for s in seqs))
    run = tmp_path / "run"
    assert main(["train", "--model", "seq-vae", "--data-dir", str(d), "--steps", "6",
                 "--hidden", "16", "--latent", "4", "--valid-every", "3",
                 "--out", str(run)]) == 0
    report = json.loads(capsys.readouterr().out)
    for key in ("kl", "kl_per_dim", "active_units", "mutual_info", "iwae_nll",
                "z_ablation_gap", "elbo"):
        assert key in report
    assert report["elbo"] <= -report["iwae_nll"] + 1e-6
    assert main(["evaluate", str(run), "--json", "--iwae-k", "7"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["iwae_k"] == 7 and again["n_sequences"] == 6
    assert main(["sample", str(run), "--n", "2", "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "# prior samples" in out and "# interpolation" in out
    # an empty line names file and line; a sequence over --max-len is refused or truncated
    (d / "test.tsv").write_text("a b\n\nc\n")
    with pytest.raises(DataError, match=r"test.tsv:2: empty line"):
        read_sequences(d / "test.tsv")
    assert main(["evaluate", str(run), "--data-dir", str(d)]) == 2
    assert "test.tsv:2: empty line" in capsys.readouterr().err
    (d / "train.tsv").write_text("".join(" ".join(s) + "\n" for s in SEQS[:40]) + "a " * 80 + "\n")
    (d / "test.tsv").write_text("".join(" ".join(s) + "\n" for s in SEQS[40:46]))
    args = ["train", "--model", "seq-vae", "--data-dir", str(d), "--steps", "2", "--hidden",
            "16", "--latent", "4", "--max-len", "20", "--out", str(tmp_path / "r2")]
    assert main(args) == 2
    assert "sequence 41 has 80 tokens, more than --max-len 20" in capsys.readouterr().err
    with pytest.warns(UserWarning, match="1 sequence"):
        assert main(args + ["--on-long", "truncate"]) == 0


@pytest.mark.parametrize("kw", [{}, {"family": "categorical", "attention": "bilinear"},
                                {"attention": "none", "z_input": "init"},
                                {"encoder": "transformer"},
                                {"encoder": "transformer", "decoder": "transformer"},
                                {"memory": "encoder", "z_input": "concat"},
                                {"decoder": "transformer", "memory": "encoder"}])
def test_numpyro_mirror_equals_pyro_on_the_same_weights(kw):
    """μ, σ and log p(x_t | x_<t, z) per token equal the torch model's on a batch padded in
    rows and positions; NumPyro's Trace_ELBO (free bits on; a categorical alignment: the
    enumerated loss of ``exact``) equals the hand-computed
    −(log p(x | z) + log p(z) − log q(z | x) − Σ_d relu(λ − KL_d)) at the guide's draw, summed
    over the real rows (a padded row's z and free bits are masked out). The twins' losses and
    gradients per method: tests/parity/test_seq_vae_twin.py."""
    import jax
    import numpy as np
    from numpyro import handlers
    from numpyro.infer import Trace_ELBO as JTrace_ELBO

    from ppl_attention.numpyro.inference.methods import latent_enumerated_loss
    from ppl_attention.numpyro.jax_batches import to_jax
    from ppl_attention.numpyro.models import AttentionSeqVAE as JaxVAE

    m, _, b = _setup(free_bits=0.3, **kw)
    jm, p = JaxVAE.from_torch(m)
    jb = to_jax(b, b.size + 3, 4)
    B, T = b.tgt_out.shape
    with torch.no_grad():
        H, mu, sigma = m.encode(b)
        ll = m.token_log_likelihood(b, mu, H).numpy()
    Hj, muj, sigmaj = jm.encode(p, jb)
    assert np.allclose(np.asarray(muj)[:B], mu.numpy(), atol=1e-5)
    assert np.allclose(np.asarray(sigmaj)[:B], sigma.numpy(), atol=1e-5)
    llj = np.asarray(jax.jit(jm.token_log_likelihood)(p, jb, muj, Hj))
    assert np.allclose(llj[:B, :T], ll, atol=1e-4)
    assert np.all(llj[:, T:] == 0) and np.all(llj[B:] == 0)
    key = jax.random.PRNGKey(0)
    if jm.family.enumerable:  # the alignment enumerated in the model: TraceEnum_ELBO's number
        loss = latent_enumerated_loss(key, {"seq_vae": p}, partial(jm.model, enumerate_z=True),
                                      jm.guide, jb)
        guide_key = key
    else:
        loss = JTrace_ELBO().loss(key, {"seq_vae": p}, jm.model, jm.guide, jb)
        guide_key = jax.random.split(key)[1]  # Trace_ELBO seeds the guide with the second half
    g = handlers.trace(handlers.seed(handlers.substitute(jm.guide, data={"seq_vae": p}),
                                     guide_key)).get_trace(jb)
    z = g["z"]["value"][:, 0]  # [B + 3, d]: under the batch plate at dim -2
    zr, mur, sigmar = z[:B], muj[:B], sigmaj[:B]  # the real rows
    manual = -(np.asarray(jm.token_log_likelihood(p, jb, z, Hj)).sum()
               + float(jax.scipy.stats.norm.logpdf(zr).sum())
               - float(jax.scipy.stats.norm.logpdf(zr, mur, sigmar).sum())
               - float(np.clip(0.3 - np.asarray(
                   0.5 * (mur**2 + sigmar**2 - 1) - np.log(sigmar)), 0, None).sum()))
    assert float(loss) == pytest.approx(manual, rel=1e-4)
