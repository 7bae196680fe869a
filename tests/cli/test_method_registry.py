"""One method registry: ``train`` on a model's global latents and ``wordalign`` on a corpus read
the same declarations (core/method_specs.py) — the same option names, help and checks —, and a
method refuses an option it does not take, naming what it takes."""

import json

import pytest

from ppl_attention.cli import main
from ppl_attention.cli import wordalign as cli_wordalign
from ppl_attention.core.errors import UserError
from ppl_attention.core.method_specs import (
    GLOBAL_METHODS,
    METHOD_OPTIONS,
    global_method,
    options_help,
)


def _help(capsys, argv) -> str:
    try:
        main(argv + ["--help"])
    except SystemExit:
        pass
    return " ".join(capsys.readouterr().out.split())


def test_train_and_wordalign_read_the_same_declarations(capsys):
    train = _help(capsys, ["train", "--model", "word-hmm", "--method", "gibbs"])
    align = _help(capsys, ["wordalign"])
    for text, command in ((train, "train"), (align, "wordalign")):
        assert " ".join(options_help("warmup", command).split()) in text
    # each command's own default, declared once; wordalign's sweeps scale with the corpus
    assert "gibbs 200" in train and "gibbs 2500/√pairs (at least 2)" in align
    assert "--warmup" in train and "--warmup" in align
    # every wordalign method has a runner, and every runner is a registry method
    assert set(cli_wordalign.RUNNERS) == {n for n, m in GLOBAL_METHODS.items()
                                         if m.serves("wordalign")}


def test_sweeps_scale_with_the_corpus_as_eflomals():
    """eflomal's sampling length, 5000/√pairs sweeps in all: half warm-up, half kept."""
    from ppl_attention.core.method_specs import at_corpus

    opts = global_method("gibbs").resolve("wordalign", {})
    assert {n: at_corpus(opts, n)["warmup"] for n in (1, 100, 10_000, 100_000, 10**8)} == \
        {1: 2500, 100: 250, 10_000: 25, 100_000: 8, 10**8: 2}
    given = global_method("gibbs").resolve("wordalign", {"samples": 7})
    assert at_corpus(given, 100_000)["samples"] == 7 and at_corpus(given, 100)["warmup"] == 250


def test_a_method_takes_only_its_options():
    assert global_method("gibbs").resolve("wordalign", {"warmup": 3})["warmup"] == 3
    assert global_method("gibbs").resolve("train", {})["samples"] == 1000
    with pytest.raises(UserError, match=r"--tol does not apply to --method nuts \(it takes "
                       r"--chains, --warmup, --samples\)"):
        global_method("nuts").resolve("train", {"tol": 0.1})
    with pytest.raises(UserError, match="does not run under `train`"):
        global_method("svb").resolve("train", {})
    with pytest.raises(UserError, match="--chains must be ≥ 1, got 0"):
        global_method("gibbs").resolve("train", {"chains": 0})
    with pytest.raises(UserError, match=r"--kappa must be in \(0.5, 1\], got 1.5"):
        METHOD_OPTIONS["kappa"].check(1.5)
    # planted: an option the registry does not define is refused at declaration
    with pytest.raises(UserError, match="METHOD_OPTIONS"):
        type(GLOBAL_METHODS["vb"])("x", "x", "vb", {"train": {"burn_in": 5}})


def test_train_takes_the_method_options(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--model", "word-ibm1", "--method", "gibbs", "--task", "reorder",
                 "--n-train", "12", "--warmup", "2", "--samples", "3", "--chains", "1",
                 "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())["train"]
    assert (config["warmup"], config["samples"], config["chains"]) == (2, 3, 1)
    capsys.readouterr()
    assert main(["train", "--model", "word-ibm1", "--method", "svi-delta", "--task", "reorder",
                 "--warmup", "2", "--out", str(tmp_path / "svi")]) == 2
    err = capsys.readouterr().err
    assert "--warmup does not apply to --method svi-delta (it takes --samples)" in err, err
    assert not (tmp_path / "svi").exists()
