"""Data kinds: what feeds a model, declared by the model (``data = "pairs"``). A kind knows its
built-in tasks, how to read a ``--data-dir``, the dimensions a model is built with, and how to
cut a split into batches.

=============  ============================  ==================================  ===============
kind           a batch                        model dimensions                   built-in tasks
=============  ============================  ==================================  ===============
``pairs``      :class:`~.batching.Batch`      ``src_vocab``, ``tgt_vocab``        copy, reverse,
               (source/target token pairs)                                       reorder, g2p
``sequences``  a ``Batch`` of (x, x) pairs    ``vocab``                           the same (one
                                                                                 ``--side``)
``images``     :class:`~.digits.ImageBatch`   ``n_tokens``, ``token_dim``,        digits
                                              ``n_classes``
``graph``      one :class:`~.graphs.Graph`    ``in_dim``, ``n_classes``           sbm, karate
=============  ============================  ==================================  ===============

Every batch has ``size`` (rows) and ``n_tokens`` (what the training loss is averaged over:
target tokens, examples or labelled nodes). A *source* — ``{"task": …, "task_seed": …}`` or
``{"data_dir": …}`` plus the kind's options — is what a run directory records to find its data
again.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import DataError, UserError
from .batching import array_kind, make_batches
from .conllu import read_conllu
from .corpus import read_sequences, read_tsv
from .pharaoh import read_pharaoh
from .tasks import TASKS, Split, make_task
from .vocab import Vocab

__all__ = ["DATA_KINDS", "DataKind", "Dataset", "data_kind", "load_split", "cached_task"]


@dataclass
class Dataset:
    """A source's splits (``valid`` may be None), vocabularies (None for images and graphs)
    and the dimensions a model of this kind is built with."""

    kind: str
    source: dict
    train: object
    valid: object
    test: object
    vocabs: dict = field(default_factory=dict)
    dims: dict = field(default_factory=dict)


@functools.lru_cache(maxsize=2)
def cached_task(task: str, task_seed: int = 0, n_train: int | None = None, stress: bool = False,
                depth: int | None = None):
    """A built-in pairs task, made once per process (``compare`` trains many runs on it)."""
    if n_train is not None and n_train < 1:
        raise UserError(f"--n-train must be at least 1, got {n_train}")
    kwargs = {} if n_train is None else {"n_train": n_train}
    if stress:
        kwargs["stress"] = True
    if depth is not None:
        kwargs["depth"] = depth
    return make_task(task, seed=task_seed, **kwargs)


def load_split(data_dir: Path, name: str, required: bool = True) -> Split | None:
    """``DIR/name.tsv`` with its gold alignments ``DIR/name.align`` (Pharaoh) and its gold
    trees of the sources ``DIR/name.conllu`` (CoNLL-U: UAS in ``evaluate``) when present."""
    tsv = Path(data_dir) / f"{name}.tsv"
    if not tsv.exists():
        if required:
            raise DataError(f"{tsv}: missing (a --data-dir holds train.tsv, valid.tsv, test.tsv)")
        return None
    pairs = read_tsv(tsv)
    align = Path(data_dir) / f"{name}.align"
    gold = read_pharaoh(align, pairs) if align.exists() else None
    conllu = Path(data_dir) / f"{name}.conllu"
    trees = read_conllu(conllu, pairs) if conllu.exists() else None
    return Split(pairs, gold, trees=trees)


def gold_for(pairs: list, gold) -> dict:
    """What ``--gold FILE`` holds for ``pairs``: trees of the sources when it is CoNLL-U
    (``.conllu``), else Pharaoh alignments."""
    if str(gold).endswith(".conllu"):
        return {"trees": read_conllu(gold, pairs)}
    return {"gold": read_pharaoh(gold, pairs)}


class DataKind:
    """One kind of data (module docstring). ``options``: the kind's own data options, name →
    (default, help, type); ``tasks``: its built-in tasks."""

    name = ""
    dims: tuple[str, ...] = ()
    tasks: tuple[str, ...] = ()
    options: dict[str, tuple[object, str, type]] = {}  # name → (default, help, type)
    token_data = True  # scored by likelihood per token (else by the model's own report)
    #: the observations are discrete (tokens, labels): an NLL below 0 is impossible
    #: (:mod:`ppl_attention.core.divergence`)
    discrete_observations = True
    #: a batch is laid out as a pairs batch, so the alignment site ``[B, T]`` over the S source
    #: positions is an alignment the tools read (``align``, AER, ``analyze``, ``calibrate``)
    alignments = False
    #: what ``--data-dir`` holds for this kind (None: it reads built-in tasks only)
    data_dir_help: str | None = None

    def source(self, task=None, data_dir=None, task_seed: int = 0, **options) -> dict:
        """The recorded data source, checked: a built-in task of this kind or a data dir."""
        unknown = sorted(k for k, v in options.items() if k not in self.options and v is not None)
        if unknown:
            raise UserError(f"--{unknown[0].replace('_', '-')} does not apply to {self.name} data")
        if (task is None) == (data_dir is None):
            raise UserError(f"{self.name} data: give one of --task ({', '.join(self.tasks)}) or "
                            f"--data-dir")
        if task is not None and task not in self.tasks:
            raise UserError(f"--task {task} is not {self.name} data; {self.name} tasks: "
                            f"{', '.join(self.tasks)}")
        src = {"task": task, "task_seed": task_seed} if task is not None else \
            {"data_dir": str(Path(data_dir).resolve())}
        for k, (default, _, _) in self.options.items():
            v = options.get(k)
            src[k] = default if v is None else v
        return src

    def load(self, source: dict) -> Dataset:  # pragma: no cover - abstract
        raise NotImplementedError

    def evaluation_split(self, source: dict, data=None, gold=None, data_dir=None):
        """What a run is scored on: ``data`` (a file; with ``gold`` alignments), ``data_dir``'s
        test split, or the test split of the run's own ``source``."""
        if data is not None or data_dir is not None or gold is not None:
            raise UserError(f"--data / --data-dir / --gold: {self.name} data is evaluated on "
                            f"the test split of its built-in task")
        return self.test_split(source)

    def batches(self, split, vocabs: dict, batch_size: int, shuffle: bool = False,
                seed: int = 0, model=None, source: dict | None = None) -> list:
        """A split cut into batches (``model`` and ``source`` for what limits them)."""
        raise NotImplementedError  # pragma: no cover - abstract


class PairsData(DataKind):
    """Source/target token pairs: a built-in task or ``--data-dir`` with train/valid/test.tsv
    (``source tokens<TAB>target tokens``) and optional Pharaoh ``.align`` files."""

    name = "pairs"
    dims = ("src_vocab", "tgt_vocab")
    alignments = True
    data_dir_help = ("folder with train.tsv, valid.tsv, test.tsv (+ gold alignments *.align, "
                     "gold source trees *.conllu)")
    tasks = tuple(TASKS)  # the built-in pair tasks: data/tasks.py's table
    options = {"n_train": (None, "training pairs of a built-in task (default: the task's own; "
                           "valid and test sets do not depend on it)", int),
               "stress": (False, "g2p: keep stress digits on vowels", bool),
               "depth": (None, "trees: operators on the deepest path of each formula (1-8; "
                         "default 4)", int)}

    def source(self, task=None, data_dir=None, task_seed: int = 0, **options) -> dict:
        src = super().source(task, data_dir, task_seed, **options)
        if "data_dir" in src and src.get("n_train") is not None:
            raise UserError("--n-train sets the size of a built-in --task, not of a --data-dir")
        if src.get("stress") and src.get("task") != "g2p":
            raise UserError("--stress applies to --task g2p only")
        if src.get("depth") is not None and src.get("task") != "trees":
            raise UserError("--depth applies to --task trees only")
        return {k: v for k, v in src.items() if v is not None and v is not False}

    def splits(self, source: dict) -> tuple:
        if "data_dir" in source:
            d = Path(source["data_dir"])
            return tuple(load_split(d, s, s != "valid") for s in ("train", "valid", "test"))
        task = cached_task(source["task"], source.get("task_seed", 0), source.get("n_train"),
                           source.get("stress", False), source.get("depth"))
        return task.train, task.valid, task.test

    def load(self, source: dict) -> Dataset:
        train, valid, test = self.splits(source)
        vocabs = {"src_vocab": Vocab.build(s for s, _ in train.pairs),
                  "tgt_vocab": Vocab.build(t for _, t in train.pairs)}
        return Dataset(self.name, source, train, valid, test, vocabs,
                       {k: len(v) for k, v in vocabs.items()})

    def evaluation_split(self, source: dict, data=None, gold=None, data_dir=None):
        if data is not None:
            pairs = read_tsv(data)
            return Split(pairs, **{"gold": None, **(gold_for(pairs, gold) if gold else {})})
        if gold is not None:
            raise UserError("--gold goes with --data")
        if data_dir is not None:
            return load_split(Path(data_dir), "test")
        return self.test_split(source)

    def test_split(self, source: dict):
        """The test split of a recorded source (for evaluating a run on its own data)."""
        if "data_dir" in source and not (Path(source["data_dir"]) / "test.tsv").is_file():
            raise DataError("give --data FILE.tsv or --data-dir DIR (the corpus this run was "
                            "trained on has no test.tsv here)")
        return self.splits(source)[2]

    def batches(self, split, vocabs: dict, batch_size: int, shuffle: bool = False,
                seed: int = 0, model=None, source: dict | None = None) -> list:
        return make_batches(split.pairs, vocabs["src_vocab"], vocabs["tgt_vocab"], batch_size,
                            gold=split.gold, shuffle=shuffle, seed=seed,
                            array=array_kind(model))


class SequencesData(PairsData):
    """Single sequences x (a sequence model reads (x, x) pairs): one side of a pairs task or of a
    ``--data-dir``'s TSVs (or one-column files)."""

    name = "sequences"
    dims = ("vocab",)
    data_dir_help = "folder with train.tsv, valid.tsv, test.tsv (one --side of each, or one "\
        "sequence a line)"
    options = {"n_train": PairsData.options["n_train"],
               "side": ("target", "which side of a pair corpus (or task) is the sequence", str),
               "on_long": ("error", "a sequence longer than the model's max_len: error, or "
                           "truncate (with a warning)", str),
               "n_eval": (None, "score only the first N test sequences (default: all)", int)}

    def source(self, task=None, data_dir=None, task_seed: int = 0, **options) -> dict:
        src = DataKind.source(self, task, data_dir, task_seed, **options)
        if src["side"] not in ("source", "target"):
            raise UserError(f"--side must be source or target, got {src['side']!r}")
        if src["on_long"] not in ("error", "truncate"):
            raise UserError(f"--on-long must be error or truncate, got {src['on_long']!r}")
        if "data_dir" in src and src.get("n_train") is not None:
            raise UserError("--n-train sets the size of a built-in --task, not of a --data-dir")
        return {k: v for k, v in src.items() if v is not None}

    def sequences(self, source: dict, split: str) -> tuple[list[list[str]], str] | None:
        side = source["side"]
        if "data_dir" in source:
            path = Path(source["data_dir"]) / f"{split}.tsv"
            if not path.exists():
                if split != "valid":
                    raise DataError(f"{path}: missing (a --data-dir holds train.tsv, valid.tsv, "
                                    f"test.tsv)")
                return None
            return read_sequences(path, side), str(path)
        task = cached_task(source["task"], source.get("task_seed", 0), source.get("n_train"))
        pairs = getattr(task, split).pairs
        return [s if side == "source" else t for s, t in pairs], f"--task {source['task']} {split}"

    def test_split(self, source: dict):
        seqs, where = self.sequences(source, "test")
        n = source.get("n_eval")
        if n is not None and n < 2:
            raise UserError(f"--n-eval must be at least 2, got {n}")
        return (seqs[:n] if n else seqs), where

    def load(self, source: dict) -> Dataset:
        parts = {s: self.sequences(source, s) for s in ("train", "valid")}
        parts["test"] = self.test_split(source)
        vocab = Vocab.build(parts["train"][0])
        return Dataset(self.name, source, parts["train"], parts["valid"], parts["test"],
                       {"src_vocab": vocab, "tgt_vocab": vocab}, {"vocab": len(vocab)})

    def evaluation_split(self, source: dict, data=None, gold=None, data_dir=None):
        if gold is not None:
            raise UserError("--gold: a sequence model has no alignments to score")
        side = source.get("side", "target")
        if data is not None:
            return read_sequences(data, side), str(data)
        if data_dir is not None:
            path = Path(data_dir) / "test.tsv"
            return read_sequences(path, side), str(path)
        if "data_dir" in source and not (Path(source["data_dir"]) / "test.tsv").is_file():
            raise DataError("give --data FILE or --data-dir DIR (the run's training data has no "
                            "test.tsv here)")
        return self.test_split(source)

    def batches(self, split, vocabs: dict, batch_size: int, shuffle: bool = False,
                seed: int = 0, model=None, source: dict | None = None) -> list:
        """(x, x) batches; sequences longer than the model's ``max_len`` refused or truncated
        as the source's ``on_long`` says."""
        seqs, where = split if isinstance(split, tuple) else (split, "evaluation data")
        max_len = getattr(model, "config", {}).get("max_len")
        if max_len is not None:
            seqs = limit_length(seqs, where, max_len, (source or {}).get("on_long", "error"))
        v = vocabs["src_vocab"]
        return make_batches([(s, s) for s in seqs], v, v, batch_size, shuffle=shuffle, seed=seed,
                            array=array_kind(model))


def limit_length(seqs: list[list[str]], where: str, max_len: int, on_long: str) -> list:
    """Refuse (``on_long="error"``) or truncate sequences longer than ``max_len`` tokens."""
    long = [i for i, s in enumerate(seqs) if len(s) > max_len]
    if not long:
        return seqs
    if on_long == "error":
        i = long[0]
        raise DataError(f"{where}: sequence {i + 1} has {len(seqs[i])} tokens, more than "
                        f"--max-len {max_len} ({len(long)} such; --on-long truncate cuts them)")
    warnings.warn(f"{where}: {len(long)} sequence(s) longer than --max-len {max_len} truncated",
                  stacklevel=2)
    return [s[:max_len] for s in seqs]


class BagsData(DataKind):
    """Bags of real-valued instances, one label each (:mod:`ppl_attention.data.bags`): the
    built-in ``--task digit-bags`` or a ``--data-dir`` with ``train.npz``, ``test.npz`` and
    optionally ``valid.npz`` (arrays ``x [N, M, F]``, ``y [N]``, optional ``mask [N, M]``).
    A batch is laid out as a pairs batch with one target, the label; the model reads the
    instances' features as ``batch.features [B, S, F]``."""

    name = "bags"
    dims = ("n_features", "n_classes")
    alignments = True
    data_dir_help = ("folder with train.npz, test.npz (+ valid.npz): x [N, M, F] float, "
                     "y [N] int, optional mask [N, M] bool")
    tasks = ("digit-bags",)
    options = {"n_train": (None, "training bags of --task digit-bags (default 600; valid and "
                           "test sets do not depend on it)", int)}

    def source(self, task=None, data_dir=None, task_seed: int = 0, **options) -> dict:
        src = super().source(task, data_dir, task_seed, **options)
        if "data_dir" in src and src.get("n_train") is not None:
            raise UserError("--n-train sets the size of a built-in --task, not of a --data-dir")
        if src.get("n_train") is not None and src["n_train"] < 1:
            raise UserError(f"--n-train must be at least 1, got {src['n_train']}")
        return {k: v for k, v in src.items() if v is not None}

    def splits(self, source: dict) -> tuple:
        if "data_dir" in source:
            d = Path(source["data_dir"])
            return tuple(self._read(d / f"{s}.npz") if s != "valid" or
                         (d / f"{s}.npz").is_file() else None
                         for s in ("train", "valid", "test"))
        from .bags import digit_bags

        kwargs = {} if source.get("n_train") is None else {"n_train": source["n_train"]}
        task = digit_bags(seed=source.get("task_seed", 0), **kwargs)
        return task.train, task.valid, task.test

    @staticmethod
    def _read(path: Path) -> Split:
        from .bags import read_bags

        return Split(read_bags(path), None)

    def load(self, source: dict) -> Dataset:
        from .bags import check_labels

        train, valid, test = self.splits(source)
        n_classes = max(b.label for b in train.pairs) + 1
        widths = {b.features.shape[1] for s in (train, valid, test) if s for b in s.pairs}
        if len(widths) != 1:
            raise DataError(f"bags with different numbers of features across the splits: "
                            f"{sorted(widths)}")
        for name, split in (("valid", valid), ("test", test)):
            if split is not None:
                check_labels(split.pairs, n_classes, f"{name} split")
        return Dataset(self.name, source, train, valid, test,
                       {"src_vocab": None, "tgt_vocab": None},
                       {"n_features": widths.pop(), "n_classes": max(n_classes, 2)})

    def evaluation_split(self, source: dict, data=None, gold=None, data_dir=None):
        if gold is not None:
            raise UserError("--gold: bags have no gold alignments to score (their label is the "
                            "target)")
        if data is not None:
            return self._read(Path(data))
        if data_dir is not None:
            return self._read(Path(data_dir) / "test.npz")
        return self.splits(source)[2]

    def batches(self, split, vocabs: dict, batch_size: int, shuffle: bool = False,
                seed: int = 0, model=None, source: dict | None = None) -> list:
        return make_batches(split.pairs, None, None, batch_size, shuffle=shuffle, seed=seed,
                            array=array_kind(model))


class ImagesData(DataKind):
    """Examples as sequences of real-valued tokens with a class label: scikit-learn's bundled
    8×8 digits as 2×2-patch tokens (``--task digits``; the test split also holds a noisy copy,
    pixel noise of sd ``noise``), or a ``--data-dir`` with ``train.npz`` and ``test.npz`` holding
    ``x [N, n_tokens, token_dim]`` float and ``y [N]`` int labels (no noisy copy)."""

    name = "images"
    dims = ("n_tokens", "token_dim", "n_classes")
    data_dir_help = "folder with train.npz, test.npz: x [N, n_tokens, token_dim] float, y [N] int"
    tasks = ("digits",)
    options = {"noise": (0.3, "sd of the Gaussian pixel noise of the noisy test images", float)}

    def load(self, source: dict) -> Dataset:
        if "data_dir" in source:
            from .digits import read_image_tokens

            d = read_image_tokens(Path(source["data_dir"]))
            return Dataset(self.name, source, (d.train_x, d.train_y), None, d, {},
                           {"n_tokens": d.train_x.shape[1], "token_dim": d.train_x.shape[2],
                            "n_classes": d.n_classes})
        from .digits import load_digits_patches

        d = load_digits_patches(noise=source["noise"], seed=source.get("task_seed", 0))
        return Dataset(self.name, source, (d.train_x, d.train_y), None, d, {},
                       {"n_tokens": d.train_x.shape[1], "token_dim": d.train_x.shape[2],
                        "n_classes": d.n_classes})

    def test_split(self, source: dict):
        return self.load(source).test

    token_data = False

    def batches(self, split, vocabs: dict, batch_size: int, shuffle: bool = False,
                seed: int = 0, model=None, source: dict | None = None) -> list:
        from .digits import image_batches

        x, y = split if isinstance(split, tuple) else (split.test_x, split.test_y)
        return image_batches(x, y, batch_size, shuffle, seed)


class GraphData(DataKind):
    """Node classification on one graph: a contextual stochastic block model (``--task sbm``)
    or Zachary's karate club (``--task karate``); full-batch."""

    name = "graph"
    dims = ("in_dim", "n_classes")
    tasks = ("sbm", "karate")
    options = {"noise": (1.0, "sd of the Gaussian feature noise of the noisy test graph", float)}

    def load(self, source: dict) -> Dataset:
        if "data_dir" in source:
            raise UserError("graph data comes from --task sbm or karate (no --data-dir reader)")
        from .graphs import contextual_sbm, karate_club

        seed = source.get("task_seed", 0)
        g = contextual_sbm(seed=seed) if source["task"] == "sbm" else karate_club(seed=seed)
        return Dataset(self.name, source, g, None, (g, g.noisy(source["noise"], seed)), {},
                       {"in_dim": g.features.shape[1], "n_classes": g.n_classes})

    def test_split(self, source: dict):
        return self.load(source).test

    token_data = False

    def batches(self, split, vocabs: dict, batch_size: int, shuffle: bool = False,
                seed: int = 0, model=None, source: dict | None = None) -> list:
        return [split[0] if isinstance(split, tuple) else split]


DATA_KINDS: dict[str, DataKind] = {k.name: k for k in (PairsData(), SequencesData(),
                                                       BagsData(), ImagesData(), GraphData())}


def data_kind(name: str) -> DataKind:
    try:
        return DATA_KINDS[name]
    except KeyError:
        raise UserError(f"unknown data kind {name!r}; valid: {', '.join(DATA_KINDS)}") from None


TASK_KINDS = {task: kind.name for kind in DATA_KINDS.values() if kind.name != "sequences"
              for task in kind.tasks}
assert set(TASK_KINDS) >= set(TASKS)
