"""Trained word-aligner tables as plain data — ``wordalign --save DIR`` / ``--load DIR`` — and
eflomal's priors file (``eflomal-makepriors`` format, ``--priors``), NumPy only.

A direction's tables are the posterior's sufficient statistics: the expected link count of
every (source word, target word) pair the corpus saw (``counts`` over the cells ``cell_src``,
``cell_tgt``; the NULL source is the id ``len(src_words)``), each source row's total over all
its links (``row_totals``, so a row keeps its mass when a cell is dropped), and the bucket counts
(jumps −D … D, then NULL; none for IBM1). Aligning new text with them puts them in the prior as
pseudo-counts: θ_e ~ Dirichlet(α + n_e), δ ~ Dirichlet(γ + n_δ) — the posterior of the training
text is the prior of the new one, and a word never seen keeps α.

A saved directory holds ``tables.npz`` (NumPy arrays only; read with ``allow_pickle=False``: a
pickle is refused, never loaded), ``meta.json`` (the model and its options) and
``eflomal.priors`` (the same counts in eflomal's format, for a user moving to eflomal).

eflomal's priors file, one tab-separated line each: ``LEX src trg α`` (lexical pseudo-counts,
``<NULL>`` for the empty word), ``HMMF jump α`` / ``HMMR jump α`` (the forward / reverse jump
pseudo-counts, a jump i − i' from the last linked position, −1 before the first), ``FERF src
fert α`` / ``FERR trg fert α`` (fertility pseudo-counts — read and counted, but no model here
has fertilities: the reader reports them unused).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core import jsonio
from ..core.arrays import read_plain_npz
from ..core.errors import DataError, UserError

__all__ = ["DirectionTables", "SavedTables", "NULL_WORD", "FORMAT", "save_tables",
           "load_tables", "read_eflomal_priors", "eflomal_priors_text", "prior_for_corpus",
           "tables_from_corpus", "merge_tables", "ALIGNERS", "ALIGNER_KINDS", "AlignerKind",
           "n_buckets", "DEFAULT_ALIGNERS", "default_aligner", "NULL_PRIOR",
           "ALIGNER_DEFAULTS", "default_null_prior"]

FORMAT = "ppl-attention wordalign tables"
VERSION = 1
NULL_WORD = "<NULL>"
#: cells with a smaller expected count are not saved (their mass stays in the row totals)
MIN_COUNT = 1e-3
FIELDS = ("cell_src", "cell_tgt", "counts", "row_totals", "buckets", "fertility")
#: the most links a source position takes in the fertility aligner (fertilities 0 … F)
MAX_FERTILITY = 8
@dataclass(frozen=True)
class AlignerKind:
    """What an aligner (:mod:`ppl_attention.numpyro.aligners`) is and can do, declared once:
    ``buckets`` "none" (IBM1), "displacement" (IBM2: from the diagonal) or "jump" (HMM,
    fertility: from the last linked position); ``fertility``: a fertility table per source
    word; ``rao_blackwellized``: Gibbs's link marginals average conditionals — IBM1/2: the exact
    posterior given the tables; fertility: each target word's single-site conditional given the
    rest — rather than count drawn links (HMM: its blocked draw has no per-word conditional);
    ``methods``: the ``wordalign`` methods that run it."""

    name: str
    buckets: str
    fertility: bool
    rao_blackwellized: bool
    methods: tuple


ALIGNER_KINDS = {k.name: k for k in [
    AlignerKind("ibm1", "none", False, True, ("gibbs", "vb", "svb")),
    AlignerKind("ibm2", "displacement", False, True, ("gibbs", "vb", "svb")),
    AlignerKind("hmm", "jump", False, False, ("gibbs", "vb", "svb")),
    AlignerKind("fertility", "jump", True, True, ("gibbs", "vb")),
]}
#: the aligners' names
ALIGNERS = tuple(ALIGNER_KINDS)
#: the aligner ``wordalign`` runs when none is named: the first of these that its method runs
#: (the fertility aligner, as eflomal's default is its model 3; the HMM for svb)
DEFAULT_ALIGNERS = ("fertility", "hmm")


def default_aligner(method: str) -> str:
    """The first of :data:`DEFAULT_ALIGNERS` whose kind declares ``method``."""
    for name in DEFAULT_ALIGNERS:
        if method in ALIGNER_KINDS[name].methods:
            return name
    raise UserError(f"no aligner runs by {method!r}")


#: NULL's fixed weight ν by default (eflomal's ``null_prior``) for an aligner with a NULL bucket:
#: on the generated corpora it brings the forward direction's precision to eflomal's, where a
#: learned NULL bucket (ν = 0) links too many words (docs/results.md)
NULL_PRIOR = 0.2
#: the aligners' options and their defaults, read by :class:`~ppl_attention.numpyro.aligners.
#: AlignerSpec`, by ``wordalign`` and by the saved tables' record (``null_prior``: see
#: :func:`default_null_prior`)
ALIGNER_DEFAULTS = {"alpha": 0.01, "gamma": 1.0, "max_jump": 8}


def default_null_prior(model: str) -> float:
    """ν when none is given: :data:`NULL_PRIOR` for an aligner with a NULL bucket, 0 for IBM1
    (its NULL is one more source position, nothing to fix)."""
    return 0.0 if ALIGNER_KINDS[model].buckets == "none" else NULL_PRIOR


def n_buckets(model: str, max_jump: int) -> int:
    """The jump / displacement buckets of an aligner: −D … D and NULL; none for IBM1."""
    return 0 if ALIGNER_KINDS[model].buckets == "none" else 2 * max_jump + 2


@dataclass
class DirectionTables:
    """One direction's tables (module docstring): ``src_words``, ``tgt_words`` (lists of
    str), ``cell_src [C]`` (int, NULL = ``len(src_words)``), ``cell_tgt [C]``, ``counts [C]``,
    ``row_totals [len(src_words) + 1]``, ``buckets [K]``, ``fertility [len(src_words) + 1,
    F + 1]`` (each source word's positions counted by fertility; NULL's row 0; no columns for
    a model without fertilities)."""

    src_words: list
    tgt_words: list
    cell_src: np.ndarray
    cell_tgt: np.ndarray
    counts: np.ndarray
    row_totals: np.ndarray
    buckets: np.ndarray
    fertility: np.ndarray | None = None

    def __post_init__(self):
        if self.fertility is None:
            self.fertility = np.zeros((len(self.src_words) + 1, 0), np.float32)

    def check(self, where: str, n_buckets: int | None = None,
              n_fertility: int | None = None) -> None:
        """Refuse tables that are no tables, naming ``where`` and the field."""
        n_src, n_tgt = len(self.src_words), len(self.tgt_words)
        C = len(self.counts)
        for name, a, kind in (("cell_src", self.cell_src, "i"), ("cell_tgt", self.cell_tgt, "i"),
                              ("counts", self.counts, "f"), ("row_totals", self.row_totals, "f"),
                              ("buckets", self.buckets, "f")):
            if a.ndim != 1 or a.dtype.kind != kind:
                what = "integer" if kind == "i" else "float"
                raise DataError(f"{where}: {name} must be a 1-d {what} array, got {a.dtype} "
                                f"of shape {a.shape}")
        if len(self.cell_src) != C or len(self.cell_tgt) != C:
            raise DataError(f"{where}: cell_src, cell_tgt and counts differ in length "
                            f"({len(self.cell_src)}, {len(self.cell_tgt)}, {C})")
        if C and (self.cell_src.min() < 0 or self.cell_src.max() > n_src):
            raise DataError(f"{where}: cell_src outside [0, {n_src}] (the source words and NULL)")
        if C and (self.cell_tgt.min() < 0 or self.cell_tgt.max() >= n_tgt):
            raise DataError(f"{where}: cell_tgt outside [0, {n_tgt})")
        if len(self.row_totals) != n_src + 1:
            raise DataError(f"{where}: row_totals has {len(self.row_totals)} rows, the source "
                            f"vocabulary {n_src} words and NULL")
        if n_buckets is not None and len(self.buckets) != n_buckets:
            raise DataError(f"{where}: {len(self.buckets)} jump buckets, the model has "
                            f"{n_buckets}")
        f = self.fertility
        if f.ndim != 2 or f.dtype.kind != "f" or f.shape[0] != n_src + 1 or \
                (n_fertility is not None and f.shape[1] != n_fertility):
            raise DataError(f"{where}: fertility must be a float array [{n_src + 1}, "
                            f"{'F + 1' if n_fertility is None else n_fertility}] (the source "
                            f"words and NULL by fertility), got {f.dtype} of shape {f.shape}")
        for name in ("counts", "row_totals", "buckets", "fertility"):
            a = getattr(self, name)
            if not np.isfinite(a).all() or (a < 0).any():
                raise DataError(f"{where}: {name} holds a negative or non-finite count")
        if C:
            keys = self.cell_src.astype(np.int64) * max(n_tgt, 1) + self.cell_tgt
            if len(np.unique(keys)) != C:
                raise DataError(f"{where}: a (source, target) cell given twice")
            below = np.bincount(self.cell_src, weights=self.counts, minlength=n_src + 1)
            if (below > self.row_totals * (1 + 1e-4) + 1e-3).any():
                e = int(np.flatnonzero(below > self.row_totals * (1 + 1e-4) + 1e-3)[0])
                raise DataError(f"{where}: row {e}'s cells count {below[e]:g}, more than its "
                                f"total {self.row_totals[e]:g}")
        if len(set(self.src_words)) != n_src or len(set(self.tgt_words)) != n_tgt:
            raise DataError(f"{where}: a word listed twice in a vocabulary")


@dataclass
class SavedTables:
    """A ``--save`` directory: ``meta`` (format, model, alpha, gamma, max_jump, method,
    n_pairs) and per direction ("forward", "reverse") its :class:`DirectionTables`."""

    meta: dict
    directions: dict


def tables_from_corpus(corpus, src_words, tgt_words, cell_counts, bucket_counts,
                       fertility_counts=None) -> DirectionTables:
    """A direction's tables from a run on an indexed corpus
    (:class:`~ppl_attention.data.indexed.IndexedCorpus` and its vocabularies): the cells with
    expected count ≥ ``MIN_COUNT``; NULL's row moved to ``len(src_words)`` (``fertility_counts
    [n_src, F + 1]``, NULL's row last already)."""
    counts = np.asarray(cell_counts, np.float64)
    cs = np.asarray(corpus.cell_src, np.int64)
    rows = np.bincount(cs, weights=counts, minlength=corpus.n_src)
    keep = counts >= MIN_COUNT
    null = len(src_words)
    if corpus.null != null:
        raise UserError(f"tables_from_corpus: the corpus's NULL id {corpus.null} is not "
                        f"{null}, the source vocabulary's size")
    return DirectionTables(list(src_words), list(tgt_words), cs[keep].astype(np.int32),
                           np.asarray(corpus.cell_tgt)[keep].astype(np.int32),
                           counts[keep].astype(np.float32), rows.astype(np.float32),
                           np.asarray(bucket_counts, np.float32).reshape(-1),
                           None if fertility_counts is None else
                           np.asarray(fertility_counts, np.float32))


def prior_for_corpus(tables: DirectionTables, corpus):
    """The pseudo-counts of ``tables`` over ``corpus``'s cells, as ``(cells [C], rows [n_src],
    buckets [K], fertility [n_src, F + 1])`` NumPy arrays — ``corpus`` indexed with the
    tables' vocabularies first (:func:`~ppl_attention.data.indexed.index_pairs` with
    ``src_vocab``, ``tgt_vocab``), so a trained word keeps its id and a new one comes after;
    NULL is re-numbered."""
    import pandas as pd

    n_train = len(tables.src_words)
    if corpus.n_src < n_train + 1 or corpus.n_tgt < len(tables.tgt_words):
        raise UserError("prior_for_corpus: the corpus was not indexed with the tables' "
                        "vocabularies")
    src = tables.cell_src.astype(np.int64)
    src = np.where(src == n_train, corpus.null, src)
    width = max(corpus.n_tgt, 1)
    where = pd.Index(src * width + tables.cell_tgt).get_indexer(
        np.asarray(corpus.cell_src, np.int64) * width + np.asarray(corpus.cell_tgt))
    padded = np.append(np.asarray(tables.counts, np.float32), np.float32(0))  # [-1]: no cell
    cells = padded[where].astype(np.float32)
    rows = np.zeros(corpus.n_src, np.float32)
    rows[:n_train] = tables.row_totals[:n_train]
    rows[corpus.null] = tables.row_totals[n_train]
    fert = np.zeros((corpus.n_src, tables.fertility.shape[1]), np.float32)
    fert[:n_train] = tables.fertility[:n_train]
    return cells, rows, np.asarray(tables.buckets, np.float32), fert


def merge_tables(prior: DirectionTables, new: DirectionTables) -> DirectionTables:
    """The posterior's tables after a run whose prior held ``prior``'s pseudo-counts: the two
    summed cell by cell — ``new`` indexed with ``prior``'s vocabularies first (its
    vocabularies extend them), NULL re-numbered."""
    import pandas as pd

    n_old, n_new = len(prior.src_words), len(new.src_words)
    if new.src_words[:n_old] != list(prior.src_words) or \
            new.tgt_words[:len(prior.tgt_words)] != list(prior.tgt_words):
        raise UserError("merge_tables: the new tables do not extend the prior's vocabularies")
    old_src = np.where(prior.cell_src == n_old, n_new, prior.cell_src).astype(np.int64)
    width = max(len(new.tgt_words), 1)
    keys = np.concatenate([old_src * width + prior.cell_tgt,
                           new.cell_src.astype(np.int64) * width + new.cell_tgt])
    summed = pd.Series(np.concatenate([prior.counts, new.counts]).astype(np.float64)).groupby(
        keys).sum()
    k = summed.index.to_numpy(np.int64)
    rows = new.row_totals.astype(np.float64).copy()
    rows[:n_old] += prior.row_totals[:n_old]
    rows[n_new] += prior.row_totals[n_old]
    if prior.fertility.shape[1] != new.fertility.shape[1]:
        raise UserError("merge_tables: the two tables' fertility columns differ")
    fert = new.fertility.astype(np.float64).copy()
    fert[:n_old] += prior.fertility[:n_old]
    return DirectionTables(list(new.src_words), list(new.tgt_words),
                           (k // width).astype(np.int32), (k % width).astype(np.int32),
                           summed.to_numpy(np.float32), rows.astype(np.float32),
                           (np.asarray(prior.buckets) + np.asarray(new.buckets)).astype(
                               np.float32), fert.astype(np.float32))


# --- the directory ------------------------------------------------------------------------------

def _pack_words(words) -> tuple[np.ndarray, np.ndarray]:
    data = [w.encode("utf-8") for w in words]
    offsets = np.zeros(len(data) + 1, np.int64)
    offsets[1:] = np.cumsum([len(b) for b in data])
    return np.frombuffer(b"".join(data), np.uint8).copy(), offsets


def _unpack_words(data: np.ndarray, offsets: np.ndarray, where: str) -> list:
    if data.dtype != np.uint8 or offsets.dtype.kind != "i" or offsets.ndim != 1 or \
            len(offsets) < 1 or offsets[0] != 0 or (np.diff(offsets) < 0).any() or \
            offsets[-1] != len(data):
        raise DataError(f"{where}: the vocabulary's bytes and offsets do not agree")
    raw = data.tobytes()
    try:
        return [raw[a:b].decode("utf-8") for a, b in zip(offsets[:-1], offsets[1:])]
    except UnicodeDecodeError as e:
        raise DataError(f"{where}: a vocabulary word is not UTF-8 ({e.reason})") from None


def save_tables(path, saved: SavedTables) -> None:
    """Write the directory of the module docstring, whole or not at all."""
    from .corpus import atomic_write_text, write_directory_atomically

    arrays = {}
    for name, t in saved.directions.items():
        for side, words in (("src", t.src_words), ("tgt", t.tgt_words)):
            arrays[f"{name}_{side}_words"], arrays[f"{name}_{side}_offsets"] = _pack_words(words)
        for f in FIELDS:
            arrays[f"{name}_{f}"] = np.asarray(getattr(t, f))
    meta = {"format": FORMAT, "version": VERSION, **saved.meta,
            "directions": list(saved.directions)}

    def fill(tmp: Path) -> None:
        np.savez(tmp / "tables.npz", **arrays)
        atomic_write_text(tmp / "meta.json", jsonio.dumps(meta, indent=1) + "\n")
        atomic_write_text(tmp / "eflomal.priors", eflomal_priors_text(
            saved.directions.get("forward"), saved.directions.get("reverse"),
            saved.meta["model"], int(saved.meta["max_jump"])))

    write_directory_atomically(path, fill)


META_KEYS = {"model": str, "alpha": float, "gamma": float, "max_jump": int,
             "null_prior": float}
#: what tables written before a key existed were trained with (NULL's weight was learned)
META_LEGACY = {"null_prior": 0.0}


def load_tables(path) -> SavedTables:
    """Read and check a ``--save`` directory; anything else — not a folder, a file missing,
    ``tables.npz`` not a NumPy archive (a pickle included), a field missing or inconsistent,
    ``meta.json`` of another format — is refused naming the file and the field (a pickle:
    :class:`~ppl_attention.core.errors.UnsafeCheckpoint`, never unpickled)."""
    path = Path(path)
    if not path.is_dir():
        raise DataError(f"--load {path}: not a folder written by wordalign --save")
    meta_file, npz = path / "meta.json", path / "tables.npz"
    for f in (meta_file, npz):
        if not f.is_file():
            raise DataError(f"--load {path}: {f.name} missing (not a wordalign --save folder)")
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{meta_file}: not JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise DataError(f"{meta_file}: not the meta of wordalign tables (format "
                        f"{meta.get('format') if isinstance(meta, dict) else None!r})")
    if meta.get("version") != VERSION:
        raise DataError(f"{meta_file}: tables of version {meta.get('version')!r}, this "
                        f"version reads {VERSION}")
    for k, v in META_LEGACY.items():
        meta.setdefault(k, v)
    for k, kind in META_KEYS.items():
        v = meta.get(k)
        if not isinstance(v, (int, float) if kind is float else kind) or isinstance(v, bool):
            raise DataError(f"{meta_file}: field {k!r} must be a {kind.__name__}, got {v!r}")
        low = 0 if k == "null_prior" else None  # 0: NULL's weight learned
        if kind is float and not (math.isfinite(v) and (v >= low if low is not None else v > 0)):
            raise DataError(f"{meta_file}: field {k!r} must be "
                            f"{'≥ 0' if low is not None else '> 0'}, got {v!r}")
    directions = meta.get("directions")
    if not isinstance(directions, list) or not directions or \
            not set(directions) <= {"forward", "reverse"}:
        raise DataError(f"{meta_file}: field 'directions' must list forward and/or reverse, "
                        f"got {directions!r}")
    arrays = read_plain_npz(npz, "wordalign tables file")
    if meta["model"] not in ALIGNERS:
        raise DataError(f"{meta_file}: field 'model' must be one of {', '.join(ALIGNERS)}, got "
                        f"{meta['model']!r}")
    out = {}
    for name in directions:
        need = [f"{name}_{s}_{p}" for s in ("src", "tgt") for p in ("words", "offsets")] + \
            [f"{name}_{f}" for f in FIELDS]
        kind = ALIGNER_KINDS[meta["model"]]
        if f"{name}_fertility" not in arrays and not kind.fertility:
            need.remove(f"{name}_fertility")  # tables of a version that had no fertility
        missing = [k for k in need if k not in arrays]
        if missing:
            raise DataError(f"{npz}: field {missing[0]} missing")
        t = DirectionTables(
            _unpack_words(arrays[f"{name}_src_words"], arrays[f"{name}_src_offsets"],
                          f"{npz} ({name} source words)"),
            _unpack_words(arrays[f"{name}_tgt_words"], arrays[f"{name}_tgt_offsets"],
                          f"{npz} ({name} target words)"),
            *(arrays.get(f"{name}_{f}") for f in FIELDS))
        t.check(f"{npz} ({name})", n_buckets(meta["model"], meta["max_jump"]),
                MAX_FERTILITY + 1 if kind.fertility else 0)
        out[name] = t
    return SavedTables(meta, out)


# --- eflomal's priors file ------------------------------------------------------------------------

def _fmt(x: float) -> str:
    return f"{float(x):g}"


def eflomal_priors_text(forward: DirectionTables | None, reverse: DirectionTables | None,
                        model: str, max_jump: int) -> str:
    """eflomal's priors of these tables: ``LEX`` from the forward counts (NULL as
    ``<NULL>``); ``FERF`` / ``FERR`` from the fertility rows, fertilities ≥ 1 as eflomal counts
    them; for the HMM, ``HMMF`` / ``HMMR`` from the forward / reverse jump buckets
    −D … D (the NULL bucket has no line: eflomal's NULL prior is an option of its own; IBM2's
    buckets are displacements from the diagonal, not jumps, and have none)."""
    lines = []
    if forward is not None:
        src = list(forward.src_words) + [NULL_WORD]
        for e, f, c in zip(forward.cell_src, forward.cell_tgt, forward.counts):
            lines.append(f"LEX\t{src[e]}\t{forward.tgt_words[f]}\t{_fmt(c)}")
    for tag, t in (("FERF", forward), ("FERR", reverse)):
        if t is not None and t.fertility.shape[1]:
            for e, row in enumerate(t.fertility[:-1]):
                for n, c in enumerate(row[1:], 1):  # eflomal counts linked words only
                    if c > 0:
                        lines.append(f"{tag}\t{t.src_words[e]}\t{n}\t{_fmt(c)}")
    for tag, t in (("HMMF", forward), ("HMMR", reverse)):
        if ALIGNER_KINDS[model].buckets == "jump" and t is not None:
            for k, c in enumerate(t.buckets[:2 * max_jump + 1]):
                if c > 0:
                    lines.append(f"{tag}\t{k - max_jump}\t{_fmt(c)}")
    return "".join(line + "\n" for line in lines)


def _number(text: str, where: str, what: str, kind=float):
    try:
        v = kind(text)
    except ValueError:
        noun = "an integer" if kind is int else "a number"
        raise DataError(f"{where}: {what} {text!r} is not {noun}") from None
    if kind is float and not (math.isfinite(v) and v >= 0):
        raise DataError(f"{where}: {what} {text!r} must be a finite number ≥ 0")
    return v


def read_eflomal_priors(path, model: str, max_jump: int) -> tuple[dict, dict]:
    """(per direction its :class:`DirectionTables` of pseudo-counts, the lines not used) of an
    eflomal priors file: ``LEX`` counts into the forward cells and, transposed, the reverse;
    ``HMMF`` / ``HMMR`` jumps clipped to [−D, D] into the HMM's forward / reverse buckets
    (eflomal-makepriors also counts each sentence's jump to its end, which this HMM has not:
    it lands in the buckets like the others)
    (IBM1 has none and IBM2's are displacements: counted unused); ``FERF`` / ``FERR``
    fertilities (clipped to F) into the fertility aligner's forward / reverse source words'
    rows (other models: counted unused). A malformed line is a :class:`DataError` naming the
    file and line, before any work."""
    from .corpus import read_utf8

    path = Path(path)
    if not path.is_file():
        raise DataError(f"--priors {path}: no such file")
    K = n_buckets(model, max_jump)
    lex: dict = {}
    jumps = {"HMMF": np.zeros(K), "HMMR": np.zeros(K)}
    unused = {"FERF": 0, "FERR": 0, "HMMF": 0, "HMMR": 0}
    fert: dict = {"FERF": {}, "FERR": {}}
    arity = {"LEX": 4, "HMMF": 3, "HMMR": 3, "FERF": 4, "FERR": 4}
    for n, line in enumerate(read_utf8(path).splitlines(), 1):
        where = f"{path}:{n}"
        if not line.strip():
            continue
        fields = line.split("\t")
        if fields[0] not in arity:
            raise DataError(f"{where}: unknown line type {fields[0]!r} (LEX, HMMF, HMMR, FERF, "
                            f"FERR)")
        if len(fields) != arity[fields[0]]:
            raise DataError(f"{where}: a {fields[0]} line has {arity[fields[0]]} tab-separated "
                            f"fields, found {len(fields)}")
        alpha = _number(fields[-1], where, "the count")
        if fields[0] == "LEX":
            e, f = fields[1], fields[2]
            if not e or not f or e == f == NULL_WORD:
                raise DataError(f"{where}: a LEX line needs a source and a target word (one "
                                f"of them may be {NULL_WORD})")
            lex[(e, f)] = lex.get((e, f), 0.0) + alpha
        elif fields[0] in jumps:
            jump = _number(fields[1], where, "the jump", int)
            if ALIGNER_KINDS[model].buckets == "jump":
                jumps[fields[0]][min(max(jump, -max_jump), max_jump) + max_jump] += alpha
            else:
                unused[fields[0]] += 1
        else:
            n_links = _number(fields[2], where, "the fertility", int)
            if n_links < 0:
                raise DataError(f"{where}: the fertility {fields[2]!r} must be ≥ 0")
            if ALIGNER_KINDS[model].fertility:
                key = (fields[1], min(n_links, MAX_FERTILITY))
                fert[fields[0]][key] = fert[fields[0]].get(key, 0.0) + alpha
            else:
                unused[fields[0]] += 1
    out = {}
    for name, tag, flip, ftag in (("forward", "HMMF", False, "FERF"),
                                  ("reverse", "HMMR", True, "FERR")):
        pairs = {}
        for (e, f), c in lex.items():
            e, f = (f, e) if flip else (e, f)
            if f == NULL_WORD:  # a word aligned to nothing, this direction's target side NULL
                continue
            pairs[(e, f)] = pairs.get((e, f), 0.0) + c
        src = sorted(({e for e, _ in pairs} | {w for w, _ in fert[ftag]}) - {NULL_WORD})
        tgt = sorted({f for _, f in pairs})
        sid = {w: i for i, w in enumerate(src)}
        sid[NULL_WORD] = len(src)
        tid = {w: i for i, w in enumerate(tgt)}
        cs = np.array([sid[e] for e, _ in pairs], np.int32)
        ct = np.array([tid[f] for _, f in pairs], np.int32)
        counts = np.array(list(pairs.values()), np.float32)
        rows = np.bincount(cs, weights=counts, minlength=len(src) + 1).astype(np.float32)
        table = None
        if ALIGNER_KINDS[model].fertility:
            table = np.zeros((len(src) + 1, MAX_FERTILITY + 1), np.float32)
            for (w, k), c in fert[ftag].items():
                if w != NULL_WORD:
                    table[sid[w], k] += c
        out[name] = DirectionTables(src, tgt, cs, ct, counts, rows,
                                    jumps[tag].astype(np.float32), table)
    return out, {k: v for k, v in unused.items() if v}
