"""Divergence: a training run whose numbers stopped being numbers, or became impossible, is
stopped and named — never reported as finished, never as bad input.

Both training loops call :func:`check_step` on every step (the loss and the gradients' global
norm before the update: a non-finite one stops the run *before* the update touches the weights,
so the weights kept are the last finite ones) and :func:`check_figure` on every validation NLL.
A stop raises :class:`Diverged`, which carries the step, the method, what was not finite (or
impossible) and its value; the loop saves the run directory marked ``DIVERGED`` with that
record (:mod:`ppl_attention.common.runs`) and re-raises it. The command line prints it as one line
with
what to try (a smaller ``--lr``, the family's known instabilities) and exits with
:data:`EXIT_DIVERGED`; every tool refuses a diverged run with its reason.

*An exploded loss.* A loss that stays finite while the weights run away (a huge learning rate
gives 10¹⁹ nats per token) is divergence too: a step's −ELBO/token above :data:`EXPLOSION`
times the run's first (at least 1 nat) stops the run.

*Impossible figures.* For discrete observations (every data kind of the package) p(y | x) ≤ 1,
so a negative log-likelihood per token is ≥ 0, and so is −ELBO in expectation. A validation or
test NLL/token below −:data:`NLL_TOLERANCE`, or a batch's −ELBO/token below
−:data:`ELBO_TOLERANCE` (far beyond any Monte Carlo noise of a batch mean), is a broken
estimator, not a good model.
"""

from __future__ import annotations

import math

__all__ = ["Diverged", "check_step", "check_figure", "finite", "hint", "EXIT_DIVERGED",
           "NLL_TOLERANCE", "ELBO_TOLERANCE", "EXPLOSION"]

#: the exit status of a command whose training diverged (2 is bad input)
EXIT_DIVERGED = 3
#: a reported NLL/token below −this is impossible for discrete observations
NLL_TOLERANCE = 1e-3
#: a batch's −ELBO/token below −this is impossible for discrete observations
ELBO_TOLERANCE = 5.0
#: a step's −ELBO/token above this times the run's first (at least 1) has exploded
EXPLOSION = 1e4


def finite(x) -> bool:
    """Is ``x`` (a number) finite? NaN and ±∞ are not."""
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError, OverflowError):
        return False


def _number(x) -> float | str:
    """A JSON value for ``x``: the float when finite, else its name ("nan", "inf", "-inf")."""
    v = float(x)
    return v if math.isfinite(v) else str(v)


class Diverged(Exception):
    """Training stopped: at ``step`` (1-based, the step that failed), ``what`` (``"loss"``,
    ``"gradient norm"``, ``"attention scores"``, ``"validation NLL"`` …) was ``value`` — not
    finite, or impossible (``impossible=True``). ``hint`` says what to try."""

    def __init__(self, step: int, method: str, what: str, value, *, impossible: bool = False,
                 exploded: bool = False, hint: str = ""):
        self.step, self.method, self.what = int(step), str(method), str(what)
        self.value = _number(value) if not isinstance(value, str) else value
        self.impossible, self.exploded, self.hint = bool(impossible), bool(exploded), hint
        #: the step whose weights the run keeps (set by the training loop that stopped)
        self.kept: int | None = None
        #: the run the training loop stopped (its state at ``kept``)
        self.run = None
        super().__init__(self.message())

    def __str__(self) -> str:
        return self.message()

    def message(self) -> str:
        kind = "an impossible figure" if self.impossible else \
            "exploded" if self.exploded else "not finite"
        value = self.value if isinstance(self.value, str) else f"{self.value:.4g}"
        kept = "" if self.kept is None else f"; the run keeps the weights of step {self.kept}"
        return (f"training diverged at step {self.step} ({self.method}): {self.what} = {value} "
                f"({kind}){kept}, marked DIVERGED" + (f" — try {self.hint}" if self.hint else ""))

    def record(self) -> dict:
        """The ``DIVERGED`` marker's content (plain JSON)."""
        return {"step": self.step, "method": self.method, "what": self.what,
                "value": self.value, "impossible": self.impossible, "exploded": self.exploded,
                "kept_step": self.kept,
                "hint": self.hint, "message": self.message()}

    @classmethod
    def from_record(cls, rec: dict) -> Diverged:
        out = cls(rec.get("step", 0), rec.get("method", "?"), rec.get("what", "?"),
                  rec.get("value", "nan"), impossible=bool(rec.get("impossible")),
                  exploded=bool(rec.get("exploded")), hint=rec.get("hint", ""))
        out.kept = rec.get("kept_step")
        return out


def hint(method_spec=None, lr: float | None = None) -> str:
    """What to try: a smaller learning rate, and the known instabilities of the family the
    method samples (a :class:`~ppl_attention.core.method_specs.MethodSpec`; none for a method that
    samples nothing)."""
    parts = [f"a smaller --lr (this run: {lr:g})" if lr is not None else "a smaller --lr"]
    fam = None if method_spec is None else method_spec.family_spec
    if fam is not None and fam.instability and method_spec.samples_alignment:
        parts.append(f"{fam.name}: {fam.instability}")
    return "; ".join(parts)


def check_step(step: int, method: str, loss, grad_norm=None, *, discrete: bool = True,
               advice: str = "", first_loss=None) -> None:
    """Raise :class:`Diverged` when the step's −ELBO/token ``loss`` or its gradients' global
    norm is not finite, when the loss exploded (above EXPLOSION × max(1, ``first_loss``), the
    run's first step's), or (``discrete`` observations) when it is below −ELBO_TOLERANCE.
    ``step`` is 1-based."""
    if not finite(loss):
        raise Diverged(step, method, "loss", loss, hint=advice)
    if grad_norm is not None and not finite(grad_norm):
        raise Diverged(step, method, "gradient norm", grad_norm, hint=advice)
    if first_loss is not None and finite(first_loss) and \
            float(loss) > EXPLOSION * max(1.0, abs(float(first_loss))):
        raise Diverged(step, method, f"−ELBO per token (exploded from {float(first_loss):.4g} "
                       f"at the first step)", loss, exploded=True, hint=advice)
    if discrete and float(loss) < -ELBO_TOLERANCE:
        raise Diverged(step, method, "−ELBO per token", loss, impossible=True, hint=advice)


def check_figure(step: int, method: str, name: str, value, *, discrete: bool = True,
                 advice: str = "") -> None:
    """Raise :class:`Diverged` when a reported NLL/token ``value`` is not finite or, for
    discrete observations, negative beyond NLL_TOLERANCE."""
    if not finite(value):
        raise Diverged(step, method, name, value, hint=advice)
    if discrete and float(value) < -NLL_TOLERANCE:
        raise Diverged(step, method, name, value, impossible=True, hint=advice)
