"""A run: a trained model with its vocabularies, method and history; saved as a run directory
(``config.json``, ``checkpoint.pt``, ``metrics.json``, ``learning_curve.png``) that is written
under a temporary name and renamed when complete, so an interrupted run never looks finished."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..data.corpus import write_directory_atomically
from ..data.vocab import Vocab
from ..models.seq2seq import Seq2SeqAlignment
from .methods import get_method

COMPLETE = "COMPLETE"
PARTIAL = "PARTIAL"  # a periodic checkpoint of a run still training: resumable, not evaluable


@dataclass
class Run:
    model: Seq2SeqAlignment  # or an AttentionSeqVAE (method "seq-vae"; src_vocab = tgt_vocab)
    method: str
    src_vocab: Vocab
    tgt_vocab: Vocab
    config: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)
    step: int = 0
    optimizer_state: dict | None = None
    rng_state: dict | None = None
    extra: dict = field(default_factory=dict)

    def save(self, path: str | os.PathLike, complete: bool = True) -> Path:
        """Write the run directory atomically: a temporary sibling, then one rename. With
        ``complete=False`` (a periodic checkpoint) it is marked PARTIAL: ``train --resume``
        continues it, ``evaluate`` refuses it."""
        def fill(tmp: Path) -> None:
            (tmp / "config.json").write_text(json.dumps({
                "method": self.method, "model": self.model.config, "train": self.config,
                "src_vocab": self.src_vocab.to_list(), "tgt_vocab": self.tgt_vocab.to_list(),
            }, indent=1))
            torch.save({"model": self.model.state_dict(), "step": self.step,
                        "optimizer": self.optimizer_state, "rng": self.rng_state,
                        "extra": self.extra}, tmp / "checkpoint.pt")
            (tmp / "metrics.json").write_text(json.dumps({"history": self.history}, indent=1))
            if self.history:
                from .plots import plot_learning_curve
                plot_learning_curve(self.history, tmp / "learning_curve.png", title=self.method)
            (tmp / (COMPLETE if complete else PARTIAL)).write_text("")

        return write_directory_atomically(path, fill)

    @classmethod
    def load(cls, path: str | os.PathLike, which: str = "best", partial: bool = False) -> Run:
        """Load a run directory; ``which="best"`` (for evaluation) takes the best-validation
        weights where they were kept, ``"last"`` (for resuming) the weights of the last step."""
        path = Path(path)
        if not (path / COMPLETE).exists() and not (partial and (path / PARTIAL).exists()):
            raise ValueError(f"{path}: not a complete run directory (no {COMPLETE} marker)")
        cfg = json.loads((path / "config.json").read_text())
        mc = cfg["model"]
        if cfg["method"] == "seq-vae":
            from ..models.seq_vae import AttentionSeqVAE

            model = AttentionSeqVAE(**mc)
        else:
            method = get_method(cfg["method"])
            model = Seq2SeqAlignment(family=method.family(mc["hidden"]), **mc)
        ckpt = torch.load(path / "checkpoint.pt", weights_only=False)
        extra = ckpt.get("extra") or {}
        best = extra.get("best_model") if which == "best" else None
        model.load_state_dict(best if best is not None else ckpt["model"])
        model.eval()
        history = json.loads((path / "metrics.json").read_text())["history"]
        return cls(model, cfg["method"], Vocab.from_list(cfg["src_vocab"]),
                   Vocab.from_list(cfg["tgt_vocab"]), cfg["train"], history, ckpt["step"],
                   ckpt["optimizer"], ckpt["rng"], extra)
