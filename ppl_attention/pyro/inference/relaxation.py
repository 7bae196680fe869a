"""``relax``: a guide whose structured draws are differentiable — perturbed marginals,
straight-through or implicit MLE (:mod:`ppl_attention.structures.perturbation`) — so that the
ELBO with the closed-form KL (:class:`~ppl_attention.pyro.inference.elbo.ScoreFunctionKL_ELBO`)
takes a pathwise gradient instead of the score function's.

For every latent site of the guide whose distribution can relax its draw (a structure of
:mod:`ppl_attention.pyro.crfs`, a :class:`~ppl_attention.pyro.trees.DependencyTree`; under a
mask as well), the value is the differentiable draw from the site's potentials, and the site is
marked ``infer["relaxed"] = kind``: the ELBO then takes its KL(q ‖ p) in closed form and no
score-function term. The model replays the draw; a structured family reads a relaxed event
(fractional parts) through the same linear weights it reads a structure with.

    svi = SVI(model, relax(guide, "perturbed", temperature=0.5), optim, ScoreFunctionKL_ELBO())

The NumPyro mirror is :mod:`ppl_attention.numpyro.inference.relaxation`.
"""

from __future__ import annotations

from pyro.distributions.torch_distribution import MaskedDistribution
from pyro.poutine.messenger import Messenger

from ...core.errors import UserError
from ...structures.perturbation import check_relaxation

__all__ = ["relax", "RelaxMessenger", "relaxable"]


def relaxable(fn):
    """The distribution under masks and ``to_event`` wrappers that relaxes its draws, or None."""
    while isinstance(fn, MaskedDistribution) or hasattr(fn, "base_dist"):
        if hasattr(fn, "relaxed_sample"):
            break
        fn = fn.base_dist
    return fn if callable(getattr(fn, "relaxed_sample", None)) else None


class RelaxMessenger(Messenger):
    """The handler of :func:`relax`."""

    def __init__(self, kind: str, temperature: float = 1.0, noise: str = "gumbel",
                 noise_scale: float = 1.0, lam: float = 10.0, sites=None, perturbation=None):
        check_relaxation(kind, temperature, noise, noise_scale, lam)
        super().__init__()
        self.kind, self.sites = kind, None if sites is None else set(sites)
        self.perturbation = dict(perturbation or {})
        self.settings = dict(temperature=temperature, noise=noise, noise_scale=noise_scale,
                             lam=lam)
        self.seen: set = set()

    def __enter__(self):
        self.seen = set()
        return super().__enter__()

    def __exit__(self, *args):
        missing = (self.sites or set()) - self.seen
        out = super().__exit__(*args)
        if missing and args[0] is None:
            raise UserError(f"relax: the guide has no site {sorted(missing)[0]!r} to relax")
        return out

    def _pyro_sample(self, msg):
        if msg["is_observed"] or msg["done"]:
            return
        if self.sites is not None and msg["name"] not in self.sites:
            return
        base = relaxable(msg["fn"])
        if base is None:
            if self.sites is not None:
                raise UserError(f"relax: site {msg['name']!r} has a "
                                f"{type(msg['fn']).__name__}, which has no relaxation (a "
                                f"structure of ppl_attention's structure library has)")
            return
        self.seen.add(msg["name"])
        msg["value"] = base.relaxed_sample(self.kind, **self.settings,
                                           perturbation=self.perturbation.get(msg["name"]))
        msg["done"] = True
        msg["infer"] = dict(msg["infer"] or {}, relaxed=self.kind)


def relax(fn=None, kind: str = "perturbed", temperature: float = 1.0, noise: str = "gumbel",
          noise_scale: float = 1.0, lam: float = 10.0, sites=None, perturbation=None):
    """``fn`` (a guide) with its structured draws relaxed (module docstring); ``sites``: the
    names to relax (None: every site that can be). ``kind``: ``"perturbed"``,
    ``"straight-through"``, ``"imle"``; ``temperature`` τ (perturbed, straight-through);
    ``noise`` ``"gumbel"`` or ``"none"`` with ``noise_scale``; ``lam``: implicit MLE's λ;
    ``perturbation``: ``{site: ε}``, the noise of those sites given (common random numbers)."""
    msngr = RelaxMessenger(kind, temperature, noise, noise_scale, lam, sites, perturbation)
    return msngr(fn) if fn is not None else msngr
