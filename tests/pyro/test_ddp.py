"""Pyro data-parallel SVI under torchrun: 2 gloo processes, each a shard of every batch inside
DistributedDataParallel, reach the parameters of one process on the whole batch."""

import json
import subprocess
import sys

import pytest
import torch

from ppl_attention.cli import main

# batch 15: shards of 8 and 7 pairs. lr 1e-3: Adam divides each gradient by its own running
# magnitude, so float32 rounding (the shards' sums are added in another order) on a near-zero
# gradient component moves that parameter by up to ~lr per step; at lr 1e-2 one embedding entry
# of 448 differs by 1.1e-5 after 5 steps. The float64 test below shows the maths is exact.
ARGS = ["--task", "reorder", "--n-train", "200", "--steps", "5", "--hidden", "16",
        "--batch-size", "15", "--valid-every", "5", "--lr", "1e-3"]


def _train(tmp_path, name, method, processes):
    out = tmp_path / name
    launch = ([sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={processes}"] if processes > 1 else [sys.executable])
    r = subprocess.run([*launch, "-m", "ppl_attention.cli", "train", *ARGS, "--method", method,
                        "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    state = torch.load(out / "checkpoint.pt", weights_only=True)["model"]  # data, not code
    history = json.loads((out / "metrics.json").read_text())["history"]
    return state, history, json.loads((out / "config.json").read_text())


@pytest.mark.integration
@pytest.mark.parametrize("method", ["exact", "vae-enum"])
def test_two_gloo_processes_equal_one_process_on_the_combined_batch(tmp_path, method):
    one, h1, _ = _train(tmp_path, "one", method, 1)
    two, h2, cfg = _train(tmp_path, "two", method, 2)
    assert cfg["train"]["processes"] == 2
    assert one.keys() == two.keys()
    for k in one:
        assert torch.allclose(one[k], two[k], atol=1e-5, rtol=0), k
    # the logged loss is the whole batch's, not rank 0's shard
    assert [h["train_loss"] for h in h2] == pytest.approx([h["train_loss"] for h in h1],
                                                          rel=1e-5)
    # and training moved the parameters from their initial values: the equality is not trivial
    from ppl_attention.pyro.inference.methods import get_method
    from ppl_attention.pyro.models import Seq2SeqAlignment

    mc = cfg["model"]
    torch.manual_seed(0)  # as `train --seed 0` builds the model
    init = Seq2SeqAlignment(family=get_method(method).family(mc["hidden"]), **mc).state_dict()
    if method == "exact":  # the inference network is unused there: still at its initial values
        assert torch.equal(two["q_emb.weight"], init["q_emb.weight"])
    assert max(float((two[k] - init[k]).abs().max()) for k in init) > 1e-3


def _small_model(method):
    from ppl_attention.data import Vocab, make_batches, make_task
    from ppl_attention.pyro.inference.methods import get_method
    from ppl_attention.pyro.models import Seq2SeqAlignment

    task = make_task("reorder", n_train=60, seed=0)
    sv = Vocab.build(s for s, _ in task.train.pairs)
    tv = Vocab.build(t for _, t in task.train.pairs)
    m = get_method(method)
    torch.manual_seed(0)
    model = Seq2SeqAlignment(len(sv), len(tv), hidden=8, family=m.family(8))
    return m, model, make_batches(task.train.pairs, sv, tv, 15)[1]


def _grads(model):
    out = [p.grad.clone() if p.grad is not None else torch.zeros_like(p)
           for p in model.parameters()]
    model.zero_grad()
    return out


@pytest.fixture
def float64():
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


@pytest.mark.parametrize("method", ["soft", "exact", "hard-enum", "vae-enum", "segment-crf"])
def test_shard_gradients_sum_to_the_whole_batch_gradient(method, float64):
    """What DDP all-reduces: the ranks' surrogate gradients on their shards add up to the whole
    batch's (float64; the methods whose loss has no random draw)."""
    from ppl_attention.pyro.inference.distributed import Distributed
    from ppl_attention.pyro.inference.methods import differentiable_loss

    m, model, batch = _small_model(method)
    elbo = m.elbo()
    whole, surrogate = differentiable_loss(m, elbo, model, batch, 0)
    surrogate.backward()
    g1 = _grads(model)
    halves = [Distributed(r, 2).shard(batch) for r in range(2)]
    assert [h.size for h in halves] == [8, 7]
    assert sorted(int(i) for h in halves for i in h.index) == sorted(batch.index.tolist())
    parts = 0.0
    for h in halves:
        loss, surrogate = differentiable_loss(m, elbo, model, h, 0)
        surrogate.backward()
        parts += loss
    g2 = _grads(model)
    assert any(g.abs().sum() > 0 for g in g1)
    assert parts == pytest.approx(whole, rel=1e-12)
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, atol=1e-10, rtol=0)


@pytest.mark.parametrize("method", ["exact", "vae-enum", "hard-sample", "vae-sample", "vae-rws",
                                    "vae-gumbel", "dirichlet", "bam-weibull"])
def test_the_surrogate_has_the_gradient_of_pyros_own_loss_and_grads(method, float64):
    """The (loss, surrogate) a DDP module returns: the same value and, at the same random draws,
    the same gradient as Pyro's ``elbo.loss_and_grads`` (which the surrogate is read out of for
    TraceGraph_ELBO and ReweightedWakeSleep through Pyro's private methods)."""
    import pyro

    from ppl_attention.pyro.inference.methods import differentiable_loss

    m, model, batch = _small_model(method)
    elbo = m.elbo()
    kwargs = dict(posterior=m.posterior, enumerate_z=m.enumerate_guide, kl_scale=m.kl_scale(0))
    if m.baseline == "soft":
        with torch.no_grad():
            kwargs["baseline"] = model.soft_token_log_likelihood(batch)
    pyro.set_rng_seed(3)
    theirs = elbo.loss_and_grads(
        lambda b: model.model(b, enumerate_z=m.enumerate_model, kl_scale=m.kl_scale(0)),
        lambda b: model.guide(b, **kwargs), batch)
    theirs = theirs[0] if isinstance(theirs, tuple) else theirs
    g1 = _grads(model)
    pyro.set_rng_seed(3)
    ours, surrogate = differentiable_loss(m, elbo, model, batch, 0, m.kl_scale(0))
    surrogate.backward()
    g2 = _grads(model)
    assert ours == pytest.approx(theirs, rel=1e-10)
    assert any(g.abs().sum() > 0 for g in g1)
    for a, b in zip(g1, g2):
        assert torch.allclose(a, b, atol=1e-10, rtol=1e-8)


@pytest.mark.parametrize("extra, message", [
    (["--batch-size", "1"], "cannot be split over 2 processes"),
    (["--backend", "numpyro"], "NumPyro shards batches over JAX devices"),
    (["--method", "hmm-exact", "--checkpoint-every", "0"], "--checkpoint-every must be at least 1"),
])
def test_a_bad_torchrun_launch_is_refused_before_any_work(tmp_path, monkeypatch, capsys, extra,
                                                          message):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    out = tmp_path / "never"
    assert main(["train", *ARGS, *extra, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
    assert not torch.distributed.is_initialized()
