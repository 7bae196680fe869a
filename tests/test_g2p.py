"""G2P: the CMUdict split, WER/PER, decoding (beam 1 = greedy) and the decode command's bad
lines. Tiny subsets only."""

import pytest
import torch

from ppl_attention.cli import main
from ppl_attention.data import Vocab
from ppl_attention.data.batching import collate
from ppl_attention.data.g2p import g2p_task, read_cmudict, split_of
from ppl_attention.inference import Run, get_method
from ppl_attention.inference.decode import beam_search
from ppl_attention.metrics import edit_distance, wer_per
from ppl_attention.models import Seq2SeqAlignment


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


def _run(method="exact"):
    pairs = [(list("cat"), ["K", "AE", "T"]), (list("dog"), ["D", "AO", "G"])]
    sv = Vocab.build(s for s, _ in pairs)
    tv = Vocab.build(t for _, t in pairs)
    torch.manual_seed(0)
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


def test_monotonic_share():
    from ppl_attention.inference.evaluate import monotonic_share

    links = {0: {(0, 0), (1, 1), (1, 2)}, 1: {(2, 0), (1, 1)}, 2: set()}
    assert monotonic_share(links) == pytest.approx(2 / 3)
