"""Train once, align new text: the word aligners' tables as the prior's pseudo-counts
(``ppl_attention.numpyro.aligners.TablePrior``), saved and loaded as plain data
(``wordalign --save`` / ``--load``, ``ppl_attention.data.aligner_tables``) and eflomal's priors
file (``--priors``).

- The tables' maths with pseudo-counts against a dense Dirichlet written out here: E[log θ],
  log E[θ], KL(q ‖ prior) (NumPyro's Dirichlet KL), the sparse draw's moments (the row's mass
  outside the corpus's cells included);
- the pseudo-counts land on the right cells of a new corpus (NULL re-numbered, unseen words 0);
- the directory and the priors file round-trip exactly; every malformed one is refused in one
  line naming file and field or line, before any work;
- ``--load`` on new sentences aligns them about as well as aligning them inside the training
  text (the integration tier: ``test_load_aligns_new_text_like_the_training_corpus``).

Planted faults (``python tests/plant_faults.py k1 k2 k3``): k1 the row's mass outside the cells
dropped from the draw → ``test_sparse_draws_with_pseudo_counts`` fails; k2 the prior's NULL row
not re-numbered → ``test_prior_lands_on_the_new_corpus_cells`` fails; k3 the prior left out of
the KL → ``test_expectations_and_kl_with_pseudo_counts_against_dense`` fails.
"""

from __future__ import annotations

import contextlib
import io
import json
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppl_attention.cli import main
from ppl_attention.core.errors import DataError, UserError
from ppl_attention.data import aligner_tables as at
from ppl_attention.data.indexed import index_pairs
from ppl_attention.data.parallel import format_gold, write_parallel
from ppl_attention.numpyro import aligners as al

# two source rows over V = 5 target words; the corpus's cells: row 0 → {0, 1, 3}, row 1 → {2}
CELL_SRC = np.array([0, 0, 0, 1])
CELL_TGT = np.array([0, 1, 3, 2])
V = 5
COUNTS = np.array([2.0, 0.5, 0.0, 4.0])
P_DENSE = np.array([[1.0, 0.0, 3.0, 0.25, 0.0],   # pseudo-counts, some outside the cells
                    [0.0, 2.0, 0.5, 0.0, 7.0]])


def _prior():
    cells = P_DENSE[CELL_SRC, CELL_TGT]
    return al.TablePrior(jnp.asarray(cells, jnp.float32), jnp.asarray(P_DENSE.sum(1), jnp.float32),
                         jnp.asarray([1.0, 0.0, 2.0, 0.5], jnp.float32))


def _dense_posterior(alpha):
    n = np.zeros((2, V))
    n[CELL_SRC, CELL_TGT] = COUNTS
    return alpha + P_DENSE, alpha + P_DENSE + n


def test_expectations_and_kl_with_pseudo_counts_against_dense():
    from numpyro.distributions import Dirichlet, kl_divergence
    from scipy.special import digamma

    spec = al.aligner("ibm2", alpha=0.3, gamma=0.7, max_jump=1, null_prior=0.0)
    prior, counts = _prior(), jnp.asarray(COUNTS, jnp.float32)
    a0, a1 = _dense_posterior(0.3)
    args = (spec, counts, jnp.asarray(CELL_SRC), 2, V)
    want = (digamma(a1) - digamma(a1.sum(1, keepdims=True)))[CELL_SRC, CELL_TGT]
    np.testing.assert_allclose(al.expected_log_translation(*args, prior=prior), want, rtol=1e-5)
    want = np.log(a1 / a1.sum(1, keepdims=True))[CELL_SRC, CELL_TGT]
    np.testing.assert_allclose(al.posterior_mean_log_translation(*args, prior=prior), want,
                               rtol=1e-5)
    kl = sum(float(kl_divergence(Dirichlet(jnp.asarray(a1[e])), Dirichlet(jnp.asarray(a0[e]))))
             for e in range(2))
    np.testing.assert_allclose(float(al.translation_kl(*args, prior=prior)), kl, rtol=1e-4)
    b = jnp.asarray([3.0, 1.0, 0.0, 2.0])
    g0 = 0.7 + np.asarray(prior.buckets)
    g1 = g0 + np.asarray(b)
    np.testing.assert_allclose(al.expected_log_buckets(spec, b, prior),
                               digamma(g1) - digamma(g1.sum()), rtol=1e-5)
    np.testing.assert_allclose(float(al.bucket_kl(spec, b, prior)), float(kl_divergence(
        Dirichlet(jnp.asarray(g1)), Dirichlet(jnp.asarray(g0)))), rtol=1e-4)
    # without pseudo-counts: the plain Dirichlet(α) prior, as before
    a0, a1 = 0.3 + 0 * P_DENSE, 0.3 + _dense_posterior(0.0)[1] - P_DENSE
    kl = sum(float(kl_divergence(Dirichlet(jnp.asarray(a1[e])), Dirichlet(jnp.asarray(a0[e]))))
             for e in range(2))
    np.testing.assert_allclose(float(al.translation_kl(*args)), kl, rtol=1e-4)


def test_sparse_draws_with_pseudo_counts():
    """The draws' mean and variance are the dense Dirichlet(α + p + n)'s, for the cells and for
    a row whose pseudo-counts lie mostly outside the corpus's cells (row 1)."""
    spec = al.aligner("ibm1", alpha=0.4)
    prior, counts = _prior(), jnp.asarray(COUNTS, jnp.float32)
    draws = jax.vmap(lambda k: jnp.exp(al.sample_translation(
        k, spec, counts, jnp.asarray(CELL_SRC), 2, V, prior)))(
        jax.random.split(jax.random.PRNGKey(1), 40_000))
    _, a1 = _dense_posterior(0.4)
    mean = a1 / a1.sum(1, keepdims=True)
    var = mean * (1 - mean) / (a1.sum(1, keepdims=True) + 1)
    np.testing.assert_allclose(np.asarray(draws.mean(0)), mean[CELL_SRC, CELL_TGT], atol=4e-3)
    np.testing.assert_allclose(np.asarray(draws.var(0)), var[CELL_SRC, CELL_TGT], rtol=0.06)


def _tables():
    """Forward tables over source {a, b} (+ NULL) and target {x, y, z}."""
    return at.DirectionTables(["a", "b"], ["x", "y", "z"], np.array([0, 1, 2, 2], np.int32),
                              np.array([0, 1, 2, 0], np.int32),
                              np.array([5.0, 3.0, 1.5, 0.5], np.float32),
                              np.array([6.0, 3.0, 2.0], np.float32),
                              np.arange(6, dtype=np.float32))


def test_prior_lands_on_the_new_corpus_cells():
    t = _tables()
    pairs = [(["b", "c"], ["z", "y", "w"]), (["a"], ["x", "w"])]  # c, w unseen
    corpus, src, tgt = index_pairs(pairs, batch=2, src_vocab=t.src_words,
                                   tgt_vocab=t.tgt_words)
    assert src == ["a", "b", "c"] and tgt == ["x", "y", "z", "w"] and corpus.null == 3
    cells, rows, buckets, fertility = at.prior_for_corpus(t, corpus)
    assert fertility.shape == (4, 0)  # no fertility rows in an HMM's tables
    got = {(src + ["NULL"])[e] + tgt[f]: float(c)
           for e, f, c in zip(corpus.cell_src, corpus.cell_tgt, cells)}
    assert got == {"bz": 0.0, "by": 3.0, "bw": 0.0, "cz": 0.0, "cy": 0.0, "cw": 0.0,
                   "NULLz": 1.5, "NULLy": 0.0, "NULLw": 0.0, "ax": 5.0, "aw": 0.0,
                   "NULLx": 0.5}
    np.testing.assert_array_equal(rows, [6.0, 3.0, 0.0, 2.0])  # c new: 0; NULL moved to 3
    np.testing.assert_array_equal(buckets, t.buckets)


def test_merge_adds_counts_cell_by_cell():
    t = _tables()
    new = at.DirectionTables(["a", "b", "c"], ["x", "y", "z", "w"],
                             np.array([0, 3, 2], np.int32), np.array([0, 0, 3], np.int32),
                             np.array([1.0, 2.0, 4.0], np.float32),
                             np.array([1.0, 0.0, 4.0, 2.0], np.float32),
                             np.ones(6, np.float32))
    m = at.merge_tables(t, new)
    got = {(e, f): float(c) for e, f, c in zip(m.cell_src, m.cell_tgt, m.counts)}
    assert got == {(0, 0): 6.0, (1, 1): 3.0, (3, 2): 1.5, (3, 0): 2.5, (2, 3): 4.0}
    np.testing.assert_array_equal(m.row_totals, [7.0, 3.0, 4.0, 4.0])
    np.testing.assert_array_equal(m.buckets, np.arange(6) + 1.0)


def _saved(tmp_path):
    meta = {"model": "ibm2", "alpha": 0.01, "gamma": 1.0, "max_jump": 2, "method": "vb"}
    t = _tables()
    t.src_words = ["a", "ñ"]  # not ASCII
    rev = at.DirectionTables(["x"], ["a"], np.array([0], np.int32), np.array([0], np.int32),
                             np.array([2.0], np.float32), np.array([2.0, 0.0], np.float32),
                             np.ones(6, np.float32))
    at.save_tables(tmp_path / "tables", at.SavedTables(meta, {"forward": t, "reverse": rev}))
    return tmp_path / "tables", t


def test_tables_round_trip_and_eflomal_priors(tmp_path):
    path, t = _saved(tmp_path)
    back = at.load_tables(path)
    assert back.meta["model"] == "ibm2" and back.meta["directions"] == ["forward", "reverse"]
    f = back.directions["forward"]
    assert f.src_words == ["a", "ñ"] and f.tgt_words == ["x", "y", "z"]
    for name in at.FIELDS:
        np.testing.assert_array_equal(getattr(f, name), getattr(t, name))
    text = (path / "eflomal.priors").read_text(encoding="utf-8")
    assert text.splitlines()[:4] == ["LEX\ta\tx\t5", "LEX\tñ\ty\t3", "LEX\t<NULL>\tz\t1.5",
                                     "LEX\t<NULL>\tx\t0.5"]
    # IBM2's buckets are displacements from the diagonal, not jumps: no HMMF / HMMR lines
    assert "HMM" not in text
    meta = {"model": "hmm", "alpha": 0.01, "gamma": 1.0, "max_jump": 2, "method": "vb"}
    at.save_tables(tmp_path / "hmm", at.SavedTables(meta, {"forward": t}))
    text = (tmp_path / "hmm" / "eflomal.priors").read_text(encoding="utf-8")
    assert "HMMF\t-2\t0" not in text and "HMMF\t-1\t1" in text and "HMMF\t2\t4" in text
    assert "HMMR" not in text and "\t5\n" not in text.split("HMMF")[1]  # NULL bucket left out
    # read back as eflomal's priors: the same LEX counts, jumps into the buckets
    priors, unused = at.read_eflomal_priors(tmp_path / "hmm" / "eflomal.priors", "hmm", 2)
    p = priors["forward"]
    got = {((p.src_words + ["NULL"])[e], p.tgt_words[f]): float(c)
           for e, f, c in zip(p.cell_src, p.cell_tgt, p.counts)}
    assert got == {("a", "x"): 5.0, ("ñ", "y"): 3.0, ("NULL", "z"): 1.5, ("NULL", "x"): 0.5}
    np.testing.assert_array_equal(p.buckets, [0, 1, 2, 3, 4, 0])
    r = priors["reverse"]  # LEX transposed; a NULL target is the reverse's NULL source
    got = {((r.src_words + ["NULL"])[e], r.tgt_words[f]): float(c)
           for e, f, c in zip(r.cell_src, r.cell_tgt, r.counts)}
    assert got == {("x", "a"): 5.0, ("y", "ñ"): 3.0}
    assert unused == {}
    _, unused = at.read_eflomal_priors(tmp_path / "hmm" / "eflomal.priors", "ibm2", 2)
    assert unused == {"HMMF": 4}


def test_fertility_tables_round_trip_and_eflomal_fer_lines(tmp_path):
    """The fertility aligner's tables keep their fertility rows through save and load; written
    as FERF lines and read back (fertilities past F clipped to F) they are the same counts."""
    t = _tables()
    t.fertility = np.zeros((3, at.MAX_FERTILITY + 1), np.float32)
    t.fertility[0, [0, 1]] = [2.0, 5.0]
    t.fertility[1, 2] = 1.5
    meta = {"model": "fertility", "alpha": 0.01, "gamma": 1.0, "max_jump": 2, "method": "gibbs"}
    at.save_tables(tmp_path / "f", at.SavedTables(meta, {"forward": t}))
    back = at.load_tables(tmp_path / "f").directions["forward"]
    np.testing.assert_array_equal(back.fertility, t.fertility)
    text = (tmp_path / "f" / "eflomal.priors").read_text(encoding="utf-8")
    assert "FERF\ta\t1\t5\nFERF\tb\t2\t1.5\n" in text  # fertility ≥ 1, as eflomal's
    assert "FERF\ta\t0" not in text
    (tmp_path / "p").write_text(text + "FERF\tb\t12\t3\nFERR\tz\t1\t4\n", encoding="utf-8")
    priors, unused = at.read_eflomal_priors(tmp_path / "p", "fertility", 2)
    f = priors["forward"]
    row = {w: f.fertility[k] for k, w in enumerate(f.src_words)}
    np.testing.assert_array_equal(row["a"][:2], [0.0, 5.0])
    assert row["b"][2] == 1.5 and row["b"][at.MAX_FERTILITY] == 3.0  # 12 links: F's column
    r = priors["reverse"]
    assert r.fertility[r.src_words.index("z"), 1] == 4.0 and unused == {}
    # a fertility table of the wrong width is refused on load
    z = dict(np.load(tmp_path / "f" / "tables.npz"))
    z["forward_fertility"] = np.ones((3, 4), np.float32)
    np.savez(tmp_path / "f" / "tables.npz", **z)
    with pytest.raises(DataError, match=r"fertility must be a float array \[3, 9\]"):
        at.load_tables(tmp_path / "f")


def test_eflomal_priors_fertility_lines_reported_unused(tmp_path):
    f = tmp_path / "p"
    f.write_text("LEX\tkatt\tcat\t100\nFERF\tkatt\t1\t3\nFERR\tcat\t2\t1\nHMMF\t1\t4\n",
                 encoding="utf-8")
    priors, unused = at.read_eflomal_priors(f, "ibm1", 8)
    assert unused == {"FERF": 1, "FERR": 1, "HMMF": 1}
    assert priors["forward"].counts.tolist() == [100.0] and len(priors["forward"].buckets) == 0
    # a file of jumps alone: no cell has a pseudo-count, every cell of a corpus gets 0
    f.write_text("HMMF\t1\t4\n", encoding="utf-8")
    priors, _ = at.read_eflomal_priors(f, "hmm", 8)
    corpus, _, _ = index_pairs([(["a"], ["x", "y"])], batch=1,
                               src_vocab=priors["forward"].src_words,
                               tgt_vocab=priors["forward"].tgt_words)
    cells, rows, buckets, _ = at.prior_for_corpus(priors["forward"], corpus)
    assert not cells.any() and not rows.any() and buckets[9] == 4.0


@pytest.mark.parametrize("line, message", [
    ("LEX\ta\tx", "p:2: a LEX line has 4 tab-separated fields, found 3"),
    ("LEX\ta\tx\tmany", "p:2: the count 'many' is not a number"),
    ("LEX\ta\tx\t-1", "p:2: the count '-1' must be a finite number ≥ 0"),
    ("LEX\ta\tx\tnan", "p:2: the count 'nan' must be a finite number ≥ 0"),
    ("HMMF\t1.5\t2", "p:2: the jump '1.5' is not an integer"),
    ("FERF\ta\tx\t2", "p:2: the fertility 'x' is not an integer"),
    ("LEX a x 3", "p:2: unknown line type 'LEX a x 3'"),
    ("LEX\t<NULL>\t<NULL>\t3", "p:2: a LEX line needs a source and a target word"),
])
def test_eflomal_priors_malformed_line(tmp_path, line, message):
    f = tmp_path / "p"
    f.write_text("LEX\ta\tx\t1\n" + line + "\n", encoding="utf-8")
    with pytest.raises(DataError) as e:
        at.read_eflomal_priors(f, "hmm", 8)
    assert str(e.value).replace(str(tmp_path) + "/", "").startswith(message)


def _corrupt(path, how):
    if how == "not a folder":
        (path.parent / "file").write_text("x")
        return path.parent / "file"
    if how == "meta missing":
        (path / "meta.json").unlink()
    elif how == "pickle":
        with open(path / "tables.npz", "wb") as f:
            pickle.dump({"forward_counts": [1.0]}, f)
    elif how == "object array":
        z = dict(np.load(path / "tables.npz"))
        z["forward_counts"] = np.array([{"a": 1}], dtype=object)
        np.savez(path / "tables.npz", **z)
    elif how == "truncated":
        raw = (path / "tables.npz").read_bytes()
        (path / "tables.npz").write_bytes(raw[: len(raw) // 2])
    elif how == "field missing":
        z = dict(np.load(path / "tables.npz"))
        del z["reverse_row_totals"]
        np.savez(path / "tables.npz", **z)
    elif how == "nan count":
        z = dict(np.load(path / "tables.npz"))
        z["forward_counts"][1] = np.nan
        np.savez(path / "tables.npz", **z)
    elif how == "cell outside":
        z = dict(np.load(path / "tables.npz"))
        z["forward_cell_tgt"][0] = 7
        np.savez(path / "tables.npz", **z)
    elif how == "wrong buckets":
        z = dict(np.load(path / "tables.npz"))
        z["forward_buckets"] = np.ones(3, np.float32)
        np.savez(path / "tables.npz", **z)
    else:
        meta = json.loads((path / "meta.json").read_text())
        key, value = how.split("=")
        meta[key] = json.loads(value)
        (path / "meta.json").write_text(json.dumps(meta))
    return path


@pytest.mark.parametrize("how, message", [
    ("not a folder", "not a folder written by wordalign --save"),
    ("meta missing", "meta.json missing"),
    ("pickle", "tables.npz: not an .npz archive"),
    ("object array", "tables.npz: holds pickled objects, not plain arrays; refusing"),
    ("truncated", "tables.npz: unreadable wordalign tables file"),
    ("field missing", "tables.npz: field reverse_row_totals missing"),
    ("nan count", "tables.npz (forward): counts holds a negative or non-finite count"),
    ("cell outside", "tables.npz (forward): cell_tgt outside [0, 3)"),
    ("wrong buckets", "tables.npz (forward): 3 jump buckets, the model has 6"),
    ('format="other"', "meta.json: not the meta of wordalign tables"),
    ('model="ibm5"', "meta.json: field 'model' must be one of ibm1, ibm2, hmm, fertility"),
    ("alpha=-1", "meta.json: field 'alpha' must be > 0"),
    ("null_prior=-1", "meta.json: field 'null_prior' must be ≥ 0"),
    ('directions=["sideways"]', "meta.json: field 'directions' must list forward"),
])
def test_load_refuses_what_is_not_tables(tmp_path, how, message):
    path, _ = _saved(tmp_path)
    path = _corrupt(path, how)
    with pytest.raises(UserError) as e:
        at.load_tables(path)
    assert message in str(e.value) and "\n" not in str(e.value)


# --- the command ---------------------------------------------------------------------------------

def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """``wordalign --model ibm2 --method vb --save`` on 150 pairs, both directions."""
    from ppl_attention.data.wordalign_task import wordalign_task

    d = tmp_path_factory.mktemp("tables")
    task = wordalign_task(n_train=150, n_eval=50, seed=0, vocab=60, max_len=10)
    write_parallel(d / "train", task.train.pairs)
    write_parallel(d / "new", task.test.pairs)
    write_parallel(d / "joint", task.test.pairs + task.train.pairs)
    (d / "gold").write_text("".join(format_gold(s, p) + "\n" for s, p in
                                    zip(task.test.gold, task.test.possible)), encoding="utf-8")
    rc, _, err = _run(["wordalign", "-i", str(d / "train"), "--model", "ibm2", "--method",
                       "vb", "--iterations", "10", "--symmetrize", "intersection", "-o",
                       str(d / "sym"), "--save", str(d / "tables")])
    assert rc == 0, err
    return d


def test_save_writes_the_runs_expected_counts(trained):
    saved = at.load_tables(trained / "tables")
    assert saved.meta["model"] == "ibm2" and saved.meta["n_pairs"] == 150
    assert saved.meta["null_prior"] == 0.2  # NULL's fixed weight by default (IBM2 has NULL's)
    f = saved.directions["forward"]
    pairs = [line.split(" ||| ") for line in (trained / "train").read_text().splitlines()]
    n_target_words = sum(len(t.split()) for _, t in pairs)
    # every target word's posterior sums to one: the rows hold every link of the text
    np.testing.assert_allclose(f.row_totals.sum(), n_target_words, rtol=1e-4)
    np.testing.assert_allclose(f.buckets.sum(), n_target_words, rtol=1e-4)
    assert f.counts.sum() <= f.row_totals.sum() + 1e-3


@pytest.mark.parametrize("extra, message", [
    (["--model", "hmm"], "error: --model hmm: the tables in {t} are --model ibm2 (--load takes "
     "the model and its options from the tables)"),
    (["--max-jump", "3"], "error: --max-jump 3: the tables in {t} are --max-jump 8"),
    (["--null-prior", "0"], "error: --null-prior 0.0: the tables in {t} are --null-prior 0.2"),
    (["--model", "ibm1", "--null-prior", "0.3", "--load", ""], "error: null_prior 0.3: ibm1 "
     "has no NULL bucket (its NULL is one more source position); give 0"),
    (["--priors", "{d}/tables/eflomal.priors"], "error: --load and --priors: give one"),
    (["--load", "{d}/new"], "error: --load {d}/new: not a folder written by wordalign --save"),
    (["--priors", "{d}/tables/eflomal.priors", "--model", "fertility", "--method", "svb",
      "--load", ""], "error: --model fertility runs by gibbs or vb, not --method svb"),
])
def test_load_refuses_conflicting_options(trained, extra, message):
    d, t = str(trained), str(trained / "tables")
    argv = ["wordalign", "-i", f"{d}/new", "-f", f"{d}/never"]
    if "--load" not in extra:
        argv += ["--load", t]
    extra = [x.format(d=d) for x in extra]
    if "" in extra:  # no --load at all
        extra = extra[:extra.index("--load")]
    rc, out, err = _run(argv + extra)
    assert rc == 2 and out == ""
    assert err.startswith(message.format(t=t, d=d)) and err.count("\n") == 1
    assert not (trained / "never").exists()


def test_load_then_save_accumulates(trained, tmp_path):
    rc, _, err = _run(["wordalign", "-i", str(trained / "new"), "--load",
                       str(trained / "tables"), "--method", "vb", "--iterations", "5",
                       "-f", str(tmp_path / "fwd"), "--save", str(tmp_path / "more")])
    assert rc == 0, err
    loaded = at.load_tables(trained / "tables")
    before = loaded.directions["forward"]
    after = at.load_tables(tmp_path / "more")
    assert after.meta["directions"] == ["forward", "reverse"] and after.meta["model"] == "ibm2"
    assert after.meta["n_pairs"] == 150 + 50  # both texts
    # the reverse was not run this time: kept as it was loaded
    np.testing.assert_array_equal(after.directions["reverse"].counts,
                                  loaded.directions["reverse"].counts)
    a = after.directions["forward"]
    assert a.src_words[:len(before.src_words)] == before.src_words
    new_words = sum(len(line.split(" ||| ")[1].split())
                    for line in (trained / "new").read_text().splitlines())
    np.testing.assert_allclose(a.row_totals.sum(), before.row_totals.sum() + new_words,
                               rtol=1e-4)
    at.save_tables(tmp_path / "fwd-only", at.SavedTables(
        {k: after.meta[k] for k in ("model", "alpha", "gamma", "max_jump", "n_pairs")},
        {"forward": a}))
    rc, _, err = _run(["wordalign", "-i", str(trained / "new"), "--load",
                       str(tmp_path / "fwd-only"), "-r", str(tmp_path / "rev")])
    assert rc == 2 and "its tables are of the forward direction only" in err
    # tables whose meta predates NULL's fixed weight were trained with it learned
    assert at.load_tables(tmp_path / "fwd-only").meta["null_prior"] == 0.0
    rc, _, err = _run(["wordalign", "-i", str(trained / "new"), "--priors",
                       str(trained / "tables" / "eflomal.priors"), "--max-jump", "0", "-f",
                       str(tmp_path / "never")])
    assert rc == 2 and err == "error: max_jump must be an int ≥ 1, got 0\n"


@pytest.mark.integration
def test_load_aligns_new_text_like_the_training_corpus(trained, tmp_path):
    """New sentences aligned with the tables of the training text (VB on them alone) score
    within 0.03 AER of aligning them inside the training corpus, both directions and
    symmetrized, far better than without them; an eflomal priors file of the same counts as well
    in the forward direction (its LEX lines are the forward counts)."""
    def scores(extra, corpus):
        rc, _, err = _run(["wordalign", "-i", str(trained / corpus), "--method", "vb",
                           "--iterations", "10", "--symmetrize", "grow-diag-final-and", "-o",
                           str(tmp_path / "sym"), "-r", str(tmp_path / "rev"),
                           "--gold", str(trained / "gold")] + extra)
        assert rc == 0, err
        report = json.loads(err[err.index("\n{") + 1:])
        return {k: v["aer"] for k, v in report["scores"].items()}

    joint = scores(["--model", "ibm2"], "joint")
    loaded = scores(["--load", str(trained / "tables")], "new")
    priors = scores(["--model", "ibm2", "--max-jump", "8", "--priors",
                     str(trained / "tables" / "eflomal.priors")], "new")
    alone = scores(["--model", "ibm2"], "new")  # 50 pairs without the training text
    for name in ("forward", "reverse", "grow-diag-final-and"):
        assert loaded[name] <= joint[name] + 0.03, (name, loaded, joint)
        assert loaded[name] < alone[name] - 0.03, (name, loaded, alone)
    # eflomal's file holds the forward counts only (LEX lines); the reverse reads them
    # transposed, without the reverse's NULL links — measured, not held to a bound
    assert priors["forward"] <= joint["forward"] + 0.03, (priors, joint)


@pytest.mark.integration
def test_fertility_aligner_end_to_end(trained, tmp_path):
    """``--model fertility`` by ``gibbs`` on the 200 pairs (the new ones first, with gold):
    Pharaoh links in both directions, AER no worse than the HMM's with the same sweeps plus
    0.03, its tables saved with fertility rows (each source position counted once per kept
    draw: the rows sum to the source words), and ``--load`` of them on the new pairs."""
    def run(model, extra=()):
        rc, _, err = _run(["wordalign", "-i", str(trained / "joint"), "--model", model,
                           "--chains", "2", "--warmup", "10", "--samples", "10",
                           "--symmetrize", "grow-diag-final-and", "-o", str(tmp_path / "sym"),
                           "--gold", str(trained / "gold"), *extra])
        assert rc == 0, err
        return {k: v["aer"] for k, v in json.loads(err[err.index("\n{") + 1:])["scores"].items()}

    hmm = run("hmm")
    fert = run("fertility", ["--save", str(tmp_path / "tables")])
    for name in ("forward", "reverse", "grow-diag-final-and"):
        assert fert[name] <= hmm[name] + 0.03, (name, fert, hmm)
    saved = at.load_tables(tmp_path / "tables")
    f = saved.directions["forward"]
    assert saved.meta["model"] == "fertility" and f.fertility.shape[1] == at.MAX_FERTILITY + 1
    joint = [line.split(" ||| ") for line in (trained / "joint").read_text().splitlines()]
    np.testing.assert_allclose(f.fertility.sum(), sum(len(s.split()) for s, _ in joint),
                               rtol=1e-5)
    assert f.fertility[-1].sum() == 0  # NULL has no fertility
    rc, _, err = _run(["wordalign", "-i", str(trained / "new"), "--load", str(tmp_path / "tables"),
                       "--warmup", "5", "--samples", "5", "-f", str(tmp_path / "fwd"),
                       "--gold", str(trained / "gold")])
    assert rc == 0, err
    report = json.loads(err[err.index("\n{") + 1:])
    assert report["model"] == "fertility"
    assert report["scores"]["forward"]["aer"] <= fert["forward"] + 0.03
