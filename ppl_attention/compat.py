"""The one place old import paths live on.

Version 0.1's modules sat flat under ``ppl_attention`` (``ppl_attention.models``,
``ppl_attention.inference``, ``ppl_attention.contract``, …). They now live in one folder per floor
(see docs/architecture.md). Importing an old path still works — it gives the module now at the
new path, the same object, so classes compare equal and ``isinstance`` holds — and warns once
with a :class:`FutureWarning` naming the new path. Nothing inside the package, its tests or its
benchmarks imports an old path.

``OLD_PATHS`` maps each old module (relative to ``ppl_attention``) to the new one; a submodule of
an old package follows its package (``ppl_attention.models.seq2seq`` →
``ppl_attention.pyro.models.seq2seq``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

OLD_PATHS = {
    "errors": "core.errors",
    "core.families": "core.family_specs",
    "core.methods": "core.method_specs",
    "core.global_methods": "core.method_specs",
    "core.trees": "core.heads",
    "core.seq_vae": "common.seq_vae_options",
    "core.seq_vae_options": "common.seq_vae_options",
    "core.chain_paths": "structures.chain_paths",
    "contract": "common.contract",
    "registry": "common.registry",
    "runs": "common.runs",
    "evaluation": "common.evaluation",
    "decoding": "common.decoding",
    "importance": "common.importance_weights",
    "metrics": "common.metrics",
    "plots": "common.plots",
    "arviz_api": "common.arviz_api",
    "backends": "common.backends",
    "devices": "common.devices",
    "symmetrize": "common.symmetrize",
    "attention": "pyro.attend",
    "families": "pyro.families",
    "distributions": "pyro.distributions",
    "kl": "pyro.kl",
    "scores": "pyro.scores",
    "structured": "pyro.structured",
    "trees": "pyro.trees",
    "models": "pyro.models",
    "models.registry": "common.registry",
    "inference": "pyro.inference",
    "inference.run": "common.runs",
    "inference.experiment": "tools.experiment",
    "inference.plots": "common.plots",
    "experiment": "tools.experiment",
    "sweep": "tools.sweep",
    "parity": "tools.parity",
    "analysis.calibration": "analysis.sbc",
    "cli.evaluate": "cli.evaluate_align",
    "cli.sweep": "cli.compare",
    "data.wordalign": "data.wordalign_task",
    "numpyro.batching": "numpyro.jax_batches",
    "numpyro.models.ibm2": "numpyro.models.word_aligners",
    "numpyro.models.hmm_aligner": "numpyro.models.word_aligners",
}

_ROOT = __name__.rpartition(".")[0]


def new_path(module: str) -> str:
    """The module's path now: ``ppl_attention.models.seq2seq`` → ``ppl_attention.pyro.models.
    seq2seq``; a path that did not move comes back unchanged."""
    if not module.startswith(_ROOT + "."):
        return module
    rest = module[len(_ROOT) + 1:]
    best = max((old for old in OLD_PATHS if rest == old or rest.startswith(old + ".")),
               key=len, default=None)
    if best is None:
        return module
    return f"{_ROOT}.{OLD_PATHS[best]}{rest[len(best):]}"


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec):
        module = importlib.import_module(self.new)
        self.own_spec = module.__spec__
        warnings.warn(f"{spec.name} has moved to {self.new}; import it from there "
                      "(the old path will go in a later version)", FutureWarning, stacklevel=2)
        return module

    def exec_module(self, module):
        # the import system has stamped the old path's spec on the module: give it its own back
        module.__spec__ = self.own_spec


class _OldPathFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(_ROOT + "."):
            return None
        new = new_path(fullname)
        if new == fullname:
            return None
        real = importlib.util.find_spec(new)
        if real is None:
            return None
        spec = importlib.util.spec_from_loader(fullname, _Alias(new),
                                               is_package=real.submodule_search_locations
                                               is not None)
        return spec


def install() -> None:
    """Put the old-path finder on ``sys.meta_path`` (once; ``import ppl_attention`` does it)."""
    if not any(isinstance(f, _OldPathFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _OldPathFinder())
