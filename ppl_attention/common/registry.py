"""The registry of models, in the sense of Inference Gym or posteriordb: each entry is a model
with the data it is trained on and the reference it is scored against. ``--model`` takes an
entry's name or a user's model by its location, ``path/to/file.py:ClassName`` or
``package.module:ClassName`` (:func:`load_model_class`). Pure Python below both backends:
looking a model up imports nothing but the model's own module.

=================  ========================  ==========  ==========================================
name               class                     data        reference
=================  ========================  ==========  ==========================================
``seq2seq``        ``Seq2SeqAlignment``      pairs       exact enumeration (the forward algorithm
                                                         for ``hmm-exact``); on built-in tasks the
                                                         generator's exact NLL (the floor)
``seq-vae``        ``AttentionSeqVAE``       sequences   IWAE-100 bound on log p(x)
``bam-classifier`` ``BAMClassifier``         images      accuracy and calibration on held-out and
                                                         noisy digits
``gat``            ``BayesianGAT``           graph       accuracy and calibration on held-out nodes
``bayesian-ibm2``  ``BayesianIBM2``          pairs       NUTS (4 chains); SVI autoguides against
                   (NumPyro)                             it
``bayesian-hmm``   ``BayesianHMMAligner``    pairs       NUTS (4 chains); SVI autoguides against
                   (NumPyro)                             it
``word-ibm1``      ``IBM1WordAligner``       pairs       NUTS (4 chains); Gibbs, VB and SVI
``word-ibm2``      ``IBM2WordAligner``                   autoguides against it (the word
``word-hmm``       ``HMMWordAligner``                    aligners with NULL, on the density
                   (NumPyro)                             ``ppl-attention wordalign`` samples)
=================  ========================  ==========  ==========================================
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .. import compat
from ..core.errors import UserError
from .contract import check_model_class

__all__ = ["ModelEntry", "MODELS", "load_model_class", "model_reference", "model_spec_of"]


@dataclass(frozen=True)
class ModelEntry:
    """A model of the collection: ``target`` ("module:Class"), its data, default task and
    method, and the reference it is scored against."""

    name: str
    target: str
    description: str
    data: str
    reference: str
    default_task: str
    default_method: str
    methods: tuple[str, ...] = field(default_factory=tuple)


MODELS: dict[str, ModelEntry] = {e.name: e for e in [
    ModelEntry("seq2seq", "ppl_attention.pyro.models.seq2seq:Seq2SeqAlignment",
               "Deng et al. (2018)'s latent-alignment encoder–decoder (BiLSTM, input-fed LSTM)",
               "pairs", "exact enumeration; the generator's exact NLL on built-in tasks",
               "reorder", "exact"),
    ModelEntry("seq-vae", "ppl_attention.pyro.models.seq_vae:AttentionSeqVAE",
               "sequence VAE: global z ~ N(0, I) and decoder-side attention",
               "sequences", "IWAE-100 bound on log p(x)", "g2p", "soft"),
    ModelEntry("bam-classifier", "ppl_attention.pyro.models.bam_classifier:BAMClassifier",
               "Transformer-encoder classifier whose every head is a pa.attend site",
               "images", "accuracy, ECE and PAvPU on clean and noisy test digits",
               "digits", "soft"),
    ModelEntry("gat", "ppl_attention.pyro.models.gat:BayesianGAT",
               "graph attention with stochastic neighbour weights",
               "graph", "accuracy, ECE and PAvPU on the unlabelled nodes", "sbm", "soft"),
    ModelEntry("bayesian-ibm2", "ppl_attention.numpyro.models.word_aligners:BayesianIBM2",
               "IBM Model 2 with Dirichlet translation rows and a Gamma distortion tension; "
               "alignments enumerated (NumPyro)", "pairs", "NUTS, 4 chains × 1000 draws; SVI "
               "autoguides against it", "reorder", "nuts"),
    ModelEntry("bayesian-hmm", "ppl_attention.numpyro.models.word_aligners:BayesianHMMAligner",
               "HMM aligner with a Dirichlet jump distribution and translation rows; the "
               "monotonic chain summed out (NumPyro)", "pairs", "NUTS, 4 chains × 1000 draws; "
               "SVI autoguides against it", "copy", "nuts"),
    *[ModelEntry(f"word-{m}", f"ppl_attention.numpyro.models.word_aligners:{cls}",
                 f"{what} with a NULL word, Dirichlet tables (NumPyro; the model "
                 f"`ppl-attention wordalign --model {m}` runs at corpus scale)", "pairs",
                 "NUTS, 4 chains × 1000 draws; Gibbs, VB and SVI autoguides against it",
                 "reorder", "gibbs")
      for m, cls, what in (("ibm1", "IBM1WordAligner", "Bayesian IBM Model 1"),
                           ("ibm2", "IBM2WordAligner", "Bayesian IBM Model 2 (distortion "
                            "buckets)"),
                           ("hmm", "HMMWordAligner", "HMM aligner (jumps in both directions)"))],
]}


def model_reference(name: str) -> ModelEntry:
    try:
        return MODELS[name]
    except KeyError:
        raise UserError(f"unknown model {name!r}; valid: {', '.join(MODELS)}, or your own as "
                        f"path/to/file.py:ClassName or package.module:ClassName") from None


def _module_from_file(path: Path, where: str):
    """Import a Python file under a name of its own (stable for the file's full path, so two
    loads of the same file give the same classes)."""
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    name = f"ppl_attention_user_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        line = getattr(e, "lineno", None)
        raise UserError(f"{where}: importing {path} failed: {type(e).__name__}: {e}"
                        + (f" (line {line})" if line and f"line {line}" not in str(e) else "")) \
            from e
    return module


def load_model_class(spec: str, check: bool = True, source: bytes | None = None):
    """The model class named by ``spec``: a registry name, ``path/to/file.py:ClassName`` or
    ``package.module:ClassName``; checked against the contract. ``source``: the file's bytes
    when they were shipped (a Ray job on another node), read instead of the path."""
    where = f"--model {spec}"
    if not isinstance(spec, str) or not spec:
        raise UserError(f"--model: expected a name or path/to/file.py:ClassName, got {spec!r}")
    if spec in MODELS:
        entry = MODELS[spec]
        module_name, _, cls_name = entry.target.partition(":")
        return getattr(importlib.import_module(module_name), cls_name)
    location, colon, cls_name = spec.rpartition(":")
    if not colon or not location or not cls_name:
        raise UserError(f"{where}: not a model name ({', '.join(MODELS)}) nor "
                        f"path/to/file.py:ClassName or package.module:ClassName")
    if location.endswith(".py") or "/" in location or "\\" in location:
        path = Path(location).expanduser().resolve()
        if source is not None:
            import tempfile

            tmp = Path(tempfile.mkdtemp(prefix="ppl-attention-model-")) / path.name
            tmp.write_bytes(source)
            module = _module_from_file(tmp, where)
        elif not path.is_file():
            raise UserError(f"{where}: no such file {location}")
        else:
            module = _module_from_file(path, where)
    else:
        try:
            # a run written before the move may name an old path: read it at the new one
            module = importlib.import_module(compat.new_path(location))
        except ImportError as e:
            raise UserError(f"{where}: cannot import module {location!r} ({e})") from None
    cls = getattr(module, cls_name, None)
    if cls is None:
        classes = sorted(n for n, v in vars(module).items()
                         if isinstance(v, type) and v.__module__ == module.__name__)
        raise UserError(f"{where}: {location} has no class {cls_name!r}"
                        + (f" (classes there: {', '.join(classes)})" if classes else ""))
    if check:
        check_model_class(cls, where)
    return cls


def model_spec_of(cls) -> str:
    """How a run directory records a model class: its registry name, or module:Class, or the
    file path of a class loaded from a file."""
    for name, entry in MODELS.items():
        module_name, _, cls_name = entry.target.partition(":")
        if cls.__module__ == module_name and cls.__qualname__ == cls_name:
            return name
    module = sys.modules.get(cls.__module__)
    file = getattr(module, "__file__", None)
    if cls.__module__.startswith("ppl_attention_user_") and file:
        return f"{file}:{cls.__qualname__}"
    if cls.__module__ == "__main__" and file:
        return f"{Path(file).resolve()}:{cls.__qualname__}"
    return f"{cls.__module__}:{cls.__qualname__}"
