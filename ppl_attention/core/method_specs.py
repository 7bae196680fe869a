"""The inference methods, as specs both backends build from: which family the model samples,
which guide, which objective, enumeration, baselines and KL annealing. Names are those of the
API, the command line and every results table (Deng et al. 2018's Table 1 names in brackets).

A method asks of a model (see :mod:`ppl_attention.pyro.models.base`): a guide offering its
``posterior`` ("none": no alignment guide; "prior": the prior's distribution from the model's
own scores; "inference": an amortized inference network q(z | x, y)), and for the ``"soft"``
REINFORCE baseline the capability ``soft-likelihood``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import UserError
from .family_specs import FamilySpec, family_spec

OBJECTIVES = ("Trace_ELBO", "TraceEnum_ELBO", "TraceGraph_ELBO", "TraceMeanField_ELBO",
              "ReweightedWakeSleep", "ScoreFunctionKL_ELBO")
POSTERIORS = ("none", "prior", "inference")


@dataclass(frozen=True)
class MethodSpec:
    """How one inference method trains a model.

    ``family`` / ``family_options``: the alignment family the model samples (a name of
    :data:`~ppl_attention.core.family_specs.FAMILY_SPECS`); ``posterior``: the alignment guide;
    ``objective``: the estimator, by Pyro's class name; ``enumerate_model`` /
    ``enumerate_guide``: parallel enumeration on that side; ``baseline``: REINFORCE control
    variate for a sampled categorical guide ("soft": var-attn's soft-attention log-likelihood);
    ``anneal_rho``: KL weight λ(t) = sigmoid(t·ρ − 6) on the alignment sites (BAM), or None;
    ``particles``: samples per step (reweighted wake-sleep's K).
    """

    name: str
    description: str
    family: str
    posterior: str
    objective: str
    family_options: dict = field(default_factory=dict)
    enumerate_model: bool = False
    enumerate_guide: bool = False
    baseline: str | None = None
    anneal_rho: float | None = None
    particles: int = 1

    def __post_init__(self):
        family_spec(self.family).validate(**self.family_options)
        if self.posterior not in POSTERIORS or self.objective not in OBJECTIVES:
            raise UserError(f"method {self.name!r}: posterior must be one of {POSTERIORS} and "
                            f"objective one of {OBJECTIVES}")

    @property
    def family_spec(self) -> FamilySpec:
        return family_spec(self.family)

    @property
    def samples_alignment(self) -> bool:
        """Does one step of the method draw a random alignment (a sampled guide site)? Not when
        the family is deterministic or the alignment is enumerated, nor without a guide."""
        fam = self.family_spec
        if fam.deterministic or self.enumerate_model or self.enumerate_guide:
            return False
        return self.posterior != "none"

    @property
    def requires(self) -> tuple[str, ...]:
        """Capabilities the model needs beyond ``model`` and ``guide``."""
        need = ("soft-likelihood",) if self.baseline == "soft" else ()
        if self.family_spec.tree and self.enumerate_model:
            need += ("arc-emissions",)
        return need


METHOD_SPECS: dict[str, MethodSpec] = {m.name: m for m in [
    MethodSpec("soft", "soft attention, maximum likelihood [Soft attention]",
               "soft", "none", "Trace_ELBO"),
    MethodSpec("exact", "exact marginal likelihood by enumeration [Marginal likelihood]",
               "categorical", "none", "TraceEnum_ELBO", enumerate_model=True),
    MethodSpec("hmm-exact", "exact marginal likelihood of hard monotonic (HMM) attention, "
               "forward algorithm [Wu & Cotterell 2019]",
               "markov-categorical", "none", "TraceEnum_ELBO", enumerate_model=True),
    MethodSpec("hard-enum", "E_p[log p(y|z)] enumerated, prior as guide [Hard attention + Enum]",
               "categorical", "prior", "TraceEnum_ELBO", enumerate_guide=True),
    MethodSpec("hard-sample", "E_p[log p(y|z)] by REINFORCE, prior as guide "
               "[Hard attention + Sample]",
               "categorical", "prior", "TraceGraph_ELBO", baseline="soft"),
    MethodSpec("vae-enum", "exact ELBO with q(z|x,y) enumerated [Variational attention + Enum]",
               "categorical", "inference", "TraceEnum_ELBO", enumerate_guide=True),
    MethodSpec("vae-sample", "ELBO by REINFORCE with baselines [Variational attention + Sample]",
               "categorical", "inference", "TraceGraph_ELBO", baseline="soft"),
    MethodSpec("vae-gumbel", "Concrete relaxation of q and p, reparameterized",
               "relaxed-categorical", "inference", "Trace_ELBO",
               family_options={"temperature": 0.5}),
    MethodSpec("vae-rws", "reweighted wake-sleep with q(z|x,y) (K=5)",
               "categorical", "inference", "ReweightedWakeSleep", particles=5),
    MethodSpec("dirichlet", "Dirichlet alignment, implicit reparameterization "
               "[Variational relaxed attention]",
               "dirichlet", "inference", "TraceMeanField_ELBO",
               family_options={"concentration": 1.0}),
    MethodSpec("bam-weibull", "BAM-WC: Weibull attention, contextual Gamma prior, analytic KL",
               "weibull", "prior", "TraceMeanField_ELBO", family_options={"k": 10.0},
               anneal_rho=0.02),
    MethodSpec("bam-lognormal", "BAM-LC: LogNormal attention, contextual prior, analytic KL",
               "lognormal", "prior", "TraceMeanField_ELBO", family_options={"sigma": 0.5},
               anneal_rho=0.02),
    MethodSpec("gaussian-context", "Gaussian context vector [Variational attention, Bahuleyan]",
               "gaussian-context", "inference", "TraceMeanField_ELBO",
               family_options={"prior": "soft"}),
    MethodSpec("segment-crf", "segmentation attention: binary linear-chain CRF marginals, maximum "
               "likelihood [Structured attention, Kim et al. 2017]",
               "segment-crf", "none", "Trace_ELBO"),
    MethodSpec("tree-marginals", "syntactic attention: each word read with its parent and "
               "children weighted by exact dependency-tree arc marginals (inside-outside), maximum "
               "likelihood [Structured attention, Kim et al. 2017]",
               "tree-marginals", "none", "Trace_ELBO"),
    MethodSpec("tree-sample", "a latent dependency tree per sentence: ELBO by the score function "
               "with the exact tree KL, q(tree | x, y), tree-marginals baseline",
               "tree", "inference", "ScoreFunctionKL_ELBO", baseline="soft"),
    MethodSpec("tree-exact", "exact log p(y | x) = log Z(prior + emission) - log Z(prior) of a "
               "latent tree whose emission factors over arcs",
               "tree", "none", "Trace_ELBO", enumerate_model=True),
]}


def method_spec(name: str) -> MethodSpec:
    try:
        return METHOD_SPECS[name]
    except KeyError:
        raise UserError(f"unknown method {name!r}; valid: {', '.join(METHOD_SPECS)}") from None


def guide_posterior(method: str, model) -> str:
    """The guide a run of ``method`` on ``model`` reads its posterior from ("inference" or
    "prior"): the method's own, or for a method without one (an exact method) the model's
    inference network where it offers one — both backends' evaluation by importance sampling."""
    p = method_spec(method).posterior
    if p != "none":
        return p
    return "inference" if "inference" in getattr(model, "posteriors", POSTERIORS) else "prior"
