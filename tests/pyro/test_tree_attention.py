"""Tree attention: the trees task, ``attend`` with a tree family on both backends (the context of
the marginals is the expectation over every tree), the exact method where the emission factors
over arcs (a model written against the contract, ``tests/models/head_labels.py``), refusals,
and the command line on trees (train, evaluate, align, analyze)."""

import json
import sys
from pathlib import Path

import numpy as np
import pyro
import pytest
import torch

import ppl_attention as pa
from ppl_attention.cli import main
from ppl_attention.core.errors import MissingCapability, UserError
from ppl_attention.core.heads import enumerate_trees, parse_conll_heads, tree_problem
from ppl_attention.data import Vocab, make_batches, make_task
from ppl_attention.data.formulas import formula
from ppl_attention.pyro.models.base import capabilities, check_method
from ppl_attention.pyro.trees import heads_to_arcs

sys.path.insert(0, str(Path(__file__).parents[1] / "models"))
from head_labels import HeadLabeller  # noqa: E402


def _eval_prefix(tokens):
    def go(i):
        t = tokens[i]
        if t in "+*":
            a, i = go(i + 1)
            b, i = go(i)
            return (a + b if t == "+" else a * b), i
        return int(t), i + 1
    return go(0)[0]


def test_trees_task_has_gold_trees_links_and_depth():
    import random

    task = make_task("trees", n_train=50, n_eval=20, depth=3)
    for (src, tgt), heads, links in zip(task.train.pairs, task.train.trees, task.train.gold):
        assert tree_problem(heads, len(src), projective=True, single_root=True) is None
        assert eval(" ".join(tgt)) == _eval_prefix(src)  # the same formula, infix
        assert sorted(j for _, j in links) == list(range(len(tgt)))  # every target token linked
        for i, j in links:  # numbers and operators to themselves, parentheses to operators
            assert src[i] == tgt[j] or (tgt[j] in "()" and src[i] in "+*")
        for m, h in enumerate(heads):
            assert h == m or src[h] in "+*"  # operators head their operands
    rng = random.Random(0)

    def depth(f):
        return 0 if isinstance(f, int) else 1 + max(depth(f[1]), depth(f[2]))
    assert all(depth(formula(rng, d)) == d for d in range(1, 7) for _ in range(20))
    with pytest.raises(UserError, match="depth"):
        make_task("trees", depth=0)


def _inputs(S=4, B=2, T=3, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    arcs = torch.randn(B, 1, S, S, generator=g, dtype=dtype)
    att = torch.randn(B, T, S, generator=g, dtype=dtype)
    values = torch.randn(B, S, 5, generator=g, dtype=dtype)
    mask = torch.tensor([[True] * S, [True] * (S - 1) + [False]])
    return arcs, att, values, mask


def test_marginal_context_is_the_expectation_over_every_tree():
    arcs, att, values, mask = _inputs()
    fam = pa.TreeMarginals()
    with pyro.plate("batch", 2, dim=-2):
        ctx, w = pa.attend("align", arcs, values, fam, mask=mask, attention=att)
    assert ctx.shape == (2, 3, 15)
    latent = pa.Tree()
    for b, L in enumerate(mask.sum(-1).tolist()):
        trees = torch.as_tensor(enumerate_trees(L, 4))
        d = latent.tree_distribution(arcs[b:b + 1], mask[b:b + 1])
        p = d.log_prob(trees[:, None, None]).exp()[:, 0, 0]
        ctxs = torch.stack([latent.tree_context(heads_to_arcs(t[None, None], arcs.dtype),
                                                values[b:b + 1], w[b:b + 1])[0] for t in trees])
        torch.testing.assert_close(ctx[b], (p[:, None, None] * ctxs).sum(0))
    assert (w[1, :, 3] == 0).all()  # a padded word gets no attention


def test_sampled_context_reads_parent_and_children_on_both_backends():
    import jax.numpy as jnp
    import numpyro

    import ppl_attention.numpyro as pn

    arcs, att, values, mask = _inputs(dtype=torch.float32)
    with pyro.plate("batch", 2, dim=-2):
        tr = pyro.poutine.trace(lambda: pa.attend("align", arcs, values, pa.Tree(), mask=mask,
                                                  attention=att)).get_trace()
    heads = tr.nodes["align"]["value"]
    ctx = tr.nodes["_RETURN"]["value"][0]
    v = values.numpy()
    w = torch.where(mask[:, None], att, -torch.inf).softmax(-1).numpy()
    for b in range(2):
        parent = np.stack([v[b, heads[b, 0, m]] if heads[b, 0, m] != m else np.zeros(5)
                           for m in range(4)])
        children = np.stack([sum((v[b, c] for c in range(4) if heads[b, 0, c] == m and c != m),
                                 np.zeros(5)) for m in range(4)])
        words = np.concatenate([v[b], parent, children], -1)
        np.testing.assert_allclose(ctx[b].numpy(), w[b] @ words, rtol=1e-5, atol=1e-6)
    # the NumPyro family gives the same context at the same tree
    with numpyro.handlers.seed(rng_seed=0), numpyro.plate("batch", 2, dim=-2):
        with numpyro.handlers.condition(data={"align": jnp.asarray(heads.numpy())}):
            jctx, _ = pn.attend("align", jnp.asarray(arcs.numpy()), jnp.asarray(v), pn.Tree(),
                                mask=jnp.asarray(mask.numpy()), attention=jnp.asarray(att.numpy()))
    np.testing.assert_allclose(np.asarray(jctx), ctx.numpy(), rtol=1e-5, atol=1e-6)


def test_tree_attend_refuses_bad_input():
    arcs, att, values, mask = _inputs()
    with pyro.plate("batch", 2, dim=-2):
        with pytest.raises(UserError, match="target_mask"):
            pa.attend("align", arcs, values, pa.Tree(), mask=mask, attention=att,
                      target_mask=torch.ones(2, 3, dtype=torch.bool))
        with pytest.raises(UserError, match="arc scores"):
            pa.attend("align", arcs[..., :3], values, pa.Tree(), mask=mask, attention=att)
        with pytest.raises(UserError, match="attention"):
            pa.attend("align", arcs, values, pa.Tree(), mask=mask, attention=att[..., :3])
        with pytest.raises(UserError, match="prefix"):
            pa.attend("align", arcs, values, pa.Tree(), mask=torch.tensor(
                [[True, False, True, True]] * 2), attention=att)
    with pytest.raises(UserError, match="attention= is for the tree families"):
        pa.attend("align", att, values, pa.Categorical(), mask=mask, attention=att)


def _head_label_data():
    task = make_task("trees", n_train=40, n_eval=8, depth=2)
    # the label of each word: the operator that heads it ("root" for the outermost)
    def labels(split):
        return [(s, [s[h] if h != m else "root" for m, h in enumerate(heads)])
                for (s, _), heads in zip(split.pairs, split.trees)]
    train = labels(task.train)
    sv, tv = (Vocab.build(p[k] for p in train) for k in (0, 1))
    return train, sv, tv


def test_tree_exact_equals_brute_force_and_trains():
    torch.set_default_dtype(torch.float64)
    try:
        train, sv, tv = _head_label_data()
        m = pa.inference.get_method("tree-exact")
        check_method(HeadLabeller, m)  # it has the capability the method needs
        model = HeadLabeller(len(sv), len(tv), family=m.family())
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0, 0.5)
        assert {"arc-emissions", "exact-likelihood"} <= capabilities(model)
        (b,) = make_batches(train[:6], sv, tv, 6)
        ll = model.exact_token_log_likelihood(b).sum(-1)
        phi = model.arc_emission_scores(b)[:, 0]
        arcs = model._arcs(b)
        for r, L in enumerate(b.src_mask.sum(-1).tolist()):
            trees = torch.as_tensor(enumerate_trees(L, b.src.shape[1]))
            prior = model.family.tree_distribution(arcs[r:r + 1], b.src_mask[r:r + 1])
            lp = prior.log_prob(trees[:, None, None])[:, 0, 0]
            emit = torch.stack([phi[r][t[:L], torch.arange(L)].sum() for t in trees])
            assert float(ll[r]) == pytest.approx(float((lp + emit).logsumexp(0)), abs=1e-9)
        batches = make_batches(train, sv, tv, 16, shuffle=True)
        torch.manual_seed(0)
        fresh = HeadLabeller(len(sv), len(tv), family=m.family())
        run = pa.inference.fit(fresh, batches, "tree-exact", steps=30, lr=0.05, src_vocab=sv,
                               tgt_vocab=tv, progress=False)
        losses = [h["train_loss"] for h in run.history]
        assert np.mean(losses[-5:]) < np.mean(losses[:5])
    finally:
        torch.set_default_dtype(torch.float32)


def test_tree_methods_refused_where_they_do_not_apply():
    sys.path.insert(0, str(Path(__file__).parents[2] / "examples" / "tutorial"))
    from diagonal import DiagonalAlignment

    with pytest.raises(MissingCapability, match="arc-emissions"):
        check_method(pa.models.Seq2SeqAlignment, pa.inference.get_method("tree-exact"))
    with pytest.raises(UserError, match="families"):  # a model that does not declare trees
        check_method(DiagonalAlignment, pa.inference.get_method("tree-marginals"))


@pytest.mark.integration  # a whole pipeline: the second tier
def test_command_line_on_trees(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--task", "trees", "--depth", "2", "--n-train", "64",
                 "--method", "tree-sample", "--steps", "3", "--hidden", "8",
                 "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(run), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0 <= rep["uas"] <= 1 and 0 <= rep["prefix_accuracy"] <= 1
    data = tmp_path / "pairs.tsv"
    data.write_text("+ 3 4\t( 3 + 4 )\n* + 1 2 3\t( ( 1 + 2 ) * 3 )\n")
    assert main(["align", str(run), "--data", str(data)]) == 0
    sents = [s for s in capsys.readouterr().out.strip().split("\n\n")]
    assert len(sents) == 2
    for sent, n in zip(sents, (3, 5)):
        rows = [line.split("\t") for line in sent.splitlines() if not line.startswith("#")]
        assert len(rows) == n and all(len(r) == 10 for r in rows)
        heads = parse_conll_heads([int(r[6]) for r in rows])
        assert tree_problem(heads, n, projective=True, single_root=True) is None
    assert main(["train", "--task", "reorder", "--depth", "3", "--steps", "1",
                 "--out", str(tmp_path / "x")]) == 2  # --depth is for --task trees
    out = tmp_path / "an"
    assert main(["analyze", str(run), "--out", str(out), "--num-samples", "4"]) == 0
    import arviz as az

    idata = az.from_netcdf(out / "posterior.nc")
    heads = idata.posterior["heads"].values  # [chain, draw, pair, word]
    arcs = idata.tree_marginals["arcs"].values
    assert heads.shape[:2] == (1, 4)
    L = int(np.isfinite(heads[0, 0, 0]).sum())
    np.testing.assert_allclose(np.nansum(arcs[0][:L, :L], 0), 1.0, atol=1e-5)
