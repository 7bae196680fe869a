"""The model contract: a model written outside the package (the tutorial's, in examples/) through
every command and the Python API; the generic capabilities against brute force and against the
built-in model's own members; bad models, bad options and unsafe run directories refused before
any work."""

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyro
import pytest
import torch
from conftest import require_ray

from ppl_attention.cli import main
from ppl_attention.common.registry import load_model_class
from ppl_attention.data import Vocab, make_batches, make_task
from ppl_attention.pyro.inference import get_method
from ppl_attention.pyro.models import base

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "examples" / "tutorial"
SPEC = f"{TUTORIAL / 'diagonal.py'}:DiagonalAlignment"
SMALL = ["--steps", "30", "--batch-size", "32", "--valid-every", "15", "--lr", "0.05"]


@pytest.fixture(scope="module")
def compared(tmp_path_factory, data_dir):
    out = tmp_path_factory.mktemp("tutorial") / "cmp"
    assert main(["compare", "--model", SPEC, "--data-dir", str(data_dir), "--methods",
                 "exact,vae-enum,soft", "--out", str(out), *SMALL]) == 0
    return out


def test_a_users_model_through_compare_evaluate_align_analyze_diagnose(compared, data_dir,
                                                                       capsys, tmp_path):
    capsys.readouterr()
    rows = {r.split(",")[0]: r.split(",") for r in
            (compared / "results.csv").read_text().splitlines()[1:]}
    assert set(rows) == {"exact", "vae-enum", "soft"} and all(r[2] == "ok" for r in rows.values())
    runs = compared / "runs"
    config = json.loads((runs / "exact-seed0" / "config.json").read_text())
    assert config["model_class"] == SPEC  # the file by its full path, so the run reloads
    # evaluate reproduces the job's own report; the exact NLL is exact (enumeration)
    assert main(["evaluate", str(runs / "vae-enum-seed0"), "--data-dir", str(data_dir),
                 "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    job = torch.load(runs / "vae-enum-seed0" / "checkpoint.pt",
                     weights_only=True)["extra"]["test_report"]
    assert rep["exact"] is True and rep["nll_per_token"] == pytest.approx(job["nll_per_token"])
    assert rep["elbo_per_token"] <= -rep["nll_per_token"] + 1e-6  # ELBO ≤ log p
    # align: one Pharaoh line per pair, a link for every target token
    assert main(["align", str(runs / "exact-seed0"), "--data", str(data_dir / "test.tsv")]) == 0
    lines = capsys.readouterr().out.splitlines()
    pairs = (data_dir / "test.tsv").read_text().splitlines()
    assert len(lines) == len(pairs)
    for line, pair in zip(lines, pairs):
        n_tgt = len(pair.split("\t")[1].split())
        assert sorted(int(x.split("-")[1]) for x in line.split()) == list(range(n_tgt))
    # analyze: posterior.nc that ArviZ opens and scores, figures, diagnostics
    out = tmp_path / "an"
    assert main(["analyze", str(runs / "vae-enum-seed0"), "--data-dir", str(data_dir),
                 "--out", str(out), "--num-samples", "30"]) == 0
    import arviz as az

    idata = az.from_netcdf(out / "posterior.nc")
    post = idata.posterior["alignment"].values
    assert np.allclose(np.nansum(post, -1)[~np.isnan(post).all(-1)], 1.0)
    exact = idata.exact_posterior["alignment"].values
    assert np.nanmax(np.abs(np.nanmean(post[0], 0) - exact)) < 0.35  # 30 draws of it
    assert np.isfinite(az.loo(idata).elpd_loo)
    for name in ("pair0_heatmaps.png", "entropy.png", "diagnostics.json"):
        assert (out / name).stat().st_size > 0
    # diagnose: the trained guide against the exact posterior
    assert main(["diagnose", str(runs / "vae-enum-seed0"), "--data-dir", str(data_dir),
                 "--num-samples", "10"]) == 0
    table = capsys.readouterr().out
    kl = float(table.split("| vae-enum | ")[1].split(" |")[0])
    assert 0 <= kl < 10 and np.isfinite(kl)


@pytest.mark.integration  # an example run as a user runs it
def test_the_python_api_tutorial_runs(tmp_path):
    """examples/tutorial/tutorial.py (≤ 40 lines): three methods, evaluate, ArviZ summary, LOO
    and a plot."""
    assert len((TUTORIAL / "tutorial.py").read_text().splitlines()) <= 40
    res = subprocess.run([sys.executable, str(TUTORIAL / "tutorial.py"), "--steps", "20",
                          "--out", str(tmp_path / "forest.png")], capture_output=True,
                         text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    for method in ("exact", "vae-enum", "soft"):
        assert f"{method:>9}: NLL/token" in res.stdout
    assert "elpd_loo" in res.stdout and (tmp_path / "forest.png").stat().st_size > 0


def _tiny(model_cls, method, seed=0, n=5, **kw):
    task = make_task("reorder", n_train=30, n_eval=5, seed=seed, min_len=3, max_len=5)
    sv = Vocab.build(s for s, _ in task.train.pairs)
    tv = Vocab.build(t for _, t in task.train.pairs)
    torch.manual_seed(seed)
    m = model_cls(len(sv), len(tv), family=get_method(method).family(), **kw).double()
    (b,) = make_batches(task.train.pairs[:n], sv, tv, n)
    return m, b


def test_generic_exact_members_equal_brute_force_on_a_users_model():
    """Without members of its own, the tutorial's model gets log p(y_t | x), p(z_t | x, y) and
    p(z_t | x) from its program (one enumerated site): equal to Bayes' rule written out by hand
    from its prior scores and output layer; padded targets add 0."""
    cls = load_model_class(SPEC)
    m, b = _tiny(cls, "exact")
    assert {"exact-likelihood", "exact-posterior", "prior", "posterior-samples",
            "alignment"} <= base.capabilities(m)
    assert "predictive" not in base.capabilities(m)
    with torch.no_grad():
        ll = base.exact_token_log_likelihood(m, b)
        post = base.exact_posterior(m, b)
        prior = base.prior_probs(m, b)
        scores = m.prior_scores(b).masked_fill(~b.src_mask[:, None], -torch.inf)
        log_prior = scores.log_softmax(-1)  # [B, T, S]
        emis = m.out(m.embed(b.src)).log_softmax(-1)  # [B, S, V]
        emis = emis.gather(-1, b.tgt_out[:, None, :].expand(-1, b.src.shape[1], -1))
        joint = log_prior + emis.transpose(1, 2)  # [B, T, S]
    assert torch.allclose(ll, joint.logsumexp(-1).masked_fill(~b.tgt_mask, 0), atol=1e-10)
    real = b.tgt_mask
    assert torch.allclose(post[real], joint.softmax(-1)[real], atol=1e-10)
    assert torch.allclose(prior[real], log_prior.exp()[real], atol=1e-10)
    assert torch.all(post[real][~b.src_mask[:, None].expand_as(post)[real]] == 0)


@pytest.mark.parametrize("method", ["exact", "hmm-exact"])
def test_generic_exact_members_equal_the_built_in_models_own(method):
    """The generic path (the program enumerated under poutine.enum) gives the numbers the
    built-in Seq2SeqAlignment computes by hand — and where it cannot (a Markov chain's
    sites, folded into one factor by the forward algorithm) it refuses rather than computing
    something else, naming the member to implement."""
    from ppl_attention.pyro.models import Seq2SeqAlignment

    m, b = _tiny(Seq2SeqAlignment, method, hidden=8)
    m.eval()
    with torch.no_grad():
        own = m.exact_token_log_likelihood(b)
        if method == "hmm-exact":
            with pytest.raises(base.MissingCapability,
                               match="implement exact_token_log_likelihood"):
                base._enumerated_joint(m, b)
            return
        joint, enumerated = base._enumerated_joint(m, b)
    assert enumerated
    assert torch.allclose(joint.logsumexp(0), own, atol=1e-10)
    assert torch.allclose(joint.softmax(0).permute(1, 2, 0)[b.tgt_mask],
                          m.exact_posterior(b)[b.tgt_mask], atol=1e-10)


def test_markov_posterior_samples_are_exact_ffbs_draws():
    """The Markov family's posterior draws (forward filtering, backward sampling) have the
    frequencies of p(z | x, y) by brute force over all paths (chi-square), for a ragged batch."""
    from scipy.stats import chisquare

    from ppl_attention.pyro.models import Seq2SeqAlignment

    m, b = _tiny(Seq2SeqAlignment, "hmm-exact", n=4, hidden=8)
    m.eval()
    m.family.jump_logits.data = torch.tensor([0.5, -0.3, 0.2, 0.1], dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        draws = m.posterior_samples(b, 4000, g)  # [K, B, T]
        H = m.encode(b.src, b.src_mask)
        h, e, _ = m.decode(H, b.src_mask, b.tgt_in)
        emis = m.emission_table(h, H, b.tgt_out)
    lengths = b.tgt_mask.sum(-1)
    assert len(set(lengths.tolist())) > 1  # ragged
    assert torch.all(draws[:, ~b.tgt_mask] == 0)  # padded targets: no draw
    fam = m.family
    for row in range(b.size):
        T, S = int(lengths[row]), int(b.src_mask[row].sum())
        probs = {}
        for path in itertools.product(range(S), repeat=T):
            lp, prev = 0.0, None
            for t, j in enumerate(path):
                src = (e[row:row + 1, t], b.src_mask[row:row + 1])
                lt = (fam.start_log_probs(*src) if prev is None else
                      fam.transition_log_probs(*src, torch.tensor([prev])))[0]
                lp += float(lt[j]) + float(emis[row, t, j])
                prev = j
            if np.isfinite(lp):
                probs[path] = np.exp(lp)
        z = sum(probs.values())
        keys = sorted(probs, key=lambda k: -probs[k])
        expected = np.array([probs[k] / z for k in keys])
        seen = [tuple(d) for d in draws[:, row, :T].tolist()]
        counts = np.array([seen.count(k) for k in keys])
        assert counts.sum() == len(seen)  # no draw outside the support
        big = expected * len(seen) > 5
        obs = np.append(counts[big], counts[~big].sum())
        exp = np.append(expected[big], expected[~big].sum()) * len(seen)
        keep = exp > 0
        assert chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue > 1e-3


BAD_MODEL = '''
import torch
from torch import nn

class NoGuide(nn.Module):
    def __init__(self, src_vocab, tgt_vocab):
        super().__init__()

    def model(self, batch):
        pass
'''


def test_bad_models_are_refused_naming_what_is_missing(tmp_path, capsys):
    out = tmp_path / "never"
    bad = tmp_path / "bad.py"
    bad.write_text(BAD_MODEL)
    broken = tmp_path / "broken.py"
    broken.write_text("def oops(:\n")
    cases = [
        ("nope/missing.py:Model", "no such file nope/missing.py"),
        (f"{bad}:Missing", "has no class 'Missing' (classes there: NoGuide)"),
        (f"{broken}:Model", "importing"),
        ("no_such_pkg.mod:Model", "cannot import module 'no_such_pkg.mod'"),
        ("bogus", "not a model name"),
    ]
    for spec, msg in cases:
        assert main(["train", "--model", spec, "--task", "reorder", "--out", str(out)]) == 2
        assert msg in capsys.readouterr().err
    assert main(["train", "--model", f"{bad}:NoGuide", "--task", "reorder", "--out",
                 str(out)]) == 2
    err = capsys.readouterr().err
    for missing in ("__init__ takes no family", "no guide(batch, *, posterior, enumerate_z, "
                    "kl_scale) method", "model() takes no enumerate_z, kl_scale keyword"):
        assert missing in err
    assert len(err.strip().splitlines()) == 1
    # an option the user's model does not have; a backend it has no twin for; a capability
    # a command needs
    assert main(["train", "--model", SPEC, "--task", "reorder", "--hidden", "8", "--out",
                 str(out)]) == 2
    assert "unrecognized arguments: --hidden 8" in capsys.readouterr().err
    assert main(["train", "--model", SPEC, "--task", "reorder", "--backend", "numpyro",
                 "--out", str(out)]) == 2
    assert "DiagonalAlignment has no NumPyro twin" in capsys.readouterr().err
    assert main(["train", "--model", SPEC, "--task", "reorder", "--method", "hmm-exact",
                 "--out", str(out)]) == 2
    assert "does not declare it in `families`" in capsys.readouterr().err
    assert not out.exists()


def test_a_command_refuses_a_missing_capability_before_any_work(compared, tmp_path, capsys):
    words = tmp_path / "w.txt"
    words.write_text("s1 s2\n")
    assert main(["decode", str(compared / "runs" / "exact-seed0"), "--data", str(words)]) == 2
    assert "needs the capability 'predictive'" in capsys.readouterr().err
    assert main(["evaluate", str(compared / "runs" / "exact-seed0"), "--iwae-k", "5"]) == 2
    assert "which this evaluation does not compute" in capsys.readouterr().err


class _Payload:
    """Unpickling this runs code: it writes a file."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (Path.write_text, (Path(self.path), "pwned"))


def test_a_checkpoint_carrying_a_pickle_payload_is_refused_and_not_run(compared, tmp_path,
                                                                       capsys):
    """A run directory is data: a checkpoint.pt that unpickles to code is refused by every
    command that loads runs, and its payload never runs."""
    import shutil

    run = tmp_path / "evil"
    shutil.copytree(compared / "runs" / "exact-seed0", run)
    marker = tmp_path / "ran.txt"
    ckpt = torch.load(run / "checkpoint.pt", weights_only=True)
    ckpt["extra"]["note"] = _Payload(str(marker))
    torch.save(ckpt, run / "checkpoint.pt")  # pickles the payload with the weights
    data = compared.parent / "data.tsv"
    data.write_text("s1 s2\tt1\n")
    for argv in (["evaluate", str(run)], ["align", str(run), "--data", str(data)],
                 ["analyze", str(run), "--out", str(tmp_path / "a")],
                 ["diagnose", str(run), "--data", str(data)],
                 ["decode", str(run), "--data", str(data)],
                 ["train", "--model", SPEC, "--task", "reorder", "--resume", "--out", str(run),
                  "--steps", "40"]):
        assert main(argv) == 2, argv
        assert "holds pickled objects other than plain data" in capsys.readouterr().err
        assert not marker.exists()


def test_a_run_directory_never_names_a_model_file_inside_itself(compared, tmp_path, capsys):
    import shutil

    run = tmp_path / "r"
    shutil.copytree(compared / "runs" / "exact-seed0", run)
    (run / "model.py").write_text((TUTORIAL / "diagonal.py").read_text()
                                  + "\nopen(__file__ + '.ran', 'w')\n")
    cfg = json.loads((run / "config.json").read_text())
    cfg["model_class"] = f"{run / 'model.py'}:DiagonalAlignment"
    (run / "config.json").write_text(json.dumps(cfg))
    assert main(["evaluate", str(run)]) == 2
    assert "names a model file inside the run directory" in capsys.readouterr().err
    assert not (run / "model.py.ran").exists()


def test_no_tool_dispatches_on_model_or_family_names():
    """fit, Run, evaluate, analysis and the command line read declarations and capabilities:
    no comparison of a model's or family's name (a planted `family.name == "soft"` in any of
    them fails this test)."""
    import re

    pkg = ROOT / "ppl_attention"
    files = [pkg / "pyro" / "inference" / f for f in ("fit.py", "evaluate.py", "decode.py")]
    files += [pkg / "common" / "runs.py", pkg / "tools" / "experiment.py"]
    files += [*(pkg / "numpyro" / "inference").glob("*.py"), *(pkg / "common").glob("*.py")]
    files += list((pkg / "analysis").glob("*.py")) + list((pkg / "cli").glob("*.py"))
    pattern = re.compile(r"(family|model)\.name\s*(==|!=|in\b)|method\s*==\s*[\"']|"
                         r"isinstance\([^)]*,\s*(Soft|Categorical|Seq2SeqAlignment|"
                         r"AttentionSeqVAE|BAMClassifier|BayesianGAT)\)")
    hits = [f"{f.name}:{i}" for f in files for i, line in
            enumerate(f.read_text().splitlines(), 1) if pattern.search(line)]
    assert not hits, hits


def test_pyro_param_store_untouched_by_model_loading(compared):
    """Loading a run does not leave parameters behind in Pyro's global store."""
    from ppl_attention.pyro.inference import Run

    pyro.clear_param_store()
    Run.load(compared / "runs" / "exact-seed0")
    assert not list(pyro.get_param_store().keys())


@pytest.mark.integration
def test_a_users_model_file_travels_with_ray_jobs(tmp_path, data_dir):
    """`sweep --ray` with --model path/to/file.py:Class sends the file's bytes with every job:
    the job imports them, not the path (which a remote node would not have)."""
    import shutil

    require_ray()
    model = tmp_path / "mine" / "diagonal.py"
    model.parent.mkdir()
    shutil.copy(TUTORIAL / "diagonal.py", model)
    out = tmp_path / "ray"
    assert main(["sweep", "--model", f"{model}:DiagonalAlignment", "--data-dir", str(data_dir),
                 "--methods", "exact", "--ray", "local", *SMALL, "--out", str(out)]) == 0
    row = (out / "results.csv").read_text().splitlines()[1].split(",")
    assert row[2] == "ok"
    cfg = json.loads((out / "runs" / "exact-seed0" / "config.json").read_text())
    assert cfg["model_class"] == f"{model}:DiagonalAlignment"  # where it lives here
    cls = load_model_class("/no/such/node/path/diagonal.py:DiagonalAlignment",
                           source=model.read_bytes())
    assert cls.__name__ == "DiagonalAlignment"


def test_the_contract_tables_in_the_docs_are_the_registrys(monkeypatch):
    """docs/architecture.md holds the tables generated from the method registry, the family
    specs and the capabilities; changing a method's needs without regenerating them fails this
    test (shown here by planting one: hard-sample without its soft baseline)."""
    import dataclasses

    from ppl_attention.common import contract
    from ppl_attention.core import method_specs as methods

    docs = (ROOT / "docs" / "architecture.md").read_text()
    assert contract.contract_tables() in docs
    row = contract.method_rows(methods.METHOD_SPECS["hard-sample"])
    assert "soft_token_log_likelihood" in row[-1] and "baseline=[B, T]" in row[3]
    planted = dataclasses.replace(methods.METHOD_SPECS["hard-sample"], baseline=None)
    monkeypatch.setitem(methods.METHOD_SPECS, "hard-sample", planted)
    assert contract.contract_tables() not in docs
