"""Bayesian attention beyond seq2seq on the command line: ``train --model bam-classifier --task
digits`` and ``train --model gat --task sbm|karate`` (``--family soft|weibull|lognormal``,
``--prior contextual|constant``, ``--kl-weight η``), and ``evaluate`` of such a run: accuracy with
BAM's mean weights, ECE and PAvPU (p < 0.01 / 0.05 / 0.1) of ``--samples`` posterior draws, on
clean and noisy inputs (``--json`` keys ``accuracy``, ``ece``, ``pavpu``, ``pavpu_0.01`` … and the
same with ``_noisy``).

A run directory holds ``config.json``, ``checkpoint.pt`` (the weights), ``metrics.json`` (the
test report) and ``COMPLETE``, written under a temporary name and renamed when whole.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .data.corpus import write_directory_atomically

MODELS = ("bam-classifier", "gat")
TASKS = {"bam-classifier": ("digits",), "gat": ("sbm", "karate")}


def _data(task: str, noise: float, seed: int):
    if task == "digits":
        from .data.digits import load_digits_patches

        return load_digits_patches(noise=noise, seed=seed)
    from .data.graphs import contextual_sbm, karate_club

    return contextual_sbm(seed=seed) if task == "sbm" else karate_club(seed=seed)


def _build(cfg: dict):
    if cfg["model"] == "bam-classifier":
        from .models.bam_classifier import BAMClassifier

        return BAMClassifier(**cfg["model_config"])
    from .models.gat import BayesianGAT

    return BayesianGAT(**cfg["model_config"])


def report(model, cfg: dict, samples: int = 20, seed: int = 0) -> dict:
    """Accuracy / ECE / PAvPU on the test inputs, clean and noisy."""
    from .analysis.uncertainty import PAVPU_THRESHOLDS, expected_calibration_error, pavpu

    if samples < 2:
        raise ValueError(f"--samples must be at least 2 (PAvPU's t-test), got {samples}")
    data = _data(cfg["task"], cfg["noise"], cfg["data_seed"])
    if cfg["model"] == "bam-classifier":
        from .models.bam_classifier import predict_probs

        cases = (("", data.test_x), ("_noisy", data.test_x_noisy))
        labels = data.test_y

        def predict(x, s):
            return predict_probs(model, x, s, seed)
    else:
        from .models.gat import predict_gat

        te = data.test_mask
        cases = (("", data), ("_noisy", data.noisy(cfg["noise"], cfg["data_seed"])))
        labels = data.labels[te]

        def predict(g, s):
            return predict_gat(model, g, s, seed)[:, te]

    out = {"model": cfg["model"], "family": cfg["model_config"]["family"],
           "prior": cfg["model_config"]["prior"], "task": cfg["task"], "samples": samples}
    for suffix, x in cases:
        mean, draws = predict(x, 1), predict(x, samples)
        out["accuracy" + suffix] = float((mean[0].argmax(-1) == labels).float().mean())
        out["ece" + suffix] = expected_calibration_error(draws, labels)
        for t in PAVPU_THRESHOLDS:
            out[f"pavpu_{t}{suffix}"] = pavpu(draws, labels, t)
        out["pavpu" + suffix] = out[f"pavpu_0.05{suffix}"]
    return out


def train(args, out: Path) -> dict:
    if args.task not in TASKS[args.model]:
        raise ValueError(f"--model {args.model} trains on --task {' or '.join(TASKS[args.model])}"
                         f", not {args.task!r}")
    if args.family not in ("soft", "weibull", "lognormal"):
        raise ValueError(f"--family for {args.model} must be soft, weibull or lognormal")
    torch.manual_seed(args.seed)
    data = _data(args.task, args.noise, args.task_seed)
    if args.model == "bam-classifier":
        from .models.bam_classifier import BAMClassifier, train_classifier

        model = BAMClassifier(data.train_x.shape[1], data.train_x.shape[2], data.n_classes,
                              d=args.hidden, family=args.family, prior=args.prior)
        train_classifier(model, data.train_x, data.train_y, steps=args.steps,
                         batch_size=args.batch_size, lr=args.lr, kl_weight=args.kl_weight,
                         seed=args.seed, progress=True)
    else:
        from .models.gat import BayesianGAT, train_gat

        model = BayesianGAT(data.features.shape[1], data.n_classes, family=args.family,
                            prior=args.prior)
        train_gat(model, data, steps=args.steps, lr=args.lr, kl_weight=args.kl_weight,
                  seed=args.seed)
    cfg = {"method": args.model, "model": args.model, "model_config": model.config,
           "task": args.task, "noise": args.noise, "data_seed": args.task_seed,
           "train": {"steps": args.steps, "lr": args.lr, "kl_weight": args.kl_weight,
                     "seed": args.seed, "batch_size": args.batch_size}}
    rep = report(model, cfg)
    def fill(tmp: Path) -> None:
        (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
        torch.save({"model": model.state_dict()}, tmp / "checkpoint.pt")
        (tmp / "metrics.json").write_text(json.dumps(rep, indent=1))
        (tmp / "COMPLETE").write_text("")

    write_directory_atomically(out, fill)
    return rep


def is_bam_run(path) -> bool:
    cfg = Path(path) / "config.json"
    return cfg.exists() and json.loads(cfg.read_text()).get("method") in MODELS


def evaluate_run(path, samples: int = 20, seed: int = 0) -> dict:
    path = Path(path)
    if not (path / "COMPLETE").exists():
        raise ValueError(f"{path}: not a complete run directory (no COMPLETE marker)")
    cfg = json.loads((path / "config.json").read_text())
    model = _build(cfg)
    model.load_state_dict(torch.load(path / "checkpoint.pt", weights_only=False)["model"])
    model.eval()
    return report(model, cfg, samples, seed)
