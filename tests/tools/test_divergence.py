"""Divergence is caught and named on both backends, and a run is never lost: the rules of
``core/divergence`` on numbers; a planted divergence (``--lr 1e9``) stopped at the step it
happened, the run written with finite weights and marked DIVERGED, every tool refusing it, the
comparison's row marked and no NaN in any JSON; an impossible figure (a model that pays itself a
bonus: a negative NLL) stopped as such; a model's ``extra_report`` that fails after training
leaving the trained run complete, and a NumPyro model's report reading its trained parameters."""

import json
import math
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from ppl_attention.cli import main
from ppl_attention.core import jsonio
from ppl_attention.core.divergence import (
    EXIT_DIVERGED,
    Diverged,
    check_figure,
    check_step,
)

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "examples" / "tutorial"
PYRO = f"{TUTORIAL / 'diagonal.py'}:DiagonalAlignment"
NUMPYRO = f"{TUTORIAL / 'diagonal_numpyro.py'}:DiagonalAlignment"
TINY = ["--task", "reorder", "--n-train", "100", "--batch-size", "32"]


def _strict(path: Path):
    """The JSON of ``path``, refusing NaN and ±Infinity (not JSON)."""
    def refuse(token):
        raise AssertionError(f"{path}: {token} is not JSON")
    return json.loads(path.read_text(), parse_constant=refuse)


def test_the_rules_on_numbers():
    check_step(3, "m", 2.5, 10.0)  # a finite loss and norm pass
    check_step(3, "m", -0.4, 1.0)  # Monte Carlo noise below 0 is not impossible
    for loss, norm, what in [(math.nan, 1.0, "loss"), (math.inf, 1.0, "loss"),
                             (1.0, math.nan, "gradient norm"), (1.0, math.inf, "gradient norm")]:
        with pytest.raises(Diverged, match=f"step 3 \\(m\\): {what} = (nan|inf)"):
            check_step(3, "m", loss, norm)
    with pytest.raises(Diverged, match="exploded") as e:
        check_step(7, "m", 3.0e5, 1.0, first_loss=3.0)  # 10⁵ × the first step's
    assert e.value.exploded and not e.value.impossible
    check_step(7, "m", 2.9e4, 1.0, first_loss=3.0)  # < 10⁴ × 3: not exploded
    with pytest.raises(Diverged, match="impossible"):
        check_step(2, "m", -6.0, 1.0)  # a batch mean of −6 nats per token
    check_step(2, "m", -6.0, 1.0, discrete=False)  # continuous observations: no such bound
    with pytest.raises(Diverged, match="impossible"):
        check_figure(5, "m", "validation NLL per token", -0.01)
    check_figure(5, "m", "validation NLL per token", -1e-4)  # rounding
    with pytest.raises(Diverged, match="not finite"):
        check_figure(5, "m", "test NLL per token", math.nan)
    rec = Diverged(4, "vae-enum", "loss", math.nan, hint="a smaller --lr").record()
    assert json.loads(jsonio.dumps(rec))["value"] == "nan"  # a string, never NaN in JSON
    assert jsonio.dumps({"a": math.nan, "b": [math.inf, 1.0]}) == '{"a": null, "b": [null, 1.0]}'


@pytest.mark.parametrize("spec", [PYRO, NUMPYRO], ids=["pyro", "numpyro"])
def test_a_planted_divergence_is_stopped_named_and_refused(spec, tmp_path, capsys):
    run = tmp_path / "run"
    rc = main(["train", "--model", spec, *TINY, "--method", "vae-enum", "--lr", "1e9",
               "--steps", "6", "--out", str(run)])
    err = capsys.readouterr().err
    assert rc == EXIT_DIVERGED, err
    line = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(line) == 1 and "training diverged at step 2 (vae-enum)" in line[0]
    assert "smaller --lr" in line[0]
    assert (run / "DIVERGED").exists() and not (run / "COMPLETE").exists()
    rec = _strict(run / "DIVERGED")
    assert rec["step"] == 2 and rec["kept_step"] == 1 and rec["method"] == "vae-enum"
    history = _strict(run / "metrics.json")["history"]
    assert [h["step"] for h in history] == [1] and math.isfinite(history[0]["train_loss"])
    for name in ("config.json", "state.json"):
        if (run / name).exists():
            _strict(run / name)
    if (run / "checkpoint.pt").exists():  # the kept weights are the finite ones of step 1
        state = torch.load(run / "checkpoint.pt", weights_only=True)["model"]
        assert all(torch.isfinite(v).all() for v in state.values())
    else:
        from ppl_attention.core.arrays import load_arrays

        last = load_arrays(run / "params.npz")["last"]
        assert all(np.isfinite(np.asarray(v)).all() for v in last.values())
    for cmd in (["evaluate", str(run)], ["align", str(run), "--data", str(run / "none.tsv")],
                ["train", "--model", spec, *TINY, "--method", "vae-enum", "--steps", "6",
                 "--out", str(run), "--resume"]):
        assert main(cmd) == 2
        err = capsys.readouterr().err
        assert "diverged at step 2" in err and "retrain" in err, cmd


def test_compare_marks_a_diverged_row_and_leaves_it_out(tmp_path, capsys):
    out = tmp_path / "cmp"
    rc = main(["compare", "--model", PYRO, *TINY, "--methods", "exact,soft", "--steps", "4",
               "--lr", "1e9", "--out", str(out)])
    assert rc == EXIT_DIVERGED
    md = (out / "results.md").read_text()
    assert "| exact | diverged at step 2 |" in md and "| soft | diverged at step" in md
    csv = (out / "results.csv").read_text().splitlines()[1:]
    assert all(",diverged," in row for row in csv)
    assert not (out / "nll.png").exists()  # no run to draw
    # a rerun keeps them (the same options diverge again) and trains nothing
    assert main(["compare", "--model", PYRO, *TINY, "--methods", "exact,soft", "--steps", "4",
                 "--lr", "1e9", "--out", str(out)]) == EXIT_DIVERGED
    assert "2 of 2 jobs already complete" in capsys.readouterr().err
    # another learning rate into the same --out is another experiment: refused
    assert main(["compare", "--model", PYRO, *TINY, "--methods", "exact,soft", "--steps", "4",
                 "--lr", "0.05", "--out", str(out)]) == 2
    assert "lr=1000000000.0" in capsys.readouterr().err
    # so is one without --lr (its default) after one with it
    assert main(["compare", "--model", PYRO, *TINY, "--methods", "exact,soft", "--steps", "4",
                 "--out", str(out)]) == 2
    assert "lr (default)" in capsys.readouterr().err


BONUS = '''
import pyro
import torch
import sys
sys.path.insert(0, {tutorial!r})
from diagonal import DiagonalAlignment


class Bonus(DiagonalAlignment):
    """The tutorial's model paying itself 10 nats a token: p(y | x) > 1, impossible."""

    def model(self, batch, *, enumerate_z=False, kl_scale=1.0):
        super().model(batch, enumerate_z=enumerate_z, kl_scale=kl_scale)
        pyro.factor("bonus", 10.0 * batch.tgt_mask.sum().to(torch.get_default_dtype()))
'''


def test_an_impossible_figure_stops_the_run(tmp_path, capsys):
    path = tmp_path / "bonus.py"
    path.write_text(textwrap.dedent(BONUS.format(tutorial=str(TUTORIAL))))
    run = tmp_path / "run"
    assert main(["train", "--model", f"{path}:Bonus", *TINY, "--method", "exact", "--steps",
                 "3", "--out", str(run)]) == EXIT_DIVERGED
    err = capsys.readouterr().err
    assert "step 1 (exact): −ELBO per token = -" in err and "an impossible figure" in err
    assert _strict(run / "DIVERGED")["impossible"] is True


FAILING_REPORT = '''
import sys
import jax.numpy as jnp
import numpyro
sys.path.insert(0, {tutorial!r})
from diagonal_numpyro import DiagonalAlignment


class Reporting(DiagonalAlignment):
    """The tutorial's NumPyro model with a report of its own: the learned tension λ (read
    through numpyro.param, which returns the trained value), or a failure."""

    def __init__(self, src_vocab, tgt_vocab, *, family, dim: int = 32, tension: float = 4.0,
                 fail: bool = False):
        super().__init__(src_vocab, tgt_vocab, family=family, dim=dim, tension=tension)
        self.fail = fail

    def extra_report(self, batches):
        if self.fail:
            raise RuntimeError("the report of my own model is broken")
        lam = jnp.exp(numpyro.param("log_tension", jnp.log(self.tension)))
        return {{"tension": float(lam), "n_batches": len(batches)}}
'''


@pytest.mark.integration  # a whole pipeline: the second tier
def test_a_numpyro_models_report_reads_its_trained_parameters_or_fails_without_losing_the_run(
        tmp_path, capsys):
    from ppl_attention.core.arrays import load_arrays

    path = tmp_path / "reporting.py"
    path.write_text(textwrap.dedent(FAILING_REPORT.format(tutorial=str(TUTORIAL))))
    spec = f"{path}:Reporting"
    run = tmp_path / "ok"
    assert main(["train", "--model", spec, *TINY, "--method", "exact", "--steps", "3",
                 "--valid-every", "3", "--lr", "0.2", "--out", str(run)]) == 0
    rep = json.loads(capsys.readouterr().out.split("\nwrote")[0])
    best = load_arrays(run / "params.npz")["best"]
    trained = float(np.exp(np.asarray(best["log_tension"])))
    assert rep["tension"] == pytest.approx(trained, rel=1e-6) and rep["tension"] != 4.0
    bad = tmp_path / "bad"
    assert main(["train", "--model", spec, *TINY, "--method", "exact", "--steps", "3",
                 "--out", str(bad), "--fail"]) == 1
    err = capsys.readouterr().err
    assert "the model's extra_report failed: RuntimeError: the report of my own model is " \
           "broken" in err and "the run is trained and written (COMPLETE" in err
    assert (bad / "COMPLETE").exists() and (bad / "params.npz").exists()
    assert _strict(bad / "metrics.json")["history"][-1]["step"] == 3
