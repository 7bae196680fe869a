"""A run: a trained model with its vocabularies, method and history; saved as a run directory
(``config.json``, ``checkpoint.pt``, ``metrics.json``, ``learning_curve.png``) that is written
under a temporary name and renamed when complete, so an interrupted run never looks finished.

A run directory is data, never code: ``checkpoint.pt`` holds tensors, numbers, strings, lists
and dicts only and is read with ``torch.load(weights_only=True)`` — a checkpoint carrying any
other pickled object is refused without running it. A NumPyro model's run keeps its param map
in ``params.npz`` (the last and the best weights) and its step and numbers in ``state.json``
instead; a run trained under NumPyro keeps its optimizer state in ``optimizer.npz`` (plain
arrays, read with ``allow_pickle=False``). ``config.json``'s ``backend`` says which backend
trained the run. ``config.json`` names the model's class
(``"model_class"``: a registry name, ``package.module:Class`` or the file a user's class was
loaded from); loading imports that class as ``--model`` would, never a file inside the run
directory.

A run whose training diverged (:mod:`ppl_attention.core.divergence`) is written with its last
finite weights and marked ``DIVERGED`` instead of ``COMPLETE``: the marker holds the step, the
method, what was not finite (or impossible) and its value, as JSON. Every tool refuses such a
run with that reason (:func:`check_not_diverged`); every JSON file is strict JSON.

Below both backends: a NumPyro model's run is read and written without torch, which only a
Pyro model's checkpoint loads.
"""

from __future__ import annotations

import json
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path

from ..core import jsonio
from ..core.arrays import load_arrays, save_arrays
from ..core.divergence import Diverged
from ..core.errors import UnsafeCheckpoint, UserError
from ..data.corpus import write_directory_atomically
from ..data.vocab import Vocab
from .backends import get_backend
from .contract import model_backend
from .registry import load_model_class, model_spec_of

__all__ = ["Run", "COMPLETE", "PARTIAL", "DIVERGED", "run_extra", "read_config",
           "load_checkpoint", "divergence_of", "check_not_diverged", "DivergedRun"]

COMPLETE = "COMPLETE"
PARTIAL = "PARTIAL"  # a periodic checkpoint of a run still training: resumable, not evaluable
DIVERGED = "DIVERGED"  # training stopped on a non-finite or impossible number: refused by tools


class DivergedRun(UserError):
    """A tool was handed a run directory whose training diverged."""


def divergence_of(path) -> dict | None:
    """The ``DIVERGED`` record of a run directory, or None when it did not diverge."""
    marker = Path(path) / DIVERGED
    if not marker.exists():
        return None
    try:
        return json.loads(marker.read_text() or "{}")
    except ValueError:
        return {"message": f"{marker}: unreadable"}


def check_not_diverged(path) -> None:
    """Refuse a diverged run directory, naming its step, method and value."""
    rec = divergence_of(path)
    if rec is not None:
        what = rec.get("message") or Diverged.from_record(rec).message()
        raise DivergedRun(f"{path}: {what}; retrain it (a diverged run is not evaluated, "
                          f"aligned or analysed)")


@dataclass
class Run:
    model: object  # a torch.nn.Module (Pyro) or a NumPyro model
    method: str
    src_vocab: Vocab | None = None
    tgt_vocab: Vocab | None = None
    config: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)
    step: int = 0
    optimizer_state: dict | None = None
    rng_state: dict | None = None
    extra: dict = field(default_factory=dict)
    model_spec: str | None = None  # how config.json names the model class
    params: dict | None = None  # a NumPyro model's param map {site: value}
    samples: dict | None = None  # posterior draws of global latents {site: [chain, draw, …]}

    @property
    def backend(self) -> str:
        """The backend the run's model is written for (``"pyro"`` for a Pyro model, whichever
        backend trained it; ``"numpyro"`` for a NumPyro model)."""
        return model_backend(self.model)

    def save(self, path: str | os.PathLike, complete: bool = True,
             diverged: Diverged | None = None) -> Path:
        """Write the run directory atomically: a temporary sibling, then one rename. With
        ``complete=False`` (a periodic checkpoint) it is marked PARTIAL: ``train --resume``
        continues it, ``evaluate`` refuses it. With ``diverged`` it is marked DIVERGED (the
        record of the stop, as JSON): every tool refuses it."""
        spec = self.model_spec or model_spec_of(type(self.model))
        if not isinstance(getattr(self.model, "config", None), dict):
            raise UserError(f"{type(self.model).__name__} has no `config` dict (subclass "
                            f"ppl_attention.pyro.models.AlignmentModel, or set self.config to the "
                            f"constructor's options): a run directory rebuilds the model from it")
        config = {"method": self.method, "model_class": spec, "model": self.model.config,
                  "train": self.config,
                  "src_vocab": self.src_vocab.to_list() if self.src_vocab else None,
                  "tgt_vocab": self.tgt_vocab.to_list() if self.tgt_vocab else None}
        try:
            text = jsonio.dumps(config, indent=1)
        except TypeError as e:
            raise UserError(f"{type(self.model).__name__}.config must hold JSON values (it "
                            f"rebuilds the model from a run directory): {e}") from None

        numpyro_opt = isinstance(self.optimizer_state, dict) and \
            "numpyro_leaves" in self.optimizer_state
        native = self.backend == "numpyro"
        if native and self.params is None:
            raise UserError("a NumPyro model's run has no parameters to save (run.params)")

        def fill(tmp: Path) -> None:
            (tmp / "config.json").write_text(text)
            if native:
                extra = {k: v for k, v in self.extra.items()
                         if k not in ("best_model", "sample_stats")}
                save_arrays(tmp / "params.npz", {"last": self.params,
                                                 "best": self.extra.get("best_model")})
                if self.samples is not None:
                    save_arrays(tmp / "samples.npz", {
                        "posterior": self.samples,
                        "sample_stats": self.extra.get("sample_stats")})
                try:
                    state = jsonio.dumps({"step": self.step, "extra": extra}, indent=1)
                except TypeError as e:
                    raise UserError(f"run.extra must hold JSON values for a NumPyro run: "
                                    f"{e}") from None
                (tmp / "state.json").write_text(state)
            else:
                import torch

                torch.save({"model": self.model.state_dict(), "step": self.step,
                            "optimizer": None if numpyro_opt else self.optimizer_state,
                            "rng": self.rng_state, "extra": self.extra}, tmp / "checkpoint.pt")
            if numpyro_opt:
                leaves = self.optimizer_state["numpyro_leaves"]
                save_arrays(tmp / "optimizer.npz",
                            {"leaves": {str(i): x for i, x in enumerate(leaves)}})
            metrics = {"history": self.history}
            for key in ("ms_per_step", "ms_per_step_compiled", "train_seconds", "compilations",
                        "compile_seconds", "shapes"):
                if key in self.extra:
                    metrics[key] = self.extra[key]
            (tmp / "metrics.json").write_text(jsonio.dumps(metrics, indent=1))
            if self.history:
                _learning_curve(self.history, tmp / "learning_curve.png", self.method)
            if diverged is not None:
                (tmp / DIVERGED).write_text(jsonio.dumps(diverged.record(), indent=1) + "\n")
            else:
                (tmp / (COMPLETE if complete else PARTIAL)).write_text("")

        return write_directory_atomically(path, fill)

    @classmethod
    def load(cls, path: str | os.PathLike, which: str = "best", partial: bool = False,
             model_class=None, device=None) -> Run:
        """Load a run directory; ``which="best"`` (for evaluation) takes the best-validation
        weights where they were kept, ``"last"`` (for resuming) the weights of the last step.
        ``model_class``: the class to rebuild (default: the one ``config.json`` names);
        ``device``: where a Pyro model goes (its weights are read onto the CPU first, so a run
        trained on any device loads on any other; a NumPyro model's arrays go where JAX's
        default device is when they are used)."""
        path = Path(path)
        check_not_diverged(path)
        if not (path / COMPLETE).exists() and not (partial and (path / PARTIAL).exists()):
            raise UserError(f"{path}: not a complete run directory (no {COMPLETE} marker)")
        cfg = read_config(path)
        spec = cfg["model_class"]
        if model_class is None:
            model_class = _model_class(spec, path)
        native = model_backend(model_class) == "numpyro"
        samples = None
        family = get_backend("numpyro" if native else "pyro").method_family(
            cfg["method"], model_class, cfg["train"].get("method_options"))
        try:
            model = model_class(**cfg["model"], family=family)
        except TypeError as e:
            raise UserError(f"{path}/config.json: the model options do not fit "
                            f"{model_class.__name__} ({e})") from None
        params = None
        if native:
            arrays = load_arrays(path / "params.npz")
            state = _read_json(path / "state.json")
            extra, step, optimizer, rng = state.get("extra", {}), state.get("step", 0), None, None
            if arrays.get("best") is not None:
                extra["best_model"] = arrays["best"]
            best = extra.get("best_model") if which == "best" else None
            params = best if best is not None else arrays.get("last", {})
            if (path / "samples.npz").exists():
                draws = load_arrays(path / "samples.npz")
                samples = draws.get("posterior", {})
                if draws.get("sample_stats"):
                    extra["sample_stats"] = draws["sample_stats"]
        else:
            ckpt = load_checkpoint(path / "checkpoint.pt")
            extra = ckpt.get("extra") or {}
            best = extra.get("best_model") if which == "best" else None
            model.load_state_dict(best if best is not None else ckpt["model"])
            if device is not None:
                model.to(device)
            model.eval()
            step, optimizer, rng = ckpt["step"], ckpt["optimizer"], ckpt["rng"]
        if (path / "optimizer.npz").exists():
            leaves = load_arrays(path / "optimizer.npz").get("leaves", {})
            optimizer = {"numpyro_leaves": [leaves[str(i)] for i in range(len(leaves))]}
        history = json.loads((path / "metrics.json").read_text())["history"]
        vocab = {k: Vocab.from_list(cfg[k]) if cfg.get(k) else None
                 for k in ("src_vocab", "tgt_vocab")}
        return cls(model, cfg["method"], vocab["src_vocab"], vocab["tgt_vocab"], cfg["train"],
                   history, step, optimizer, rng, extra, spec, params, samples)


def _learning_curve(history: list, path: Path, method: str) -> None:
    """The learning curve's figure; a failure to draw it is named on stderr and leaves the run
    directory complete (the figure is a view of ``metrics.json``, which is written)."""
    try:
        from .plots import plot_learning_curve

        plot_learning_curve(history, path, title=method)
    except Exception as e:  # a figure must not lose the run it shows
        import sys

        print(f"warning: {path.name} not drawn ({type(e).__name__}: {e}); the run directory "
              f"is complete, its numbers are in metrics.json", file=sys.stderr)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: unreadable ({e})") from None


def run_extra(path: Path) -> dict:
    """A complete run directory's ``extra`` numbers (its test report …) without its weights:
    ``state.json`` of a NumPyro model's run, else ``checkpoint.pt``."""
    path = Path(path)
    if (path / "state.json").exists():
        return _read_json(path / "state.json").get("extra") or {}
    return load_checkpoint(path / "checkpoint.pt").get("extra") or {}


def read_config(path: Path) -> dict:
    try:
        cfg = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{path}/config.json: unreadable ({e})") from None
    missing = [k for k in ("method", "model_class", "model", "train") if k not in cfg]
    if missing:
        raise UserError(f"{path}/config.json: no {', '.join(missing)} (not a run directory of "
                        f"this version)")
    return cfg


def _model_class(spec: str, run_dir: Path):
    """The class a run directory names; a file inside the run directory is refused (a run
    directory is data, not code)."""
    location = spec.rpartition(":")[0]
    if location.endswith(".py") or "/" in location:
        file = Path(location).expanduser().resolve()
        if file.is_relative_to(Path(run_dir).resolve()):
            raise UnsafeCheckpoint(f"{run_dir}/config.json names a model file inside the run "
                                   f"directory ({file}); refusing to import it")
    if location == "__main__":
        import sys

        cls = getattr(sys.modules.get("__main__"), spec.rpartition(":")[2], None)
        if cls is None:
            raise UserError(f"{run_dir}: its model class {spec} was defined in a script; put it "
                            f"in a file and pass --model path/to/file.py:ClassName")
        return cls
    return load_model_class(spec)


def load_checkpoint(path: Path) -> dict:
    """``torch.load`` with ``weights_only=True``: plain data only."""
    import torch

    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UnsafeCheckpoint(f"{path}: holds pickled objects other than plain data; refusing "
                               f"to load it ({first[:200]})") from None
    except (OSError, RuntimeError, EOFError) as e:
        raise UserError(f"{path}: unreadable checkpoint ({e})") from None
