"""The NumPyro model contract: a model written in NumPyro alone (the tutorial's, in examples/)
through every command; its generic exact members against brute force and against its Pyro twin
on the same weights; check-twin on the tutorial pair and the built-in twin; resume with the
identical next loss; bad NumPyro models refused before any work, nothing written; run
directories as plain arrays.

Planted faults, each caught (``python tests/plant_faults.py n1 n2``):
- n1, the generic exact likelihood taking ``jnp.max`` of the enumerated joint instead of
  ``logsumexp``: test_generic_exact_members_equal_brute_force_and_the_pyro_twin failed;
- n2, the NumPyro loop's resume keeping a fresh optimizer state instead of the saved one:
  test_a_numpyro_run_saved_and_resumed_gives_the_identical_next_losses failed;
- a twin whose emission bias has the wrong sign (a copy of the tutorial file, ``+ out_b`` →
  ``- out_b``): check-twin exits 1 naming the method — planted by
  test_check_twin_fails_on_a_twin_that_differs itself.
"""

import dataclasses
import importlib
import json
import math
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numpyro import handlers

from ppl_attention.cli import main
from ppl_attention.common import arviz_api
from ppl_attention.data import Vocab, make_batches, make_task
from ppl_attention.numpyro.inference.methods import get_method
from ppl_attention.numpyro.jax_batches import to_jax
from ppl_attention.numpyro.models import base

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "examples" / "tutorial"
NUMPYRO_SPEC = f"{TUTORIAL / 'diagonal_numpyro.py'}:DiagonalAlignment"
PYRO_SPEC = f"{TUTORIAL / 'diagonal.py'}:DiagonalAlignment"
SMALL = ["--steps", "24", "--batch-size", "32", "--valid-every", "12", "--lr", "0.05"]

sys.path.insert(0, str(TUTORIAL))
from diagonal_numpyro import DiagonalAlignment  # noqa: E402


@pytest.fixture(autouse=True)
def _jax_cache(tmp_path_factory, monkeypatch):
    """Compiled steps cached for the session in a temporary directory, not the user's."""
    monkeypatch.setenv("PPL_ATTENTION_JAX_CACHE", str(tmp_path_factory.getbasetemp() / "jax"))


def _tiny(method="vae-enum", n=6, rows=8):
    task = make_task("reorder", n_train=20, n_eval=2, seed=4, min_len=3, max_len=6)
    sv = Vocab.build(s for s, _ in task.train.pairs)
    tv = Vocab.build(t for _, t in task.train.pairs)
    (b,) = make_batches(task.train.pairs[:n], sv, tv, n, array="numpy")
    jb = to_jax(b, rows, "bucket")  # padded rows and positions, as training sees them
    m = DiagonalAlignment(len(sv), len(tv), family=get_method(method).family(), dim=8)
    params, _ = base.init_params(m, jb, jax.random.PRNGKey(1))
    return m, params, b, jb, (sv, tv)


def _joint_by_conditioning(m, params, jb):
    """log p(y_t, z_t = j | x) ``[S, B, T]``: the model run once per source position with the
    alignment conditioned there (no enumeration machinery)."""
    S = jb.src.shape[1]
    out = []
    for j in range(S):
        z = jnp.full(jb.tgt_out.shape, j)
        cond = handlers.condition(base.substitute_params(m.model, params), data={"align": z})
        tr = handlers.trace(handlers.seed(cond, 0)).get_trace(jb, enumerate_z=True)
        out.append(sum(s["fn"].log_prob(s["value"]) for s in tr.values()
                       if s["type"] == "sample"))
    return jnp.stack(out)


@pytest.mark.torch
def test_generic_exact_members_equal_brute_force_and_the_pyro_twin():
    m, params, b, jb, _ = _tiny()
    joint = _joint_by_conditioning(m, params, jb)  # [S, B, T], −inf on masked sources
    ll = base.exact_token_log_likelihood(m, params, jb)
    want = jnp.where(jb.tgt_mask, jax.nn.logsumexp(joint, 0), 0.0)
    np.testing.assert_allclose(ll, want, rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(ll)[b.size:] == 0)  # padded rows contribute nothing
    post = base.exact_posterior(m, params, jb)
    np.testing.assert_allclose(np.asarray(post)[jb.tgt_mask],
                               np.asarray(jax.nn.softmax(joint, 0).transpose(1, 2, 0))[
                                   jb.tgt_mask], atol=1e-5)
    S_real = b.src.shape[1]
    assert np.all(np.asarray(post)[: b.size, :, S_real:] == 0)  # zero on padded sources
    prior = base.prior_probs(m, params, jb)
    np.testing.assert_allclose(np.asarray(prior).sum(-1), 1.0, atol=1e-5)
    draws = base.posterior_samples(m, params, jb, 4000, jax.random.PRNGKey(0))
    freq = np.asarray(jax.nn.one_hot(draws, post.shape[-1]).mean(0))
    real = np.asarray(jb.tgt_mask)
    assert np.abs(freq - np.asarray(post))[real].max() < 0.05  # draws follow the marginals
    # the Pyro twin on the same weights (moved by name) gives the same numbers
    import torch
    from diagonal import DiagonalAlignment as PyroDiagonal

    from ppl_attention.numpyro.inference.twins import state_dict_from_params
    from ppl_attention.pyro.inference import get_method as pyro_method
    from ppl_attention.pyro.models import base as pyro_base

    tm = PyroDiagonal(m.src_vocab, m.tgt_vocab, family=pyro_method("vae-enum").family(), dim=8)
    tm.load_state_dict(state_dict_from_params(m, params, tm))
    tb = dataclasses.replace(b, **{f: torch.as_tensor(getattr(b, f)) for f in
                                   ("src", "src_mask", "tgt_in", "tgt_out", "tgt_mask")})
    with torch.no_grad():
        ll_t = pyro_base.exact_token_log_likelihood(tm, tb).numpy()
        post_t = pyro_base.exact_posterior(tm, tb).numpy()
    B, T = b.tgt_out.shape
    np.testing.assert_allclose(np.asarray(ll)[:B, :T], ll_t, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(post)[:B, :T, :S_real], post_t, atol=1e-5)


def test_safe_log_is_finite_at_zero_and_the_same_under_jit():
    """log 0 ↦ a finite floor, eagerly and under ``jax.jit``. Planted fault, caught: the floor
    1e-38 (subnormal in float32) — −inf eagerly, NaN under ``jax.jit`` on JAX 0.12, where it
    made ``analyze`` draw impossible positions."""
    from ppl_attention.numpyro.distributions import safe_log

    x = jnp.asarray([0.0, 1e-30, 0.5, 1.0], jnp.float32)
    eager, jitted = np.asarray(safe_log(x)), np.asarray(jax.jit(safe_log)(x))
    assert np.all(np.isfinite(eager)) and np.array_equal(eager, jitted)
    np.testing.assert_allclose(eager[1:], np.log([1e-30, 0.5, 1.0]), rtol=1e-6)


def test_exact_posterior_draws_under_jit_follow_the_marginals():
    """Draws of :func:`base.posterior_samples` compiled by ``jax.jit`` (as ``analyze`` runs
    them): never at a position of probability 0, frequencies within 0.05 of the marginals."""
    m, params, _, jb, _ = _tiny()
    post = np.asarray(base.exact_posterior(m, params, jb))
    draws = jax.jit(lambda p, b, k: base.posterior_samples(m, p, b, 4000, k))(
        params, jb, jax.random.PRNGKey(3))
    freq = np.asarray(jax.nn.one_hot(draws, post.shape[-1]).mean(0))
    real = np.asarray(jb.tgt_mask)
    assert np.all(freq[real][post[real] == 0] == 0)
    assert np.abs(freq - post)[real].max() < 0.05


def test_parameters_are_found_from_the_programs_and_a_missing_one_is_named():
    m, params, _, jb, _ = _tiny()
    assert set(params) == {"embed", "out_w", "out_b", "log_tension", "q_bilinear", "q_embed"}
    assert float(params["log_tension"]) == pytest.approx(math.log(4.0))
    del params["out_b"]
    with pytest.raises(ValueError, match="parameter 'out_b' is not in the param map"):
        base.exact_token_log_likelihood(m, params, jb)


def _compare(tmp_path_factory, data_dir, spec):
    out = tmp_path_factory.mktemp("numpyro-model") / "cmp"
    assert main(["compare", "--model", spec, "--data-dir", str(data_dir), "--methods",
                 "exact,vae-enum,hard-enum", "--out", str(out), *SMALL]) == 0
    return out


@pytest.fixture(scope="module")
def compared(tmp_path_factory, data_dir):
    return _compare(tmp_path_factory, data_dir, NUMPYRO_SPEC)


def test_a_numpyro_model_through_compare_evaluate_align_analyze_diagnose(compared, data_dir,
                                                                         capsys, tmp_path):
    _through_every_tool(compared, data_dir, NUMPYRO_SPEC, capsys, tmp_path)


@pytest.mark.torch
def test_a_numpyro_runs_analysis_equals_its_pyro_twins(compared, data_dir):
    """The same run's guide read through its Pyro twin (weights moved by name): the same exact
    quantities — the NumPyro analysis path against the Pyro one."""
    run = compared / "runs" / "vae-enum-seed0"
    from diagonal import DiagonalAlignment as PyroDiagonal

    from ppl_attention.analysis import guide_diagnostics
    from ppl_attention.common.runs import Run
    from ppl_attention.data import read_pharaoh, read_tsv
    from ppl_attention.numpyro.inference.twins import state_dict_from_params
    from ppl_attention.pyro.inference import get_method as pyro_method

    r_np = Run.load(run)
    tm = PyroDiagonal(**r_np.model.config, family=pyro_method("vae-enum").family())
    tm.load_state_dict(state_dict_from_params(r_np.model, r_np.params, tm))
    r_t = Run(tm, "vae-enum", r_np.src_vocab, r_np.tgt_vocab)
    pairs = read_tsv(data_dir / "test.tsv")
    gold = read_pharaoh(data_dir / "test.align")
    d_np, d_t = (guide_diagnostics(r, pairs, gold, num_samples=8, progress=False)
                 for r in (r_np, r_t))
    for key in ("kl_exact_q", "log_lik"):
        assert d_np[key] == pytest.approx(d_t[key], rel=1e-4, abs=1e-6), key


@pytest.mark.integration
def test_a_numpyro_model_written_from_the_docs_alone_through_every_tool(tmp_path_factory,
                                                                        data_dir, capsys,
                                                                        tmp_path):
    """tests/models/content_numpyro.py: a content-based aligner a new user wrote from README and
    docs/architecture.md alone (not the tutorial's model)."""
    spec = f"{ROOT / 'tests' / 'models' / 'content_numpyro.py'}:ContentAlignment"
    _through_every_tool(_compare(tmp_path_factory, data_dir, spec), data_dir, spec, capsys,
                        tmp_path)


def _through_every_tool(compared, data_dir, spec, capsys, tmp_path):
    capsys.readouterr()
    rows = {r.split(",")[0]: r.split(",") for r in
            (compared / "results.csv").read_text().splitlines()[1:]}
    assert set(rows) == {"exact", "vae-enum", "hard-enum"}
    assert all(r[2] == "ok" for r in rows.values())
    head = (compared / "results.csv").read_text().splitlines()[0].split(",")
    for r in rows.values():  # each run's compilations, one per shape it recorded
        assert 1 <= int(r[head.index("compilations")]) <= 4
        assert float(r[head.index("compile_seconds")]) > 0
    assert "| compiled ms/step | compile s | compilations |" in \
        (compared / "results.md").read_text()
    run = compared / "runs" / "vae-enum-seed0"
    config = json.loads((run / "config.json").read_text())
    assert config["train"]["backend"] == "numpyro" and config["model_class"] == spec
    assert (run / "params.npz").exists() and not (run / "checkpoint.pt").exists()
    # evaluate (backend taken from the run) reproduces the job's report, exactly
    assert main(["evaluate", str(run), "--data-dir", str(data_dir), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    job = json.loads((run / "state.json").read_text())["extra"]["test_report"]
    assert rep["backend"] == "numpyro" and rep["exact"] is True
    assert rep["nll_per_token"] == pytest.approx(job["nll_per_token"], rel=1e-6)
    assert rep["elbo_per_token"] <= -rep["nll_per_token"] + 1e-6
    assert 0.0 <= rep["aer"] <= 1.0
    # a NumPyro model has no Pyro program: --backend pyro is refused, before any work
    assert main(["evaluate", str(run), "--backend", "pyro"]) == 2
    assert "is a NumPyro model: it runs under --backend numpyro only" in capsys.readouterr().err
    # align: one Pharaoh line per pair, a link for every target token
    assert main(["align", str(compared / "runs" / "exact-seed0"), "--data",
                 str(data_dir / "test.tsv")]) == 0
    lines = capsys.readouterr().out.splitlines()
    pairs = (data_dir / "test.tsv").read_text().splitlines()
    assert len(lines) == len(pairs)
    assert all(len(line.split()) == len(p.split("\t")[1].split()) for line, p in zip(lines, pairs))
    # analyze: ArviZ's posterior.nc with exact posterior draws, q draws, per-token log-lik
    an = tmp_path / "an"
    assert main(["analyze", str(run), "--out", str(an), "--num-samples", "40"]) == 0
    import arviz as az

    idata = az.from_netcdf(an / "posterior.nc")
    assert idata.posterior.attrs["inference_library"] == "numpyro"
    a = idata.posterior["alignment"].values  # one-hot draws, NaN on padding
    assert np.allclose(np.nansum(a, -1)[~np.isnan(a).all(-1)], 1.0)
    assert "alignment_q" in idata.posterior
    assert arviz_api.has_group(idata, "exact_posterior")
    assert idata.log_likelihood["y"].shape[-1] == idata.observed_data["y"].shape[0]
    if arviz_api.arviz_major() == 0:
        assert np.isfinite(az.loo(idata).elpd_loo)
    else:  # 1.x reads the group the same way; its Pareto fit refuses log-likelihoods with
        # too few distinct values over the draws (one-hot alignments: CHANGELOG.md)
        from arviz_stats import get_log_likelihood

        assert get_log_likelihood(idata, var_name="y").dims == ("chain", "draw", "token")
    # diagnose: KL(exact ‖ q) ≥ 0 and log p − ELBO ≥ 0 (up to the draws)
    assert main(["diagnose", str(run), str(compared / "runs" / "hard-enum-seed0"),
                 "--num-samples", "20", "--out", str(tmp_path / "new" / "d.md")]) == 0
    diag = json.loads((tmp_path / "new" / "d.json").read_text())  # its folder made
    assert all(d["kl_exact_q"] >= -1e-6 and d["log_lik_exact"] for d in diag)
    assert all(d["elbo_gap"] >= -0.05 for d in diag)  # ELBO ≤ log p, up to draws


@pytest.mark.torch
@pytest.mark.integration
def test_check_twin_passes_on_the_tutorial_pair(capsys):
    """Three loss kinds of the NumPyro loop: enumerated in the model, a sampled reparameterized
    guide at the Pyro guide's draws, a closed-form KL with the family's own parameters (every
    method both train: the integration tier below, and docs/results.md)."""
    capsys.readouterr()
    assert main(["check-twin", PYRO_SPEC, NUMPYRO_SPEC, "--task", "reorder", "--methods",
                 "exact,vae-gumbel,bam-weibull", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["method"] for r in rows] == ["exact", "vae-gumbel", "bam-weibull"]
    assert all(r["ok"] and r["grad_rel"] <= 1e-4 and r["loss_rel"] <= 1e-4 for r in rows)
    assert [r["sampled"] for r in rows] == [False, True, True]


@pytest.mark.torch
@pytest.mark.integration
@pytest.mark.parametrize("pair", [(PYRO_SPEC, NUMPYRO_SPEC, []),
                                  ("seq2seq", "ppl_attention.numpyro.models:Seq2SeqAlignment",
                                   ["--option", "hidden=8"])], ids=["tutorial", "seq2seq"])
def test_check_twin_passes_for_every_method_both_train(pair, capsys):
    capsys.readouterr()
    pyro_spec, numpyro_spec, opts = pair
    main(["check-twin", pyro_spec, numpyro_spec, "--task", "reorder", "--json", *opts])
    rows = json.loads(capsys.readouterr().out)
    known = TWIN_KNOWN_DIFFERENCES[pyro_spec]
    rows = [r for r in rows if r["method"] not in known]
    assert len(rows) >= 10 and all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
    assert max(max(r["loss_rel"], r["grad_rel"]) for r in rows) <= 1e-4


#: the methods whose Pyro and NumPyro steps are not compared, with why: SparseMAP over spans
#: and trees, whose q is not unique — an open defect, not a tolerance. Which decomposition each
#: backend reaches depends on rounding, so the difference is machine-dependent (the tree's
#: gradient agreed on CI's machine and differed by 3e-2 on another): no strict xfail can hold
#: it. (sparsemax's gradient on the tutorial model was one too, until a score on the support's
#: edge got one Jacobian on both backends: tests/structures/test_entmax.py.)
_NOT_UNIQUE = ("SparseMAP's q is not unique (its marginals are): the optimal face holds more "
               "structures than one decomposition uses, and the backends (float32 rounding "
               "apart) reach different ones, as the verification matrix's b cell states; the "
               "loss E_q[f] depends on the decomposition too (spans: 2.5e-4 relative)")
TWIN_KNOWN_DIFFERENCES = {
    PYRO_SPEC: {"spans-sparsemap": _NOT_UNIQUE},
    "seq2seq": {"spans-sparsemap": _NOT_UNIQUE, "tree-sparsemap": _NOT_UNIQUE},
}


@pytest.mark.torch
@pytest.mark.integration  # a whole pipeline: the second tier
def test_check_twin_fails_on_a_twin_that_differs(tmp_path, capsys):
    bad = tmp_path / "bad_twin.py"
    text = (TUTORIAL / "diagonal_numpyro.py").read_text()
    assert text.count("context @ out_w + out_b") == 1
    bad.write_text(text.replace("context @ out_w + out_b", "context @ out_w - out_b"))
    assert main(["check-twin", PYRO_SPEC, f"{bad}:DiagonalAlignment", "--task", "reorder",
                 "--methods", "exact"]) == 1
    err = capsys.readouterr().err
    assert "differ beyond 0.0001: exact" in err


def _numpyro_fit(steps, resume=None, seed=0):
    from ppl_attention.numpyro.inference import fit

    task = make_task("reorder", n_train=40, n_eval=4, seed=2, min_len=3, max_len=5)
    sv = Vocab.build(s for s, _ in task.train.pairs)
    tv = Vocab.build(t for _, t in task.train.pairs)
    batches = make_batches(task.train.pairs, sv, tv, 8, shuffle=True, seed=0, array="numpy")
    model = resume.model if resume is not None else DiagonalAlignment(
        len(sv), len(tv), family=get_method("vae-enum").family(), dim=8)
    return fit(model, batches, "vae-enum", steps, seed, src_vocab=sv, tgt_vocab=tv,
               resume=resume, progress=False, valid_every=1000, lr=0.05,
               lr_schedule="constant")


def test_a_numpyro_run_saved_and_resumed_gives_the_identical_next_losses(tmp_path):
    from ppl_attention.common.runs import Run

    straight = _numpyro_fit(6)
    part = _numpyro_fit(4)
    part.save(tmp_path / "run", complete=False)
    resumed = Run.load(tmp_path / "run", which="last", partial=True)
    assert resumed.step == 4 and resumed.optimizer_state["numpyro_leaves"]
    cont = _numpyro_fit(6, resume=resumed)
    assert [h["train_loss"] for h in cont.history] == [h["train_loss"] for h in straight.history]
    for k in straight.params:
        np.testing.assert_array_equal(np.asarray(cont.params[k]), np.asarray(straight.params[k]))


@pytest.mark.parametrize("spec", [pytest.param("seq2seq", marks=pytest.mark.integration),
                                  NUMPYRO_SPEC], ids=["seq2seq-twin", "tutorial"])
def test_a_numpyro_run_killed_and_resumed_gives_the_identical_next_losses(spec, tmp_path,
                                                                         data_dir, monkeypatch,
                                                                         capsys):
    """``train --checkpoint-every 2`` killed after its 4th step, then ``--resume``d: the same
    losses as the run never stopped (the NumPyro tutorial model in the default tier; the
    built-in twin under --backend numpyro in the integration tier)."""
    nfit = importlib.import_module("ppl_attention.numpyro.inference.fit")  # not the function
    extra = ["--backend", "numpyro", "--hidden", "8"] if spec == "seq2seq" else ["--dim", "8"]
    cmd = ["train", "--model", spec, "--data-dir", str(data_dir), "--method", "vae-enum",
           "--steps", "6", "--batch-size", "16", "--valid-every", "3", *extra]
    assert main([*cmd, "--out", str(tmp_path / f"{spec[-5:]}-straight")]) == 0
    straight = json.loads((tmp_path / f"{spec[-5:]}-straight" / "metrics.json").read_text())
    calls = {"n": 0}
    real = nfit.batch_order

    def dies_at_step_4(*a, real=real, calls=calls):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt  # killed while training its 5th step
        return real(*a)

    monkeypatch.setattr(nfit, "batch_order", dies_at_step_4)
    out = tmp_path / f"{spec[-5:]}-killed"
    with pytest.raises(KeyboardInterrupt):
        main([*cmd, "--out", str(out), "--checkpoint-every", "2"])
    monkeypatch.setattr(nfit, "batch_order", real)
    assert (out / "PARTIAL").exists() and not (out / "COMPLETE").exists()
    assert main([*cmd, "--out", str(out), "--checkpoint-every", "2", "--resume"]) == 0
    resumed = json.loads((out / "metrics.json").read_text())
    assert [h["train_loss"] for h in resumed["history"]] == \
        [h["train_loss"] for h in straight["history"]]
    assert [h.get("valid_nll") for h in resumed["history"]] == \
        [h.get("valid_nll") for h in straight["history"]]


BAD_GUIDE = '''
from diagonal_numpyro import DiagonalAlignment as Base
class NoGuide(Base):
    guide = None
'''
BAD_OPTION = '''
from diagonal_numpyro import DiagonalAlignment as Base
class NoDefault(Base):
    def __init__(self, src_vocab, tgt_vocab, *, family, dim: int, tension: float = 4.0):
        super().__init__(src_vocab, tgt_vocab, family=family, dim=dim, tension=tension)
'''
BAD_SHAPE = '''
import numpyro
from diagonal_numpyro import DiagonalAlignment as Base
class WrongShape(Base):
    def exact_token_log_likelihood(self, batch):
        return numpyro.param("out_b", None)[: batch.src.shape[0]]  # [B], not [B, T]
'''


def test_bad_numpyro_models_are_refused_in_one_line_before_any_work(tmp_path, capsys,
                                                                     monkeypatch):
    monkeypatch.syspath_prepend(str(TUTORIAL))
    cases = [(BAD_GUIDE, "NoGuide", "no guide(batch, *, posterior, enumerate_z, kl_scale)"),
             (BAD_OPTION, "NoDefault", "option(s) dim of __init__ have no default"),
             (BAD_SHAPE, "WrongShape", "WrongShape.exact_token_log_likelihood returned shape")]
    for i, (text, cls, msg) in enumerate(cases):
        f = tmp_path / f"bad{i}.py"
        f.write_text(text)
        out = tmp_path / f"out{i}"
        assert main(["train", "--model", f"{f}:{cls}", "--task", "reorder", "--method", "exact",
                     "--steps", "2", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert msg in err and len(err.strip().splitlines()) == 1, err
        assert not out.exists()


def test_a_run_directory_holds_plain_arrays_only(compared, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(compared / "runs" / "exact-seed0", run)
    np.savez(run / "params.npz", **{"last/embed": np.array([object()], dtype=object)})
    assert main(["evaluate", str(run)]) == 2
    assert "holds pickled objects, not plain arrays; refusing" in capsys.readouterr().err


def test_compilation_cache_follows_its_environment_variable(tmp_path, monkeypatch):
    nfit = importlib.import_module("ppl_attention.numpyro.inference.fit")  # not the function
    before = jax.config.jax_compilation_cache_dir
    try:
        for value, want in (("off", None), (str(tmp_path / "c"), str(tmp_path / "c"))):
            monkeypatch.setenv(nfit.CACHE_ENV, value)
            nfit.enable_compilation_cache.cache_clear()
            assert nfit.enable_compilation_cache() == want
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "c")
        assert (tmp_path / "c").is_dir()
    finally:
        nfit.enable_compilation_cache.cache_clear()
        jax.config.update("jax_compilation_cache_dir", before)


def test_a_kept_traced_step_gives_the_steps_numbers_and_is_reused_only_under_its_key(tmp_path):
    """``PersistentStep`` (the training step kept with ``jax.export`` between runs): the loaded
    program gives the traced step's outputs to the bit, a second instance under the same key
    reads the file instead of tracing, another key (model, method, code) traces anew, a damaged
    file is traced again. Planted fault p1 — the key without ``identity`` — is caught here
    (`python tests/plant_faults.py p1`: CAUGHT, 1 failed)."""
    from ppl_attention.numpyro.inference.cache import PersistentStep

    traces = []

    def step(raw, opt, key, batch, n_tokens, lr, kl, kw=None):
        traces.append(1)
        g = jax.tree.map(lambda w: w * batch.sum() / n_tokens, raw)
        raw = jax.tree.map(lambda w, d: w - lr * d + kl * jax.random.normal(key, w.shape), raw, g)
        return raw, opt + 1, sum(jnp.sum(w) for w in jax.tree.leaves(raw))

    step.init = lambda raw: jnp.zeros(())
    raw = {"a": jnp.arange(3.0), "b": {"c": jnp.ones((2, 2))}}
    args = (jax.random.PRNGKey(0), jnp.arange(4.0), 3.0, 0.1, 0.5, None)
    want = jax.jit(step)(raw, step.init(raw), *args)
    first = PersistentStep(step, "model A vae-enum", tmp_path)
    got = first(raw, first.init(raw), *args)
    for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_array_equal(np.asarray(w), np.asarray(g))
    assert jax.tree.structure(got) == jax.tree.structure(want)
    files = sorted((tmp_path / "traced").glob("*.jaxexport"))
    assert len(files) == 1
    n = len(traces)
    again = PersistentStep(step, "model A vae-enum", tmp_path)
    got2 = again(raw, again.init(raw), *args)
    assert len(traces) == n  # loaded, not traced
    np.testing.assert_array_equal(np.asarray(got2[2]), np.asarray(want[2]))
    other = PersistentStep(step, "model B vae-enum", tmp_path)
    other(raw, other.init(raw), *args)
    assert len(traces) == n + 1 and len(list((tmp_path / "traced").glob("*.jaxexport"))) == 2
    files[0].write_bytes(b"damaged")
    damaged = PersistentStep(step, "model A vae-enum", tmp_path)
    got3 = damaged(raw, damaged.init(raw), *args)
    assert len(traces) == n + 2
    np.testing.assert_array_equal(np.asarray(got3[2]), np.asarray(want[2]))
