"""Differentiable samples of a structure: perturb-and-MAP and its relaxations, written once for
every structure and both backends (the placement of SynJax's ``differentiable_sample``).

A structure with potentials θ (its event array) offers the MAP oracle z*(θ) = argmax_z ⟨z, θ⟩
and the marginals μ(θ) = ∇ log Z(θ). With noise ε on every potential (standard Gumbel, times
``noise_scale``; or none), a draw is differentiable in one of three ways:

- ``"perturbed"`` — perturbed marginals at temperature τ, μ((θ + ε)/τ): the entropy-smoothed
  perturb-and-MAP of the stochastic softmax trick (Paulus, Choi, Tarlow, Krause & Maddison
  2020, §3) and of Gumbel-CRF (Fu et al. 2020) — a point of the marginal polytope that tends to
  the perturbed MAP z*(θ + ε) as τ → 0; reparameterized, biased for τ > 0;
- ``"straight-through"`` — the hard structure z*(θ + ε) forward, the gradient of the perturbed
  marginals backward: z* + μ_τ − stop_gradient(μ_τ) (Bengio et al. 2013's estimator on a
  structure);
- ``"imle"`` — implicit maximum-likelihood estimation (Niepert, Minervini & Franceschi 2021,
  eq. 7): z*(θ + ε) forward, and for the loss's gradient g at z the backward pass
  (z*(θ + ε) − z*(θ + ε − λ g)) / λ, the difference between the MAP and the MAP of the target
  distribution θ − λ g under the same noise.

With Gumbel noise on the parts, z*(θ + ε) is an exact draw of the Gibbs distribution only for a
categorical (one part per outcome); on a structure it is perturb-and-MAP's approximation (Papandreou
& Yuille 2011), which is why these are estimators with a bias to measure
(``benchmarks/estimators.py``), not samplers. A structure serves them by ``marginals_at(θ)``,
``argmax_at(θ, *aux)`` (``aux``: its lengths as arrays) and ``aux()``.
"""

from __future__ import annotations

from ..core.errors import UserError

__all__ = ["KINDS", "NOISES", "relaxed_sample", "check_relaxation"]

KINDS = ("perturbed", "straight-through", "imle")
NOISES = ("gumbel", "none")


def check_relaxation(kind: str, temperature: float, noise: str, noise_scale: float,
                     lam: float) -> None:
    """Refuse a relaxation that does not exist or a temperature, noise scale or λ out of
    range, naming it."""
    if kind not in KINDS:
        raise UserError(f"relaxation must be one of {', '.join(KINDS)}, got {kind!r}")
    if noise not in NOISES:
        raise UserError(f"noise must be one of {', '.join(NOISES)}, got {noise!r}")
    for name, v in (("temperature", temperature), ("noise_scale", noise_scale),
                    ("imle_lambda", lam)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0 \
                or v == float("inf"):
            raise UserError(f"{name} must be a number above 0, got {v!r}")


def _noise(ops, like, noise: str, scale: float, key):
    if noise == "none":
        return ops.full_like(like, 0.0)
    return scale * ops.gumbel(key, like)


def relaxed_sample(structure, kind: str, temperature: float = 1.0, noise: str = "gumbel",
                   noise_scale: float = 1.0, lam: float = 10.0, key=None, perturbation=None):
    """A differentiable draw ``[batch, *event]`` of ``structure`` (module docstring) from its
    potentials ``structure.log_potentials``; ``key``: the JAX key of the noise (torch: its
    generator); ``perturbation``: the noise ε itself, of the potentials' shape (common random
    numbers: the same draw on both backends, or for several estimators), in place of a draw."""
    check_relaxation(kind, temperature, noise, noise_scale, lam)
    ops = structure.ops
    theta = structure.log_potentials
    if perturbation is not None:
        eps = ops.cast_like(perturbation, theta)
        if tuple(eps.shape) != tuple(theta.shape):
            raise UserError(f"relaxed_sample: perturbation of shape {tuple(eps.shape)}; the "
                            f"potentials are {tuple(theta.shape)}")
    else:
        eps = _noise(ops, theta, noise, noise_scale, key)
    eps = ops.stop_gradient(eps)
    aux = structure.aux()
    if kind == "perturbed":
        return structure.marginals_at((theta + eps) / temperature)
    if kind == "straight-through":
        soft = structure.marginals_at((theta + eps) / temperature)
        hard = ops.stop_gradient(structure.argmax_at(ops.stop_gradient(theta + eps), *aux))
        return hard + soft - ops.stop_gradient(soft)
    argmax_at = structure.argmax_at

    def forward(th, e, *aux_):
        return argmax_at(th + e, *aux_)

    def backward(th, z, g, e, *aux_):
        return (z - argmax_at(th + e - lam * g, *aux_)) / lam

    return ops.custom_backward(forward, backward, theta, eps, *aux)
