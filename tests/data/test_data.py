import pytest

from ppl_attention.common.metrics import aer
from ppl_attention.data import DataError, Vocab, make_batches, make_task, read_pharaoh, read_tsv
from ppl_attention.data.corpus import read_sequences
from ppl_attention.data.pharaoh import write_pharaoh
from ppl_attention.data.tasks import reorder_task


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_tsv_round_trip_and_errors(tmp_path):
    good = _write(tmp_path, "a.tsv", "a b c\tx y\nd\tz\n")
    assert read_tsv(good) == [(["a", "b", "c"], ["x", "y"]), (["d"], ["z"])]
    with pytest.raises(DataError, match=r"b\.tsv:2: expected 'source<TAB>target', found no tab"):
        read_tsv(_write(tmp_path, "b.tsv", "a\tb\nno tab here\n"))
    with pytest.raises(DataError, match=r"c\.tsv:1: empty target side"):
        read_tsv(_write(tmp_path, "c.tsv", "a b\t  \n"))
    with pytest.raises(DataError, match=r"d\.tsv:1: empty source side"):
        read_tsv(_write(tmp_path, "d.tsv", "\tx\n"))
    with pytest.raises(DataError, match=r"e\.tsv:1: .*2 tabs"):
        read_tsv(_write(tmp_path, "e.tsv", "a\tb\tc\n"))


@pytest.mark.parametrize("reader", [read_tsv, read_sequences, read_pharaoh])
def test_a_file_that_is_not_utf8_is_refused_naming_file_line_and_column(tmp_path, reader):
    """A Latin-1 "é" (0xe9) on line 3, after a UTF-8 "é" (2 bytes) on line 2: the error names
    line 3 and the column in characters, not a byte offset into the file."""
    p = tmp_path / "latin1.tsv"
    p.write_bytes(b"a\tb\n\xc3\xa9 c\td\ne f\tx\xe9y\n")
    with pytest.raises(DataError, match=r"latin1\.tsv:3: not UTF-8 \(byte 0xe9 at column 6\)"):
        reader(p)


def test_pharaoh_errors(tmp_path):
    pairs = [(["a", "b"], ["x", "y", "z"]), (["c"], ["w"])]
    ok = _write(tmp_path, "ok.align", "0-0 1-1 1-2\n0-0\n")
    assert read_pharaoh(ok, pairs) == [{(0, 0), (1, 1), (1, 2)}, {(0, 0)}]
    with pytest.raises(DataError, match=r"bad\.align:1: malformed alignment pair '0_1'"):
        read_pharaoh(_write(tmp_path, "bad.align", "0_1\n0-0\n"), pairs)
    with pytest.raises(DataError, match=r"range\.align:2: pair 1-0 out of range \(source length 1"):
        read_pharaoh(_write(tmp_path, "range.align", "0-0\n1-0\n"), pairs)
    with pytest.raises(DataError, match=r"count\.align: 1 alignment lines but the corpus has 2"):
        read_pharaoh(_write(tmp_path, "count.align", "0-0\n"), pairs)
    out = tmp_path / "w.align"
    write_pharaoh(out, [{(1, 2), (0, 0)}, set()])
    assert out.read_text() == "0-0 1-2\n\n"


def test_vocab_unknowns_and_batches():
    v = Vocab.build([["a", "b"], ["b", "c"]])
    ids, n_unk = v.encode(["a", "zzz", "c"])
    assert ids[1] == v.unk and n_unk == 1
    pairs = [(["a", "b", "c"], ["a"]), (["a"], ["b", "c"]), (["zzz"], ["a", "b", "c"])]
    batches = make_batches(pairs, v, v, 2, array="numpy")
    assert sum(b.size for b in batches) == 3 and sum(b.n_unk for b in batches) == 1
    b = batches[0]
    assert (b.tgt_in[:, 0] == v.bos).all()
    for r in range(b.size):
        n = int(b.tgt_mask[r].sum())
        assert b.tgt_out[r, n - 1] == v.eos and (b.tgt_out[r, n:] == v.pad).all()
        assert int(b.src_mask[r].sum()) == len(pairs[int(b.index[r])][0])


def test_reorder_generator_log_likelihood_is_exact():
    """The generator's log p(y|x) equals a brute-force sum over every chunk-reversal pattern."""
    import itertools
    import math

    task = reorder_task(n_train=1, n_eval=5, seed=3, vocab=6, min_len=4, max_len=7, noise=0.2)
    # recover f from a noiseless twin with the same seed
    clean = reorder_task(n_train=1, n_eval=5, seed=3, vocab=6, min_len=4, max_len=7, noise=1e-12)
    f = {}
    for (x, y), gold in zip(clean.test.pairs, clean.test.gold):
        for i, j in gold:
            f[x[i]] = y[j]
    for (x, y), ll in zip(task.test.pairs, task.test.log_likelihood):
        chunks = [list(range(s, min(s + 3, len(x)))) for s in range(0, len(x), 3)]
        total = 0.0
        for flips in itertools.product([False, True], repeat=len(chunks)):
            order = sum((c[::-1] if fl else c for c, fl in zip(chunks, flips)), [])
            p = 0.5 ** len(chunks)
            for j, i in enumerate(order):
                p *= 0.8 * (y[j] == f.get(x[i])) + 0.2 / 6
            total += p
        assert math.isclose(math.log(total), ll, rel_tol=1e-9)


def test_tasks_gold_alignments():
    t = make_task("reverse", n_train=3, n_eval=2)
    x, y = t.train.pairs[0]
    assert y == x[::-1] and t.train.gold[0] == {(len(x) - 1 - j, j) for j in range(len(x))}
    with pytest.raises(ValueError, match="unknown task 'sort'"):
        make_task("sort")


def test_frame_accuracy():
    from ppl_attention.common.metrics import frame_accuracy

    gold = [{(0, 0), (0, 1), (1, 2)}, {(0, 0)}]
    assert frame_accuracy(gold, gold) == 1.0
    # frame 1 wrong, frame 2 with an extra link, frame 0 of pair 2 without any: 1 of 4 right
    assert frame_accuracy([{(0, 0), (1, 1), (1, 2), (0, 2)}, set()], gold) == 0.25
    task = make_task("durations", n_train=3, n_eval=3)
    assert task.test.frames and all(
        len({i for i, j in g if j == t}) == 1 for g, (x, y) in zip(task.test.gold,
                                                                 task.test.pairs)
        for t in range(len(y)))


def test_aer():
    assert aer([{(0, 0), (1, 1)}], [{(0, 0), (1, 1)}]) == 0.0
    assert aer([{(0, 0), (0, 1)}], [{(0, 0), (1, 1)}]) == pytest.approx(0.5)
    assert aer([{(0, 0)}], [{(0, 0)}], [{(0, 0), (1, 1)}]) == 0.0
