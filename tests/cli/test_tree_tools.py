"""Trees right in every tool, on a tree model a user writes (``tests/models/head_tagger.py``: the
labels of a tree's words observed through a categorical site, its emission factoring over arcs):
a ``tree-exact`` run validated and scored by its exact likelihood log Z(θ + φ) − log Z(θ) with no
extra member; ``align`` writing the exact posterior's MAP tree (θ + φ); gold trees beside a
``--data-dir`` (``test.conllu``) scored as UAS; the generic ``simulate`` drawing one tree per
sentence; ``calibrate`` of the exact tree posterior calibrated and a planted distortion (arc
scores × ¼: an under-confident posterior) caught; a ``tree-marginals`` run scored by its own
program (``enumerate_z=False``), not by the model's ``enumerate_z=True`` branch."""

import json
import sys
from pathlib import Path

import numpy as np
import pyro
import pytest
import torch

from ppl_attention.analysis.sbc import calibrate, planted
from ppl_attention.cli import main
from ppl_attention.core.errors import DataError
from ppl_attention.core.heads import check_trees
from ppl_attention.data import make_batches
from ppl_attention.data.conllu import format_conllu, read_conllu
from ppl_attention.pyro.inference import Run
from ppl_attention.pyro.models.base import exact_token_log_likelihood, simulate
from ppl_attention.pyro.trees import DependencyTree, tree_log_likelihood

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "models"))
from tagged_trees import write_tagged_trees  # noqa: E402

SPEC = f"{ROOT / 'tests' / 'models' / 'head_tagger.py'}:HeadTagger"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A corpus of formulas whose target labels each word with its head's token (``root`` for
    the root's child), gold trees as ``{split}.conllu``."""
    return write_tagged_trees(tmp_path_factory.mktemp("tagger"), 160, 40)


@pytest.fixture(scope="module")
def runs(data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    for m in ("tree-exact", "tree-marginals"):
        assert main(["train", "--model", SPEC, "--data-dir", str(data_dir), "--method", m,
                     "--steps", "40", "--lr", "0.05", "--valid-every", "20",
                     "--out", str(out / m)]) == 0
    return out


def _test_batches(run, data_dir):
    from ppl_attention.data.kinds import data_kind

    split = data_kind("pairs").evaluation_split({}, data_dir=data_dir)
    return split, make_batches(split.pairs, run.src_vocab, run.tgt_vocab, 64)


def test_tree_exact_is_scored_and_aligned_by_its_exact_posterior(runs, data_dir, capsys):
    path = runs / "tree-exact"
    run = Run.load(path)
    split, batches = _test_batches(run, data_dir)
    model = run.model
    # the reported NLL is the exact one: log Z(θ + φ) − log Z(θ) + log p(<eos>), by hand
    total, n = 0.0, 0
    with torch.no_grad():
        for b in batches:
            prior = model.family.tree_distribution(model._arcs(b), b.src_mask)
            ll = tree_log_likelihood(prior, model.arc_emission_scores(b))[:, 0]
            total -= float((ll + model._eos_log_prob(b)).sum())
            n += b.n_tokens
            assert torch.allclose(exact_token_log_likelihood(model, b).sum(-1),
                                  ll + model._eos_log_prob(b), atol=1e-5)
    rep = torch.load(path / "checkpoint.pt", weights_only=True)["extra"]["test_report"]
    assert rep["exact"] is True and rep["nll_per_token"] == pytest.approx(total / n, rel=1e-5)
    valid = [h["valid_nll"] for h in json.loads((path / "metrics.json").read_text())["history"]
             if "valid_nll" in h]
    assert len(valid) == 2 and valid[-1] < valid[0]  # validated by the likelihood it trains
    # UAS against the gold trees of test.conllu, of the exact posterior's MAP trees
    assert 0.0 <= rep["uas"] <= 1.0
    # align: each source's MAP tree under θ + φ, in CoNLL-U
    assert main(["align", str(path), "--data", str(data_dir / "test.tsv")]) == 0
    aligned = capsys.readouterr().out
    (data_dir / "aligned.conllu").write_text(aligned)
    trees = read_conllu(data_dir / "aligned.conllu", split.pairs)
    with torch.no_grad():
        for b in batches:
            post = DependencyTree(model._arcs(b)[:, 0] + model.arc_emission_scores(b)[:, 0],
                                  b.src_mask.sum(-1))
            best = post.argmax()
            for r, i in enumerate(b.index.tolist()):
                L = len(split.pairs[i][0])
                assert trees[i] == best[r, :L].tolist()


def test_the_generic_simulation_draws_one_tree_per_sentence(runs, data_dir):
    run = Run.load(runs / "tree-exact")
    _, batches = _test_batches(run, data_dir)
    b = batches[0]
    pyro.set_rng_seed(0)
    sim, value, weights = simulate(run.model, b)
    assert value.shape == (b.size, 1, b.src.shape[1]) and weights is None
    check_trees(value[:, 0].numpy(), b.src_mask.sum(-1).numpy(), projective=True,
                single_root=True)
    # the simulated labels are those the tree emits: each word's label drawn given its head
    assert torch.equal(sim.tgt_mask, b.tgt_mask) and not torch.equal(sim.tgt_out, b.tgt_out)


def test_calibrate_on_tree_exact_passes_and_catches_a_planted_distortion(runs, data_dir):
    run = Run.load(runs / "tree-exact")
    split, _ = _test_batches(run, data_dir)
    res = calibrate(run, split.pairs, num_sims=100, draws=49, progress=False)
    (row,) = res["rows"]
    assert row["posterior"] == "exact" and set(row["tests"]) == {"per-word head", "joint log p"}
    assert row["passes"], row
    bad = calibrate(run, split.pairs, num_sims=100, draws=49, progress=False,
                    distort=planted("logits", 0.25))
    assert not bad["rows"][0]["passes"], bad["rows"][0]


def test_tree_marginals_is_scored_by_its_own_program(runs, data_dir):
    """The model's ``enumerate_z=True`` branch sums a latent tree out (the ``tree`` family's
    likelihood); a ``tree-marginals`` run is another model, scored as it stands."""
    path = runs / "tree-marginals"
    run = Run.load(path)
    _, batches = _test_batches(run, data_dir)
    model = run.model
    own, branch, n = 0.0, 0.0, 0
    with torch.no_grad():
        for b in batches:
            tr = pyro.poutine.trace(model.model).get_trace(b, enumerate_z=False)
            tr.compute_log_prob()
            own -= float(tr.nodes["y"]["log_prob"].sum())
            te = pyro.poutine.trace(model.model).get_trace(b, enumerate_z=True)
            te.compute_log_prob()
            branch -= float(te.nodes["y"]["log_prob"].sum())
            n += b.n_tokens
    rep = torch.load(path / "checkpoint.pt", weights_only=True)["extra"]["test_report"]
    assert rep["nll_per_token"] == pytest.approx(own / n, rel=1e-5)
    assert abs(own - branch) / n > 1e-3  # the other branch is another number


def test_conllu_gold_is_read_and_checked(tmp_path, data_dir):
    pairs = [(["+", "1", "2"], ["root", "+", "+"])]
    good = tmp_path / "g.conllu"
    good.write_text(format_conllu(["+", "1", "2"], [0, 0, 0]))
    assert read_conllu(good, pairs) == [[0, 0, 0]]
    cases = {
        "1\t+\t_\t_\t_\t_\t0\t_\t_\n": "9 tab-separated columns",
        "1\t+\t_\t_\t_\t_\t2\t_\t_\t_\n2\t1\t_\t_\t_\t_\t1\t_\t_\t_\n3\t2\t_\t_\t_\t_\t1\t_\t_\t_\n":
            "not a tree",
        "1\t+\t_\t_\t_\t_\t0\t_\t_\t_\n3\t1\t_\t_\t_\t_\t1\t_\t_\t_\n": "ID '3', expected 2",
        "1\t+\t_\t_\t_\t_\t0\t_\t_\t_\n2\t1\t_\t_\t_\t_\t1\t_\t_\t_\n": "has 2 words, its source "
                                                                       "has 3",
    }
    for text, message in cases.items():
        bad = tmp_path / "bad.conllu"
        bad.write_text(text)
        with pytest.raises(DataError, match=message):
            read_conllu(bad, pairs)
    two = tmp_path / "two.conllu"
    two.write_text(good.read_text() * 2)
    with pytest.raises(DataError, match="sentence 2, but the data has 1 pairs"):
        read_conllu(two, pairs)
    assert np.all([len(t) for t in read_conllu(data_dir / "test.conllu")])
