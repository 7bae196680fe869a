"""Seq2SeqAlignment: exact likelihood against brute force, ELBO ≤ log-likelihood, checkpoints,
resume and determinism."""

import itertools

import pyro
import pytest
import torch
from pyro import poutine
from pyro.infer import TraceEnum_ELBO

from ppl_attention.data import Vocab, make_batches, make_task
from ppl_attention.pyro.inference import Run, evaluate, fit, get_method
from ppl_attention.pyro.models import Seq2SeqAlignment


def _tiny(method="exact", hidden=8, n=12, seed=0):
    task = make_task("reorder", n_train=n, n_eval=6, seed=seed)
    sv = Vocab.build(s for s, _ in task.train.pairs)
    tv = Vocab.build(t for _, t in task.train.pairs)
    torch.manual_seed(seed)
    model = Seq2SeqAlignment(len(sv), len(tv), hidden=hidden,
                             family=get_method(method).family(hidden))
    return task, sv, tv, model


def test_exact_nll_equals_brute_force_over_alignments():
    """Σ over all S^T alignment paths of the Pyro program's joint (conditioned z) = the
    hand-written marginal = TraceEnum_ELBO's loss."""
    pairs = [(["s1", "s2", "s3"], ["t1", "t2"]), (["s2", "s3"], ["t2", "t1"])]
    sv = Vocab.build(s for s, _ in pairs)
    tv = Vocab.build(t for _, t in pairs)
    torch.manual_seed(0)
    model = Seq2SeqAlignment(len(sv), len(tv), hidden=6).double()
    for pair in pairs:
        (b,) = make_batches([pair], sv, tv, 1)
        S, T = b.src.shape[1], b.tgt_out.shape[1]
        terms = []
        for path in itertools.product(range(S), repeat=T):
            z = torch.tensor([path])
            tr = poutine.trace(poutine.condition(model.model, data={"align": z})).get_trace(b)
            terms.append(tr.log_prob_sum())
        brute = torch.logsumexp(torch.stack(terms), 0)
        exact = model.exact_token_log_likelihood(b).sum()
        assert torch.allclose(exact, brute, atol=1e-9), (exact, brute)
        pyro.clear_param_store()
        loss = TraceEnum_ELBO(max_plate_nesting=2).loss(
            lambda bb: model.model(bb, enumerate_z=True), lambda bb: None, b)
        assert abs(loss + brute.item()) < 1e-6


def test_vae_enum_elbo_below_exact_log_likelihood_on_every_pair():
    task, sv, tv, model = _tiny("vae-enum", hidden=16)
    model = model.double()
    (b,) = make_batches(task.test.pairs, sv, tv, 64)
    with torch.no_grad():
        ll = model.exact_token_log_likelihood(b).sum(-1)  # [B]
        log_prior, emis = model.prior_and_emissions(b)
        H = model.encode(b.src, b.src_mask)
        q_scores = model.inference_scores(b, H).masked_fill(~b.src_mask.unsqueeze(1), -torch.inf)
        log_q = q_scores.log_softmax(-1)
        terms = log_q.exp() * (log_prior + emis - log_q)
        elbo = torch.nan_to_num(terms, nan=0.0).sum(-1).masked_fill(~b.tgt_mask, 0).sum(-1)
        pyro.clear_param_store()
        loss = TraceEnum_ELBO(max_plate_nesting=2).loss(
            model.model, lambda bb: model.guide(bb, enumerate_z=True), b)
    assert loss == pytest.approx(-elbo.sum().item(), rel=1e-9)
    assert torch.all(elbo <= ll + 1e-9)
    assert torch.all(ll - elbo > 1e-6)  # a random q is strictly worse than the posterior


def _fit(method, steps, seed=0, resume=None, hidden=8, lr_schedule="cosine"):
    task, sv, tv, model = _tiny(method, hidden=hidden, n=40)
    batches = make_batches(task.train.pairs, sv, tv, 8, shuffle=True)
    valid = make_batches(task.valid.pairs, sv, tv, 8)
    if resume is not None:
        model = resume.model
    run = fit(model, batches, method, steps, seed, src_vocab=sv, tgt_vocab=tv, valid=valid,
              valid_every=3, resume=resume, progress=False, lr_schedule=lr_schedule)
    return task, run


@pytest.mark.parametrize("method", ["exact", "vae-sample", "dirichlet"])
@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_training_is_deterministic_and_resume_continues_identically(tmp_path, method, schedule):
    _, straight = _fit(method, 6, lr_schedule=schedule)
    _, again = _fit(method, 6, lr_schedule=schedule)
    losses = [h["train_loss"] for h in straight.history]
    assert losses == [h["train_loss"] for h in again.history]
    if schedule == "cosine":  # its rate depends on the total steps, so 4 + 2 ≠ 6 by design
        return
    _, first = _fit(method, 4, lr_schedule=schedule)
    first.save(tmp_path / "run")
    resumed = Run.load(tmp_path / "run", which="last")
    _, cont = _fit(method, 6, resume=resumed, lr_schedule=schedule)
    assert [h["train_loss"] for h in cont.history] == losses


def test_checkpoint_round_trip_gives_identical_evaluation(tmp_path):
    task, run = _fit("vae-enum", 5)
    test = make_batches(task.test.pairs, run.src_vocab, run.tgt_vocab, 64, gold=task.test.gold)
    run.model.load_state_dict(run.extra["best_model"])
    before = evaluate(run, test, gold=task.test.gold)
    run.save(tmp_path / "r")
    after = evaluate(Run.load(tmp_path / "r"), test, gold=task.test.gold)
    assert before == after


def test_interrupted_save_leaves_nothing_that_looks_finished(tmp_path, monkeypatch):
    _, run = _fit("exact", 2)

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(KeyboardInterrupt):
        run.save(tmp_path / "r")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="not a complete run directory"):
        Run.load(tmp_path / "r")


def test_unknown_method_lists_valid_names():
    with pytest.raises(ValueError,
                       match=r"unknown method 'vae'; valid: soft, .*, exact, .*vae-enum"):
        get_method("vae")


def test_exact_loss_on_a_padded_batch_equals_the_marginal():
    """Padded target positions add nothing to the enumerated loss (a masked enumerated site
    would add log S per padded token)."""
    task, sv, tv, model = _tiny("exact", n=12)
    (b,) = make_batches(task.train.pairs, sv, tv, 12)
    assert (~b.tgt_mask).any()
    pyro.clear_param_store()
    with torch.no_grad():
        loss = TraceEnum_ELBO(max_plate_nesting=2).loss(
            lambda bb: model.model(bb, enumerate_z=True), lambda bb: None, b)
        exact = -float(model.exact_token_log_likelihood(b).sum())
    assert loss == pytest.approx(exact, rel=1e-6)


def test_a_run_killed_midway_resumes_from_its_partial_checkpoint(tmp_path, monkeypatch):
    import importlib

    fit_module = importlib.import_module("ppl_attention.pyro.inference.fit")

    _, straight = _fit("exact", 6, lr_schedule="cosine")
    losses = [h["train_loss"] for h in straight.history]
    task, sv, tv, model = _tiny("exact", hidden=8, n=40)
    batches = make_batches(task.train.pairs, sv, tv, 8, shuffle=True)
    valid = make_batches(task.valid.pairs, sv, tv, 8)
    real = fit_module.loss_and_grads
    calls = {"n": 0}

    def dying(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt  # killed during step 5
        return real(*args, **kwargs)

    monkeypatch.setattr(fit_module, "loss_and_grads", dying)
    with pytest.raises(KeyboardInterrupt):
        fit(model, batches, "exact", 6, 0, src_vocab=sv, tgt_vocab=tv, valid=valid,
            valid_every=3, progress=False, out=tmp_path / "run", checkpoint_every=2)
    monkeypatch.setattr(fit_module, "loss_and_grads", real)
    assert (tmp_path / "run" / "PARTIAL").exists() and not (tmp_path / "run" / "COMPLETE").exists()
    with pytest.raises(ValueError, match="not a complete run"):
        Run.load(tmp_path / "run")  # evaluation refuses a partial run
    resumed = Run.load(tmp_path / "run", which="last", partial=True)
    assert resumed.step == 4
    run = fit(resumed.model, batches, "exact", 6, 0, src_vocab=sv, tgt_vocab=tv, valid=valid,
              valid_every=3, resume=resumed, progress=False, out=tmp_path / "run")
    assert [h["train_loss"] for h in run.history] == losses
    assert (tmp_path / "run" / "COMPLETE").exists()
