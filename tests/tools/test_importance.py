"""The importance-corrected posterior (ppl_attention.common.importance_weights and both backends'
draws): the
corrected link marginals converge to the exact ones as 1/√K, k̂ is small for a guide equal to
the posterior and large for a planted over-confident one, the two backends give the same
corrected marginals at the same draws, IWAE-K and the ELBO of the same draws bound log p, bad K
and a run without a posterior are refused, and the command-line tools take
``--posterior importance``.

Planted faults (``python tests/plant_faults.py i1 i2``): i1 — the marginals averaged over the
draws without their weights (no correction at all); i2 — the log weights without their −log q
term (the guide's density): both caught by
``test_corrected_marginals_converge_to_the_exact_ones``.
"""

import json

import numpy as np
import pyro.distributions as dist
import pytest
import torch

import ppl_attention as pa
from ppl_attention.cli import main
from ppl_attention.common.importance_weights import (
    MEMORY_BUDGET,
    check_importance,
    check_samples,
    correct,
    khat_summary,
    smooth,
)
from ppl_attention.core.errors import UserError
from ppl_attention.data import Vocab, make_batches, make_task
from ppl_attention.pyro.inference.calibration import Distort, distortion
from ppl_attention.pyro.inference.importance import importance_arrays
from ppl_attention.pyro.models.base import exact_posterior, exact_token_log_likelihood

TASK = make_task("reorder", n_train=300, n_eval=20, seed=1)
SV, TV = (Vocab.build(p[k] for p in TASK.train.pairs) for k in (0, 1))


@pytest.fixture(scope="module")
def run():
    torch.manual_seed(0)
    m = pa.inference.get_method("vae-sample")
    model = pa.models.Seq2SeqAlignment(len(SV), len(TV), hidden=16, family=m.family())
    train = make_batches(TASK.train.pairs, SV, TV, 32, shuffle=True)
    return pa.inference.fit(model, train, "vae-sample", steps=40, lr=0.02, src_vocab=SV,
                            tgt_vocab=TV, progress=False)


def _batch(n=6):
    (b,) = make_batches(TASK.test.pairs[:n], SV, TV, n)
    return b


def _error(run, b, k, reps, wrap=None):
    exact = exact_posterior(run.model, b).detach().numpy()
    mask = b.tgt_mask.numpy()
    rng = np.random.default_rng(0)
    errs = []
    for r in range(reps):
        arr = importance_arrays(run, b, k, seed=100 * k + r, wrap_guide=wrap)
        c = correct(arr["log_w"], arr["values"], rng)
        errs.append(np.abs(c["marginals"] - exact)[mask].sum(-1).mean())  # total variation ×2
    return float(np.mean(errs))


@pytest.mark.statistical
def test_corrected_marginals_converge_to_the_exact_ones(run):
    """The guide made wider than it was trained (logits halved): far from the exact posterior
    as it stands, a proposal whose weights the correction must use."""
    b = _batch()
    def wide(g):
        return Distort("align", distortion("logits", 0.5))(g)

    e10, e100, e1000 = (_error(run, b, k, reps, wide)
                        for k, reps in ((10, 20), (100, 6), (1000, 2)))
    # roughly 1/√K: a factor √10 ≈ 3.2 per decade (2 to 5 allowed), 10 over two decades
    assert 2.0 < e10 / e100 < 5.0 and 2.0 < e100 / e1000 < 5.0, (e10, e100, e1000)
    assert e1000 < 0.1


def test_khat_small_for_the_exact_posterior_large_for_an_overconfident_guide(run):
    b = _batch(8)
    exact = exact_posterior(run.model, b).detach()
    def as_exact(g):
        return Distort("align", lambda fn: dist.Categorical(
            probs=exact.clamp_min(1e-30)).mask(b.tgt_mask))(g)

    rng = np.random.default_rng(0)
    arr = importance_arrays(run, b, 200, seed=3, wrap_guide=as_exact)
    c = correct(arr["log_w"], arr["values"], rng)
    ll = exact_token_log_likelihood(run.model, b).sum(-1).detach().numpy()
    np.testing.assert_allclose(arr["log_w"], np.broadcast_to(ll, arr["log_w"].shape), atol=1e-3)
    assert np.all(c["khat"] == 0.0)  # every weight is p(y | x): nothing to correct
    def bad(g):
        return Distort("align", distortion("logits", 6.0))(g)

    arr = importance_arrays(run, b, 200, seed=3, wrap_guide=bad)
    k = correct(arr["log_w"], arr["values"], rng)["khat"]
    summary = khat_summary(k)
    assert summary["khat_estimated"] >= 4 and summary["khat_share"] >= 0.5, k


def test_bounds_of_the_same_draws(run):
    b = _batch()
    arr = importance_arrays(run, b, 300, seed=1)
    c = correct(arr["log_w"], arr["values"], np.random.default_rng(0))
    log_p = exact_token_log_likelihood(run.model, b).sum(-1).detach().numpy()
    assert np.all(c["elbo"] <= c["iwae"] + 1e-9)
    assert np.all(c["iwae"] <= log_p + 0.05)  # a bound, up to its Monte Carlo error
    assert np.all(c["iwae"] >= c["elbo"])


def test_both_backends_give_the_same_corrected_marginals_at_the_same_draws(run):
    """On two batches of different shapes in turn (the NumPyro side compiles its draws once per
    model: the second batch must not be read with the first one's shapes)."""
    import pyro
    from pyro import poutine

    from ppl_attention.numpyro.inference.importance import importance_arrays as jax_arrays

    by_len = sorted(TASK.test.pairs, key=lambda p: len(p[0]))
    batches = [make_batches(ps, SV, TV, 4)[0] for ps in (by_len[:4], by_len[-4:])]
    assert batches[0].src.shape[1] != batches[1].src.shape[1]
    model32 = run.model.float()
    k = 40
    for b in batches:
        draws = []
        pyro.set_rng_seed(5)
        for _ in range(k):
            tr = poutine.trace(model32.guide).get_trace(b, posterior="inference")
            draws.append(tr.nodes["align"]["value"].numpy())
        draws = np.stack(draws)
        a = importance_arrays(run, b, k, draws=draws)
        j = jax_arrays(run, b, k, draws=draws)
        assert j["values"].shape == a["values"].shape
        np.testing.assert_allclose(j["log_w"], a["log_w"], rtol=1e-5, atol=1e-4)
        rng = np.random.default_rng(0)
        ca, cj = correct(a["log_w"], a["values"], rng), correct(j["log_w"], j["values"], rng)
        np.testing.assert_allclose(cj["marginals"], ca["marginals"], atol=1e-5)


def test_bad_samples_and_runs_without_a_posterior_are_refused(run, tmp_path):
    for k in (0, -3, 1, 2.5, True):
        with pytest.raises(UserError, match="importance-samples"):
            check_samples(k)
    with pytest.raises(UserError, match="GiB"):
        check_samples(10_000, per_draw_bytes=MEMORY_BUDGET // 100)
    with pytest.raises(UserError, match="importance"):
        smooth(np.zeros((1, 3)))
    exact = pa.inference.Run(pa.models.Seq2SeqAlignment(len(SV), len(TV), hidden=8,
                                                        family="categorical"), "exact", SV, TV)
    with pytest.raises(UserError, match="no guide"):
        check_importance(exact, 10)
    soft = pa.inference.Run(pa.models.Seq2SeqAlignment(len(SV), len(TV), hidden=8,
                                                       family="soft"), "soft", SV, TV)
    with pytest.raises(UserError, match="no sampled posterior"):
        check_importance(soft, 10)


def test_command_line_tools_take_the_corrected_posterior(run, tmp_path, capsys):
    from ppl_attention.data.pharaoh import format_pharaoh

    path = tmp_path / "run"
    run.save(path)
    data, gold = tmp_path / "pairs.tsv", tmp_path / "pairs.align"
    data.write_text("".join(" ".join(s) + "\t" + " ".join(t) + "\n"
                            for s, t in TASK.test.pairs[:5]))
    gold.write_text("".join(format_pharaoh(g) + "\n" for g in TASK.test.gold[:5]))
    assert main(["evaluate", str(path), "--data", str(data), "--gold", str(gold), "--posterior",
                 "importance", "--importance-samples", "30", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rep["importance_samples"] == 30 and 0 <= rep["importance_aer"] <= 1
    assert rep["importance_elbo_per_token"] <= rep["importance_iwae_per_token"]
    khat = tmp_path / "khat.txt"
    assert main(["align", str(path), "--data", str(data), "--posterior", "importance",
                 "--importance-samples", "30", "--khat", str(khat)]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 5
    assert len(khat.read_text().splitlines()) == 5
    out = tmp_path / "an"
    assert main(["analyze", str(path), "--data", str(data), "--out", str(out), "--num-samples",
                 "8", "--posterior", "importance", "--importance-samples", "30"]) == 0
    import arviz as az

    idata = az.from_netcdf(out / "posterior.nc")
    assert idata["importance"]["weights"].shape[1] == 30
    np.testing.assert_allclose(idata["importance"]["weights"].values.sum(1), 1.0, atol=1e-6)
    assert idata.posterior["alignment"].shape[1] == 8
    # refused before any work: an option without its posterior, a bad K, a run without one
    capsys.readouterr()
    assert main(["evaluate", str(path), "--data", str(data), "--importance-samples", "30"]) == 2
    assert "applies to --posterior importance" in capsys.readouterr().err
    assert main(["evaluate", str(path), "--data", str(data), "--posterior", "importance",
                 "--importance-samples", "0"]) == 2
    assert main(["align", str(path), "--data", str(data), "--khat", str(khat)]) == 2
