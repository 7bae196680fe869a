"""The training options both training loops take, and the check a resumed run must pass —
written once for the Pyro and the NumPyro loop."""

from __future__ import annotations

from .errors import UserError
from .schedules import SPANS_STEPS

__all__ = ["TRAINING_DEFAULTS", "training_options", "check_resume_steps"]

#: the package's training defaults (a model's ``training_defaults`` and the options given win)
TRAINING_DEFAULTS = dict(steps=1000, lr=1e-2, lr_schedule="cosine", batch_size=64, clip=5.0,
                         weight_decay=0.0, kl_weight=1.0, anneal_rho=None, valid_every=250)


def training_options(model_class, **given) -> dict:
    """The training options of a run: those ``given`` (not None), else the model's
    ``training_defaults``, else :data:`TRAINING_DEFAULTS`."""
    unknown = sorted(set(given) - set(TRAINING_DEFAULTS))
    if unknown:
        raise UserError(f"unknown training option {unknown[0]!r}; valid: "
                        f"{', '.join(TRAINING_DEFAULTS)}")
    out = dict(TRAINING_DEFAULTS)
    out.update(getattr(model_class, "training_defaults", None) or {})
    out.update({k: v for k, v in given.items() if v is not None})
    return out


def check_resume_steps(resume, steps: int, lr_schedule: str) -> None:
    """Refuse resuming a run with other ``--steps`` than it was trained for when its learning
    rate follows a schedule over the steps: the resumed run would not continue the run."""
    before = None if resume is None else resume.config.get("steps")
    if before is not None and before != steps and lr_schedule in SPANS_STEPS:
        raise UserError(f"--resume with --steps {steps}: this run was trained for {before} "
                        f"steps, and its {lr_schedule} learning rate spans them — resume with "
                        f"--steps {before}, or train with --lr-schedule constant (which a "
                        f"resumed run may extend)")
