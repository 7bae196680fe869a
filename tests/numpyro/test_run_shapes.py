"""A NumPyro run's padded shapes (``ppl_attention.numpyro.jax_batches.choose_shapes``): chosen
from its data, few (one where lengths are even), every batch held by one; training, validation
and the tools on the run pad to them, so a run compiles its step once per shape; the padding
changes no number; a batch outside the set is said on stderr."""

import numpy as np
import pytest

from ppl_attention.data import Vocab, make_batches, make_task
from ppl_attention.numpyro.inference import evaluate as jeval
from ppl_attention.numpyro.inference.fit import fit
from ppl_attention.numpyro.inference.methods import get_method
from ppl_attention.numpyro.jax_batches import (
    MAX_SHAPES,
    SHAPE_TOLERANCE,
    Shapes,
    bucket,
    choose_shapes,
    to_jax,
)
from ppl_attention.numpyro.models import Seq2SeqAlignment


class _Shaped:
    """A batch as :func:`choose_shapes` reads it: its rows and its S and T."""

    def __init__(self, rows, S, T):
        self.size = rows
        self.src = np.zeros((rows, S))
        self.tgt_out = np.zeros((rows, T))


def _cells(shapes, batches):
    return sum(shapes.rows * a * b for x in batches
               for a, b in [shapes.fit(bucket(x.src.shape[1]), bucket(x.tgt_out.shape[1]))])


@pytest.mark.parametrize("lengths, most", [
    ([(9, 10), (10, 11), (10, 12), (8, 9)], 1),  # even lengths: one shape
    ([(3, 4), (4, 5), (60, 70), (120, 130), (200, 210), (6, 6)], MAX_SHAPES),  # widely varied
])
def test_the_shapes_hold_every_batch_and_stay_few(lengths, most):
    batches = [_Shaped(8, S, T) for S, T in lengths] + [_Shaped(5, 4, 4)]
    shapes = choose_shapes(batches)
    assert shapes.rows == 8 and 1 <= len(shapes.lengths) <= most
    buckets = Shapes(8, tuple({(bucket(S), bucket(T)) for S, T in lengths + [(4, 4)]}))
    for b in batches:
        assert shapes.fit(b.src.shape[1], b.tgt_out.shape[1]) is not None
    if len(shapes.lengths) < most:  # stopped merging by the padding's bound, not the count
        assert _cells(shapes, batches) <= SHAPE_TOLERANCE * _cells(
            Shapes(8, tuple(sorted(buckets.lengths, key=lambda x: x[0] * x[1]))), batches)
    assert Shapes.from_record(shapes.record()) == shapes


def test_a_run_compiles_once_per_shape_and_its_padding_changes_no_number(capsys):
    """Planted fault (``to_jax`` padding the target mask with True: padded positions counted
    in the loss) caught: the padded likelihood differs from the unpadded one."""
    task = make_task("reorder", n_train=60, n_eval=12, seed=3)
    sv = Vocab.build(s for s, _ in task.train.pairs)
    tv = Vocab.build(t for _, t in task.train.pairs)
    train = make_batches(task.train.pairs, sv, tv, 8, array="numpy")
    valid = make_batches(task.valid.pairs, sv, tv, 5, array="numpy")
    assert len({(b.src.shape[1], b.tgt_out.shape[1]) for b in train}) > 1
    model = Seq2SeqAlignment(len(sv), len(tv), hidden=8, family=get_method("exact").family(8))
    run = fit(model, train, "exact", steps=2 * len(train), src_vocab=sv, tgt_vocab=tv,
              valid=valid, valid_every=len(train), progress=False)
    shapes = Shapes.from_record(run.extra["shapes"])
    assert shapes == choose_shapes(train + valid)
    assert run.extra["compilations"] == len(shapes.lengths) < len(train)
    model, params = jeval.model_and_params(run, to_jax(train[0]))
    for b in train[:3] + valid:
        plain = np.asarray(jeval._exact_ll(model)(params, to_jax(b)))
        padded = np.asarray(jeval._exact_ll(model)(params, jeval.run_batch(run, b)))
        assert padded.shape[1] in {T for _, T in shapes.lengths}
        np.testing.assert_allclose(padded[: b.size, : plain.shape[1]], plain, rtol=1e-5,
                                   atol=1e-5)
        assert np.all(padded[:, plain.shape[1]:] == 0)
    capsys.readouterr()
    long = make_task("reorder", n_train=4, n_eval=2, seed=1, min_len=30, max_len=31)
    (outside,) = make_batches(long.train.pairs, sv, tv, 4, array="numpy")
    jeval.run_batch(run, outside)
    err = capsys.readouterr().err
    assert "outside the run's compiled shapes" in err and str(shapes) in err
