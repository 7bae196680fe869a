"""G2P: the CMUdict split, WER/PER, decoding (beam 1 = greedy) and the decode command's bad
lines. Tiny subsets only."""

import numpy as np
import pytest
import torch

from ppl_attention.cli import main
from ppl_attention.common.metrics import edit_distance, wer_per
from ppl_attention.data import Vocab
from ppl_attention.data.batching import collate
from ppl_attention.data.g2p import g2p_task, read_cmudict, split_of
from ppl_attention.pyro.inference import Run, get_method
from ppl_attention.pyro.inference.decode import TorchStepper, beam_search
from ppl_attention.pyro.models import Seq2SeqAlignment


@pytest.fixture(scope="module")
def task():
    return g2p_task()


def test_split_is_deterministic_disjoint_and_keeps_pronunciations_together(task):
    words = {name: {"".join(s) for s, _ in getattr(task, name).pairs}
             for name in ("train", "valid", "test")}
    assert not (words["train"] & words["test"]) and not (words["train"] & words["valid"])
    assert not (words["valid"] & words["test"])
    n = sum(len(w) for w in words.values())
    assert 0.86 < len(words["train"]) / n < 0.90 and 0.08 < len(words["test"]) / n < 0.11
    assert [split_of(w) for w in ("hello", "world", "a")] == [split_of(w) for w in
                                                             ("hello", "world", "a")]
    lex = read_cmudict()
    multi = next(w for w in sorted(words["test"]) if len(lex[w]) > 1)
    assert task.test.references[multi] == lex[multi]
    assert all(p.isalpha() for refs in task.test.references.values() for r in refs for p in r)
    stressed = read_cmudict(stress=True)
    assert any(p[-1].isdigit() for p in stressed["hello"][0])


def test_edit_distance_and_wer_per_on_hand_cases():
    assert edit_distance("kitten", "sitting") == 3
    assert edit_distance([], ["A"]) == 1
    refs = {"ab": [["A", "B"], ["A", "B", "C"]], "cd": [["K", "D"]]}
    hyps = {"ab": ["A", "B", "C"], "cd": ["K", "T", "D"]}
    wer, per = wer_per(hyps, refs)
    assert wer == 0.5  # "ab" matches its second pronunciation
    assert per == pytest.approx((0 + 1) / (3 + 2))  # closest reference lengths 3 and 2
    with pytest.raises(ValueError, match="no reference"):
        wer_per({"zz": ["Z"]}, refs)


def _run(method="exact", seed=0, pairs=None):
    pairs = pairs or [(list("cat"), ["K", "AE", "T"]), (list("dog"), ["D", "AO", "G"])]
    sv = Vocab.build(s for s, _ in pairs)
    tv = Vocab.build(t for _, t in pairs)
    torch.manual_seed(seed)
    model = Seq2SeqAlignment(len(sv), len(tv), hidden=8, family=get_method(method).family(8))
    model.eval()
    return Run(model, method, sv, tv, {"data": {"task": "g2p"}})


def _greedy(run, source, max_len):
    model, tv = run.model, run.tgt_vocab
    b = collate([(source, [])], [0], run.src_vocab, tv)
    H = model.encode(b.src, b.src_mask)
    state, prev, out, total = model.initial_state(H), torch.tensor([tv.bos]), [], 0.0
    with torch.no_grad():
        for _ in range(max_len):
            state, e = model.decoder_step(H, b.src_mask, model.tgt_emb(prev), state)
            logp = model.predictive_log_probs(H, b.src_mask, state, e)[0]
            logp[tv.pad] = logp[tv.bos] = -torch.inf
            tok = int(logp.argmax())
            total += float(logp[tok])
            if tok == tv.eos:
                break
            out.append(tv.itos[tok])
            prev = torch.tensor([tok])
    return out, total


@pytest.mark.parametrize("method", ["exact", "soft"])
def test_beam_one_equals_greedy_and_wider_beams_score_no_worse(method):
    run = _run(method)
    for word in ("cat", "dog", "cog"):
        g, g_score = _greedy(run, list(word), 2 * len(word) + 10)
        b, b_score = beam_search(run, list(word), beam=1)
        assert b == g and b_score == pytest.approx(g_score, abs=1e-5)
        _, wide = beam_search(run, list(word), beam=4)
        assert wide >= b_score - 1e-6


@pytest.mark.parametrize("method", ["exact", "hmm-exact", "soft"])
def test_reordered_hypotheses_keep_their_own_decoder_state_and_filter(method):
    """Beam search keeps, per live hypothesis, the decoder state (and hmm-exact's filter) of its
    own prefix while hypotheses are reordered and duplicated: after two reorders the predictive
    of every row equals the predictive of that row's prefix decoded alone."""
    run = _run(method, seed=1)
    tv = run.tgt_vocab
    K, AE, T, D = (tv.stoi[p] for p in ("K", "AE", "T", "D"))
    source = list("catdog")
    prefixes = [[K], [AE], [T]]
    s = TorchStepper(run, source)
    s.log_probs([tv.bos])
    s.keep([0, 0, 0], [K, AE, T])
    s.log_probs([K, AE, T])
    rows, toks = [2, 0, 0, 1], [D, T, K, AE]
    s.keep(rows, toks)
    prefixes = [prefixes[r] + [t] for r, t in zip(rows, toks)]
    batched = s.log_probs(toks)
    for i, prefix in enumerate(prefixes):
        alone = TorchStepper(run, source)
        prev = [tv.bos] + prefix
        for t in range(len(prev)):
            logp = alone.log_probs([prev[t]])
            if t + 1 < len(prev):
                alone.keep([0], [prev[t + 1]])
        assert np.allclose(batched[i], logp[0], atol=1e-5), (i, prefix)
    assert not np.allclose(batched[0], batched[1], atol=1e-3)  # the rows do differ


def test_exact_predictive_is_a_distribution_and_matches_the_marginal():
    run = _run("exact")
    model, tv = run.model, run.tgt_vocab
    b = collate([(list("cat"), ["K", "AE", "T"])], [0], run.src_vocab, tv)
    with torch.no_grad():
        ll = model.exact_token_log_likelihood(b)[0]
        H = model.encode(b.src, b.src_mask)
        state = model.initial_state(H)
        for t in range(b.tgt_in.shape[1]):
            state, e = model.decoder_step(H, b.src_mask, model.tgt_emb(b.tgt_in[:, t]), state)
            logp = model.predictive_log_probs(H, b.src_mask, state, e)[0]
            assert float(logp.exp().sum()) == pytest.approx(1.0, abs=1e-5)
            assert float(logp[b.tgt_out[0, t]]) == pytest.approx(float(ll[t]), abs=1e-5)


def test_decode_command_reports_bad_lines_and_goes_on(tmp_path, capsys):
    run = _run("exact")
    run.save(tmp_path / "run")
    words = tmp_path / "words.txt"
    words.write_text("cat\n\ndo#g\n")
    assert main(["decode", str(tmp_path / "run"), "--data", str(words), "--beam", "2"]) == 1
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) == 3 and lines[0].startswith("cat\t") and lines[1] == "\t"
    assert lines[2].startswith("do#g\t")
    assert "words.txt:2: empty line" in err and "words.txt:3: 1 token(s) unseen" in err
    assert main(["decode", str(tmp_path / "run"), "--data", str(words), "--beam", "0"]) == 2


def test_ensemble_scores_with_the_mixture_of_its_members_predictives():
    """The ensemble's score of its hypothesis is Σ_t log (1/M) Σ_m p_m(y_t | x, y<t), each
    member's predictive computed independently by teacher forcing (the forward algorithm for
    hmm-exact); a run twice is the run alone; member order does not matter."""
    runs = [_run("exact", 1), _run("hmm-exact", 2), _run("soft", 3)]
    pairs = [(list("cat"), ["K", "AE", "T"]), (list("dog"), ["D", "AO", "G"])]
    data = collate(pairs, [0, 1], runs[0].src_vocab, runs[0].tgt_vocab)
    for i, r in enumerate(runs):  # a little maximum likelihood, so that hypotheses end
        opt = torch.optim.Adam(r.model.parameters(), lr=0.05)
        for _ in range(10 + 5 * i):
            opt.zero_grad()
            ll = (r.model.soft_token_log_likelihood(data) if r.method == "soft"
                  else r.model.exact_token_log_likelihood(data))
            (-ll.sum()).backward()
            opt.step()
    for word, beam in (("cat", 1), ("dgo", 1), ("cat", 4), ("dgo", 4)):
        # beam 4: the members' states and filters follow the hypotheses they extend
        hyp, score = beam_search(runs, list(word), beam=beam)
        assert 0 < len(hyp) < 2 * len(word) + 10  # ended by <eos>, which the score includes
        b = collate([(list(word), hyp)], [0], runs[0].src_vocab, runs[0].tgt_vocab)
        with torch.no_grad():
            ll = torch.stack([r.model.exact_token_log_likelihood(b)[0] for r in runs[:2]]
                             + [runs[2].model.soft_token_log_likelihood(b)[0]])
        mixture = float((ll.logsumexp(0) - torch.log(torch.tensor(3.0))).sum())
        assert score == pytest.approx(mixture, abs=1e-4)
        assert beam_search(runs[::-1], list(word), beam=beam) == (hyp, pytest.approx(score))
        assert beam_search(runs, list(word), beam=4)[1] >= score - 1e-6
        alone = beam_search(runs[1], list(word), beam=3)
        assert beam_search([runs[1], runs[1]], list(word), beam=3) == (
            alone[0], pytest.approx(alone[1], abs=1e-5))
    assert beam_search(runs[:2], list("cat"))[1] != pytest.approx(
        beam_search(runs[0], list("cat"))[1], abs=1e-3)


def test_ensemble_of_runs_with_other_vocabularies_is_refused(tmp_path, capsys):
    a = _run("exact")
    b = _run("exact", pairs=[(list("cab"), ["K", "AE", "B"])])
    with pytest.raises(ValueError, match="same vocabularies: the src vocabulary"):
        beam_search([a, b], list("cat"))
    a.save(tmp_path / "a")
    b.save(tmp_path / "b")
    _run("exact", 5).save(tmp_path / "c")
    words = tmp_path / "words.txt"
    words.write_text("cat\ndog\n")
    assert main(["decode", str(tmp_path / "a"), str(tmp_path / "b"), "--data", str(words)]) == 2
    assert "same vocabularies" in capsys.readouterr().err
    assert main(["decode", str(tmp_path / "a"), str(tmp_path / "c"), "--data", str(words),
                 "--beam", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in lines] == ["cat", "dog"]
    expect = [" ".join(beam_search([a, Run.load(tmp_path / "c")], list(w), beam=2)[0])
              for w in ("cat", "dog")]
    assert [line.split("\t")[1] for line in lines] == expect
    other = _run("exact")
    other.config = {"data": {"task": "reorder"}}
    other.save(tmp_path / "reorder")
    assert main(["evaluate", str(tmp_path / "reorder"), "--ensemble", str(tmp_path / "a")]) == 2
    assert "only G2P runs" in capsys.readouterr().err


def test_monotonic_share():
    from ppl_attention.pyro.inference.evaluate import monotonic_share

    links = {0: {(0, 0), (1, 1), (1, 2)}, 1: {(2, 0), (1, 1)}, 2: set()}
    assert monotonic_share(links) == pytest.approx(2 / 3)
