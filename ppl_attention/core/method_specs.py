"""Every inference method, in one registry both backends and every command build from.

**Alignment methods** (:data:`METHOD_SPECS`, :class:`MethodSpec`): which family the model
samples, which guide, which objective, enumeration, baselines and KL annealing. Names are those
of the API, the command line and every results table (Deng et al. 2018's Table 1 names in
brackets).

**Methods for global latents** (:data:`GLOBAL_METHODS`, :class:`GlobalMethodSpec`), for a model
that declares ``latents`` with priors (a Bayesian aligner's translation table): the alignment
is summed out exactly inside the model and the *globals* are inferred —

- ``nuts``, ``hmc``: Markov chain Monte Carlo (NumPyro's NUTS / HMC, several chains) — the
  reference posterior every other method is compared against;
- ``svi-normal``, ``svi-lowrank``, ``svi-delta``: stochastic variational inference with an
  autoguide over the globals (``AutoNormal``, ``AutoLowRankMultivariateNormal``, ``AutoDelta``:
  MAP), ``TraceEnum_ELBO``;
- ``gibbs``, ``vb``, ``svb``: for a model that declares ``conjugate`` (the word aligners, whose
  tables are Dirichlet given the alignments): blocked Gibbs sampling — every alignment drawn
  given the tables, then the tables from their Dirichlet posteriors — with NumPyro's ``MCMC``;
  mean-field variational Bayes by closed-form coordinate ascent; stochastic VB over minibatches
  (``ppl-attention wordalign`` only).

Each declares what it needs (``requires``), which commands serve it (``train`` / ``compare``
/ ``sweep`` on a model's globals, ``wordalign`` on a corpus) and the **method options** it
takes with their defaults per command, each option defined once in :data:`METHOD_OPTIONS`
(the same name everywhere: ``--warmup`` is Gibbs's burn-in on both commands). The NumPyro
side (``ppl_attention.numpyro.inference.bayes``, ``…word_alignment``) runs them.

A method asks of a model (see :mod:`ppl_attention.pyro.models.base`): a guide offering its
``posterior`` ("none": no alignment guide; "prior": the prior's distribution from the model's
own scores; "inference": an amortized inference network q(z | x, y)), and for the ``"soft"``
REINFORCE baseline the capability ``soft-likelihood``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import MappingProxyType

from .errors import UserError
from .family_specs import FAMILY_SPECS, FamilySpec, family_spec

OBJECTIVES = ("Trace_ELBO", "TraceEnum_ELBO", "TraceGraph_ELBO", "TraceMeanField_ELBO",
              "ReweightedWakeSleep", "ScoreFunctionKL_ELBO")
POSTERIORS = ("none", "prior", "inference")
RELAXATIONS = ("perturbed", "straight-through", "imle")


@dataclass(frozen=True)
class MethodOption:
    """One option a method for global latents may take: ``--name`` (underscores as dashes) of
    type ``kind``, at least ``minimum`` (above it when ``exclusive``), at most ``maximum``."""

    name: str
    kind: type
    help: str
    minimum: float = 0
    exclusive: bool = False
    maximum: float | None = None
    choices: tuple = ()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def check(self, value):
        """``value`` converted to ``kind`` and checked; a bad one raises naming the flag."""
        if self.kind is bool:
            if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
                return value.lower() in ("true", "1")
            if not isinstance(value, bool):
                raise UserError(f"{self.flag}: expected true or false, got {value!r}")
            return value
        if self.kind is str:
            if value not in self.choices:
                raise UserError(f"{self.flag} must be one of {', '.join(self.choices)}, got "
                                f"{value!r}")
            return value
        try:
            v = self.kind(value)
        except (TypeError, ValueError):
            raise UserError(f"{self.flag}: expected {self.kind.__name__}, got {value!r}") from None
        if isinstance(value, float) and self.kind is int and v != value:
            raise UserError(f"{self.flag}: expected an integer, got {value!r}")
        low_bad = v <= self.minimum if self.exclusive else v < self.minimum
        if low_bad or (self.maximum is not None and v > self.maximum) or v != v:
            rng = (f"in ({self.minimum}, {self.maximum}]" if self.maximum is not None else
                   f"{'>' if self.exclusive else '≥'} {self.minimum}")
            raise UserError(f"{self.flag} must be {rng}, got {value}")
        return v


METHOD_OPTIONS: dict[str, MethodOption] = {o.name: o for o in [
    MethodOption("chains", int, "Markov chains", 1),
    MethodOption("parallel_chains", int, "chains run at once, one thread each (1: one after "
                 "another, one chain's accumulators in memory at a time)", 1),
    MethodOption("warmup", int, "warm-up (burn-in) steps or sweeps per chain, discarded", 0),
    MethodOption("samples", int, "draws kept per chain (variational methods: drawn from q)", 1),
    MethodOption("thin", int, "keep every N-th sweep", 1),
    MethodOption("track", int, "target words whose draws give R-hat and ESS", 1),
    MethodOption("init_sweeps", int, "sweeps of IBM1 (VB) whose translation table the chains "
                 "of IBM2 / HMM start from; 0: uniform tables", 0),
    MethodOption("iterations", int, "most coordinate-ascent sweeps", 1),
    MethodOption("tol", float, "stop when the ELBO's relative change is below this", 0),
    MethodOption("epochs", int, "passes over the corpus", 1),
    MethodOption("tau", float, "step delay τ of the step size (t + τ)^−κ", 0, exclusive=True),
    MethodOption("kappa", float, "step decay κ of the step size (t + τ)^−κ", 0.5,
                 exclusive=True, maximum=1),
    # the alignment methods' own (MethodSpec.options)
    MethodOption("temperature", float, "the relaxation's temperature τ: perturbed marginals at "
                 "(θ + ε)/τ", 0, exclusive=True),
    MethodOption("noise_distribution", str, "the law of the perturbation ε of the potentials "
                 "(none: the relaxation without noise)", choices=("gumbel", "none")),
    MethodOption("noise_scale", float, "the scale of the perturbation ε", 0, exclusive=True),
    MethodOption("imle_lambda", float, "implicit MLE's λ: the target distribution θ − λ·∂loss/∂z",
                 0, exclusive=True),
    MethodOption("max_active", int, "SparseMAP's slots: the most structures q holds", 1),
    MethodOption("max_len", int, "the longest segment a segment family selects (Segments, "
                 "SegmentMarginals)", 1),
    MethodOption("alpha", float, "α of α-entmax (above 1; 1.5 and 2 exact by sorting, others "
                 "by bisection)", 1, exclusive=True),
    MethodOption("learn_alpha", bool, "learn α of α-entmax, from --alpha (bisection)"),
]}

#: the method options of the alignment methods (the rest are the global methods')
ALIGNMENT_OPTIONS = ("temperature", "noise_distribution", "noise_scale", "imle_lambda",
                     "max_active", "max_len", "alpha", "learn_alpha")

@dataclass(frozen=True)
class MethodSpec:
    """How one inference method trains a model.

    ``family`` / ``family_options``: the alignment family the model samples (a name of
    :data:`~ppl_attention.core.family_specs.FAMILY_SPECS`); ``posterior``: the alignment guide;
    ``objective``: the estimator, by Pyro's class name; ``enumerate_model`` /
    ``enumerate_guide``: parallel enumeration on that side; ``baseline``: REINFORCE control
    variate for a sampled categorical guide ("soft": var-attn's soft-attention log-likelihood);
    ``anneal_rho``: KL weight λ(t) = sigmoid(t·ρ − 6) on the alignment sites (BAM), or None;
    ``particles``: samples per step (reweighted wake-sleep's K); ``relaxation``: the guide's
    draw made differentiable (``"perturbed"``, ``"straight-through"``, ``"imle"``:
    :mod:`ppl_attention.structures.perturbation`) for a pathwise gradient with the closed-form
    KL, or None; ``options``: the method options it takes (names of :data:`METHOD_OPTIONS`)
    with their defaults — a family parameter of that name is set on the family, the others
    are the relaxation's.
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
    relaxation: str | None = None
    options: dict = field(default_factory=dict)

    def __post_init__(self):
        family_spec(self.family).validate(**self.family_options)
        if self.posterior not in POSTERIORS or self.objective not in OBJECTIVES:
            raise UserError(f"method {self.name!r}: posterior must be one of {POSTERIORS} and "
                            f"objective one of {OBJECTIVES}")
        if self.relaxation is not None and self.relaxation not in RELAXATIONS:
            raise UserError(f"method {self.name!r}: relaxation must be one of {RELAXATIONS}")
        unknown = sorted(set(self.options) - set(METHOD_OPTIONS))
        if unknown:
            raise UserError(f"method {self.name!r}: unknown method options {unknown}")
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    def resolve_options(self, given: dict | None = None) -> dict:
        """The method's options: ``given`` (None values: not given) checked and over its
        defaults; an option it does not take is refused, naming those it takes."""
        given = {k: v for k, v in (given or {}).items() if v is not None}
        wrong = sorted(k for k in given if k not in self.options)
        if wrong:
            o = METHOD_OPTIONS[wrong[0]].flag if wrong[0] in METHOD_OPTIONS else wrong[0]
            takes = ", ".join(METHOD_OPTIONS[k].flag for k in self.options) or \
                "no method option"
            raise UserError(f"{o} does not apply to --method {self.name} (it takes {takes})")
        out = {k: METHOD_OPTIONS[k].check(given[k]) if k in given else d
               for k, d in self.options.items()}
        return out

    def options_of_family(self, given: dict | None, family_config: dict) -> dict:
        """The options of a run whose model was built with a family of ``family_config``: the
        family's parameters where the method's options set one (a ``given`` one that differs
        is refused), ``given`` for the rest."""
        given = {k: v for k, v in (given or {}).items() if v is not None}
        params = self.family_spec.params
        out = dict(given)
        for k in self.options:
            if k in params and k in family_config:
                if k in given and METHOD_OPTIONS[k].check(given[k]) != family_config[k]:
                    raise UserError(f"{METHOD_OPTIONS[k].flag} {given[k]!r}: the model's family "
                                    f"has {k}={family_config[k]!r}")
                out[k] = family_config[k]
        return self.resolve_options(out)

    def family_kwargs(self, options: dict | None = None) -> dict:
        """The family's parameters: the method's own, then those of ``options`` that are
        family parameters (resolved first)."""
        resolved = self.resolve_options(options)
        params = self.family_spec.params
        return {**self.family_options, **{k: v for k, v in resolved.items() if k in params}}

    def relaxation_kwargs(self, options: dict | None = None) -> dict:
        """The relaxation's settings (``temperature``, ``noise``, ``noise_scale``, ``lam``):
        :func:`ppl_attention.structures.perturbation.relaxed_sample`'s keywords, from the
        method options (``noise_distribution`` → ``noise``, ``imle_lambda`` → ``lam``)."""
        resolved = self.resolve_options(options)
        out = {k: resolved[k] for k in ("temperature", "noise_scale") if k in resolved}
        if "noise_distribution" in resolved:
            out["noise"] = resolved["noise_distribution"]
        if "imle_lambda" in resolved:
            out["lam"] = resolved["imle_lambda"]
        return out

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
    def exact_expectation(self) -> bool:
        """Is E_q over the alignment summed exactly (the guide's site enumerated: q categorical,
        sparse or SparseMAP)?"""
        return self.enumerate_guide

    @property
    def requires(self) -> tuple[str, ...]:
        """Capabilities the model needs beyond ``model`` and ``guide``."""
        need = ("soft-likelihood",) if self.baseline == "soft" else ()
        if self.family_spec.tree and self.enumerate_model:
            need += ("arc-emissions",)
        return need


_PERTURBATION = {"noise_distribution": "gumbel", "noise_scale": 1.0}
_RELAXED = {"temperature": 1.0, **_PERTURBATION}
_IMLE = {"imle_lambda": 10.0, **_PERTURBATION}


#: a segment family's longest segment, an option of the segment methods (its default the
#: family's)
_MAX_LEN = {"max_len": FAMILY_SPECS["segments"].params["max_len"][0]}


def _structured_ways(prefix: str, family: str, what: str, max_active: int = 10,
                     family_params: dict | None = None) -> list[MethodSpec]:
    """SparseMAP (``max_active`` slots by default: enough for its search to reach the optimum
    on the tasks' sources) and the three relaxations of a sampled structured family;
    ``family_params``: the family's parameters each method takes as an option (their
    defaults)."""
    own = dict(family_params or {})
    return [
        MethodSpec(f"{prefix}-sparsemap", f"{what}: q is SparseMAP's sparse distribution over a "
                   "few structures of the inference network's potentials; the ELBO summed "
                   "exactly over them [Correia et al. 2020]", family, "inference",
                   "TraceEnum_ELBO", family_options={"sparsemap": True}, enumerate_guide=True,
                   options={**own, "max_active": max_active}),
        MethodSpec(f"{prefix}-perturbed", f"{what}: perturbed marginals of q at temperature τ "
                   "as the draw, pathwise, with the exact KL [stochastic softmax trick]",
                   family, "inference", "ScoreFunctionKL_ELBO", relaxation="perturbed",
                   options={**own, **_RELAXED}),
        MethodSpec(f"{prefix}-st", f"{what}: perturb-and-MAP forward, the perturbed marginals' "
                   "gradient backward (straight-through), with the exact KL", family,
                   "inference", "ScoreFunctionKL_ELBO", relaxation="straight-through",
                   options={**own, **_RELAXED}),
        MethodSpec(f"{prefix}-imle", f"{what}: perturb-and-MAP forward, implicit MLE's gradient "
                   "backward, with the exact KL [Niepert et al. 2021]", family, "inference",
                   "ScoreFunctionKL_ELBO", relaxation="imle", options={**own, **_IMLE}),
    ]


METHOD_SPECS: dict[str, MethodSpec] = {m.name: m for m in [
    MethodSpec("soft", "soft attention, maximum likelihood [Soft attention]",
               "soft", "none", "Trace_ELBO"),
    MethodSpec("sparsemax", "sparsemax attention, maximum likelihood [Martins & Astudillo 2016]",
               "sparsemax", "none", "Trace_ELBO"),
    MethodSpec("entmax", "α-entmax attention (1.5 by default), maximum likelihood [Peters et al. "
               "2019]", "entmax", "none", "Trace_ELBO",
               options={"alpha": 1.5, "learn_alpha": False}),
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
    MethodSpec("sparse-marginal", "q(z|x,y) = sparsemax of the inference network's scores, the "
               "ELBO summed exactly over its support [Correia et al. 2020]",
               "sparse-categorical", "inference", "TraceEnum_ELBO", enumerate_guide=True),
    MethodSpec("hard-sparse", "q = sparsemax of the prior's scores, E_q[log p(y|z)] − KL(q‖p) "
               "summed exactly over its support (prior as guide)",
               "sparse-categorical", "prior", "TraceEnum_ELBO", enumerate_guide=True),
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
    MethodSpec("segments-marginals", "attention over segments: each query reads the source "
               "phrases a semi-Markov CRF selects, weighted by their exact coverage marginals, "
               "maximum likelihood", "segment-marginals", "none", "Trace_ELBO",
               options=_MAX_LEN),
    MethodSpec("segments-sample", "a latent selection of source segments per query: ELBO by the "
               "score function with the exact semi-Markov KL, q(selection | x, y), "
               "segments-marginals baseline",
               "segments", "inference", "ScoreFunctionKL_ELBO", baseline="soft",
               options=_MAX_LEN),
    *_structured_ways("segments", "segments", "a latent selection of source segments per query",
                      family_params=_MAX_LEN),
    MethodSpec("spans-marginals", "attention over spans: each query reads the constituents a "
               "constituency CRF over the source reads, weighted by their exact span marginals "
               "(inside-outside), maximum likelihood", "span-marginals", "none", "Trace_ELBO"),
    MethodSpec("spans-sample", "a latent labelled binary tree per query whose read constituents "
               "it attends to: ELBO by the score function with the exact constituency KL, "
               "q(tree | x, y), spans-marginals baseline",
               "spans", "inference", "ScoreFunctionKL_ELBO", baseline="soft"),
    *_structured_ways("spans", "spans", "a latent labelled binary tree per query", 32),
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
    *_structured_ways("tree", "tree", "a latent dependency tree per sentence"),
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


# --- methods for global latents ----------------------------------------------------------------


@dataclass(frozen=True)
class PerCorpus:
    """A default that scales with the corpus, as eflomal's sampling lengths do: ``max(floor,
    round(scale / √pairs))`` sweeps — more on a small corpus, whose posterior is broad, fewer
    on a large one (10,000 pairs: 2,500 / 100 = 25; 100,000 pairs: 8)."""

    scale: float
    floor: int

    def at(self, pairs: int) -> int:
        return max(self.floor, round(self.scale / math.sqrt(max(pairs, 1))))

    def __str__(self) -> str:
        return f"{self.scale:g}/√pairs (at least {self.floor})"


def at_corpus(options: dict, pairs: int) -> dict:
    """``options`` with every :class:`PerCorpus` default resolved for a corpus of ``pairs``."""
    return {k: v.at(pairs) if isinstance(v, PerCorpus) else v for k, v in options.items()}


#: the commands a method for global latents can serve
COMMANDS = ("train", "wordalign")


@dataclass(frozen=True)
class GlobalMethodSpec:
    """``kind``: ``"mcmc"`` (``kernel`` NUTS, HMC or Gibbs), ``"svi"`` (``autoguide``; the
    training options ``steps`` and ``lr``), ``"vb"`` or ``"svb"``; ``requires``: a declaration
    the model must make (``conjugate`` for Gibbs and the VBs); ``options``: per command that
    serves it (``train`` — also ``compare`` and ``sweep`` —, ``wordalign``), the method options
    it takes (names of :data:`METHOD_OPTIONS`) with their defaults."""

    name: str
    description: str
    kind: str
    options: dict
    kernel: str | None = None
    autoguide: str | None = None
    requires: str | None = None

    def __post_init__(self):
        for command, opts in self.options.items():
            if command not in COMMANDS or not set(opts) <= set(METHOD_OPTIONS):
                raise UserError(f"method {self.name!r}: options per command {COMMANDS}, names "
                                f"of METHOD_OPTIONS; got {command!r}: {sorted(opts)}")
        object.__setattr__(self, "options", MappingProxyType(
            {c: MappingProxyType(dict(o)) for c, o in self.options.items()}))

    def serves(self, command: str) -> bool:
        return command in self.options

    def resolve(self, command: str, given: dict) -> dict:
        """The method options for ``command``: ``given`` (None values: not given) checked
        and over the defaults; an option the method does not take there is refused."""
        takes = self.options.get(command)
        if takes is None:
            raise UserError(f"method {self.name!r} does not run under `{command}`; it runs under "
                            f"{', '.join(self.options)}")
        wrong = sorted(k for k, v in given.items() if v is not None and k not in takes)
        if wrong:
            o = METHOD_OPTIONS[wrong[0]].flag if wrong[0] in METHOD_OPTIONS else wrong[0]
            listed = ", ".join(METHOD_OPTIONS[k].flag for k in takes) or "no method option"
            raise UserError(f"{o} does not apply to --method {self.name} (it takes {listed})")
        return {k: METHOD_OPTIONS[k].check(given[k]) if given.get(k) is not None else d
                for k, d in takes.items()}


_MCMC = {"chains": 4, "warmup": 500, "samples": 1000}

GLOBAL_METHODS: dict[str, GlobalMethodSpec] = {m.name: m for m in [
    GlobalMethodSpec("nuts", "NUTS over the global latents, alignments enumerated (the "
                     "reference)", "mcmc", {"train": _MCMC}, kernel="NUTS"),
    GlobalMethodSpec("hmc", "HMC (fixed trajectory length) over the global latents",
                     "mcmc", {"train": _MCMC}, kernel="HMC"),
    GlobalMethodSpec("svi-normal", "SVI, AutoNormal (mean-field Gaussian) over the globals",
                     "svi", {"train": {"samples": 1000}}, autoguide="AutoNormal"),
    GlobalMethodSpec("svi-lowrank", "SVI, AutoLowRankMultivariateNormal over the globals",
                     "svi", {"train": {"samples": 1000}},
                     autoguide="AutoLowRankMultivariateNormal"),
    GlobalMethodSpec("svi-delta", "SVI, AutoDelta (MAP) over the globals", "svi",
                     {"train": {"samples": 1000}}, autoguide="AutoDelta"),
    GlobalMethodSpec("gibbs", "blocked Gibbs: all alignments given the tables, the tables "
                     "from their Dirichlet posteriors (conjugate aligners; NumPyro MCMC with a "
                     "conjugate kernel)", "mcmc",
                     {"train": {"chains": 4, "warmup": 200, "samples": 1000},
                      "wordalign": {"chains": 2, "warmup": PerCorpus(2500, 2),
                                    "samples": PerCorpus(2500, 2), "thin": 1, "track": 1000,
                                    "init_sweeps": 5, "parallel_chains": 2}},
                     kernel="Gibbs", requires="conjugate"),
    GlobalMethodSpec("vb", "mean-field variational Bayes, closed-form coordinate ascent "
                     "(conjugate aligners)", "vb",
                     {"train": {"iterations": 200, "tol": 1e-9, "samples": 1000},
                      "wordalign": {"iterations": 30, "tol": 1e-5}},
                     requires="conjugate"),
    GlobalMethodSpec("svb", "stochastic variational Bayes over minibatches (conjugate "
                     "aligners)", "svb",
                     {"wordalign": {"epochs": 5, "tau": 1.0, "kappa": 0.7}},
                     requires="conjugate"),
]}


def is_global_method(name: str) -> bool:
    return name in GLOBAL_METHODS


def global_method(name: str, command: str | None = None) -> GlobalMethodSpec:
    """The spec of ``name`` (refused when ``command`` is given and does not serve it)."""
    spec = GLOBAL_METHODS.get(name)
    if spec is None or (command is not None and not spec.serves(command)):
        valid = [n for n, m in GLOBAL_METHODS.items() if command is None or m.serves(command)]
        raise UserError(f"unknown method {name!r} for global latents; valid: "
                        f"{', '.join(valid)}")
    return spec


def global_methods_for(model_or_cls, command: str = "train") -> list[str]:
    """The methods for global latents a model can take under ``command``: all that serve it
    but those requiring a declaration the model does not make (not made is False)."""
    return [name for name, m in GLOBAL_METHODS.items() if m.serves(command)
            and (m.requires is None or getattr(model_or_cls, m.requires, False))]


def options_help(name: str, command: str) -> str:
    """``--warmup``'s help for ``command``: what it is and each method's default."""
    o = METHOD_OPTIONS[name]
    takers = [f"{m.name} {m.options[command][name]}" for m in GLOBAL_METHODS.values()
              if m.serves(command) and name in m.options[command]]
    return f"{o.help} (default: {', '.join(takers)})"
