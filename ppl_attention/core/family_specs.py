"""What each alignment family *is*, declared once for both backends: its traits (what a tool may
do with it) and its parameters with their defaults and checks.

Traits:

- ``enumerable``: the site has finite support over source positions; exact marginalization by
  enumeration (``TraceEnum_ELBO``) and exact posteriors exist;
- ``deterministic``: nothing is sampled (the weights are a function of the scores); the
  likelihood is exact;
- ``reparameterized``: draws are differentiable in the parameters (pathwise gradients);
- ``normalizes``: the site value is an unnormalized S ≥ 0 and the attention is S / Σ S (BAM);
- ``markov``: z_t depends on z_{t−1} — a chain, which a model must write as sequential sites
  (``attend`` cannot sample it); only models that declare the family support it;
- ``latent_context``: the site's value is the context vector itself (its attention weights
  are the deterministic soft ones), not a position or a point on the simplex;
- ``tree``: the site is a dependency tree over the source positions (heads ``[..., S]``, a
  :class:`~ppl_attention.pyro.trees.DependencyTree`), one per sentence, and the attention reads each
  source word with its parent and children in the tree; its scores are arc scores
  ``[..., S, S]`` and the query's word scores come as ``attention=``;
- ``segments``: the site selects source segments per query (a semi-Markov CRF over the source,
  event ``[..., T, S, max_len, 2, 2]``); its weights are their coverage, several positions per
  query, and its MAP alignment links a query to every position of its MAP selection;
- ``spans``: the site reads constituents of a latent binary tree over the source per query (a
  constituency CRF over the source whose spans are read or not, event ``[..., T, S, S, 2]``);
  its weights add each read span's average, several positions per query;
- ``selects``: the site is a selection of parts of the source per query (``segments``,
  ``spans``): its weights are linear in the selection, its MAP alignment links a query to every
  position its MAP selection reads, and calibration reads each part (a segment family's
  positions, a span family's spans) as selected or not;
- ``sparse``: the weights (a deterministic family: sparsemax, α-entmax) or the posterior q
  (``sparse-categorical``: sparsemax; a structured family with ``sparsemap=True``: SparseMAP)
  have exact zeros — the number of positions or structures with weight above 0 is a figure
  (``support`` in ``evaluate`` and ``compare``). A structured family's ``sparsemap`` makes its
  q SparseMAP's distribution over a few structures (at most ``max_active``), enumerated
  exactly by the methods that use it.

Tools and models read these attributes (``family.enumerable`` …); nothing checks a family's
name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .checks import check_bool, check_choice, check_int, check_positive
from .errors import UserError


def _positive(name):
    return lambda v: check_positive(name, v)


def _int(name, minimum):
    return lambda v: check_int(name, v, minimum)


def _bool(name):
    return lambda v: check_bool(name, v)


def _choice(name, choices):
    return lambda v: check_choice(name, v, choices)


@dataclass(frozen=True)
class FamilySpec:
    """A family's name, traits and parameters ``{name: (default, check)}``."""

    name: str
    enumerable: bool = False
    deterministic: bool = False
    reparameterized: bool = False
    normalizes: bool = False
    markov: bool = False
    latent_context: bool = False
    tree: bool = False
    segments: bool = False
    spans: bool = False
    selects: bool = False
    sparse: bool = False
    params: dict[str, tuple[object, Callable]] = field(default_factory=dict)
    #: parameters that apply only with another, boolean one on: ``{"max_active": "sparsemap"}``
    needs: dict[str, str] = field(default_factory=dict)
    #: what is known to make training with this family diverge, and what to try (the
    #: divergence message of a run quotes it)
    instability: str = ""
    #: what the alignment site's value is, with its shape (the contract's table)
    value: str = ""
    #: what ``model(batch, enumerate_z=True)`` must do for this family (the contract's table)
    enumerated: str = "never asked: no method of this family enumerates"

    def validate(self, **kwargs) -> dict:
        """The family's full configuration: every parameter checked, defaults filled in."""
        unknown = sorted(set(kwargs) - set(self.params))
        if unknown:
            raise UserError(f"family {self.name!r} has no parameter {unknown[0]!r}; its "
                            f"parameters: {', '.join(self.params) or 'none'}")
        out = {}
        for key, (default, check) in self.params.items():
            out[key] = check(kwargs.get(key, default))
        for key, switch in self.needs.items():
            if key in kwargs and not out[switch]:
                raise UserError(f"family {self.name!r}: {key} applies with {switch}=True only")
        return out

    @property
    def traits(self) -> dict[str, bool]:
        return {k: getattr(self, k) for k in ("enumerable", "deterministic", "reparameterized",
                                              "normalizes", "markov", "latent_context", "tree",
                                              "segments", "spans", "selects", "sparse")}


_BAM = {"prior": ("contextual", _choice("prior", ("contextual", "constant"))),
        "d_mid": (10, _int("d_mid", 1))}

_SEGMENTS = {"max_len": (3, _int("max_len", 1))}

_TREE = {"projective": (True, _bool("projective")), "single_root": (True, _bool("single_root"))}

#: a sampled structured family's posterior as SparseMAP's sparse distribution
_SPARSEMAP = {"sparsemap": (False, _bool("sparsemap")),
              "max_active": (10, _int("max_active", 1))}
_NEEDS = {"max_active": "sparsemap"}


def _alpha(v):
    v = check_positive("alpha", v)
    if v <= 1:
        raise UserError(f"alpha must be above 1 (α-entmax; 2 is sparsemax), got {v}")
    return v

FAMILY_SPECS: dict[str, FamilySpec] = {s.name: s for s in [
    FamilySpec("soft", deterministic=True,
               value="none: the weights softmax(scores) [B, T, S], context weights @ values"),
    FamilySpec("sparsemax", deterministic=True, sparse=True,
               value="none: the weights sparsemax(scores) [B, T, S] (exact zeros; 0 on masked "
               "positions), context weights @ values"),
    FamilySpec("entmax", deterministic=True, sparse=True,
               value="none: the weights α-entmax(scores) [B, T, S] (exact zeros for α > 1; 0 on "
               "masked positions), context weights @ values",
               params={"alpha": (1.5, _alpha), "learn_alpha": (False, _bool("learn_alpha")),
                       "n_iter": (50, _int("n_iter", 1))}),
    FamilySpec("categorical", enumerable=True,
               value="a source position z_t [B, T] (int); the context values[z_t] [..., B, T, dv]",
               enumerated="write the site with infer={'enumerate': 'parallel'} and no target_mask: "
               "its values broadcast on a new left dim [S, 1, 1] through everything after it",
               instability="a sampled categorical guide's score-function gradient has high "
               "variance (hard-sample, vae-sample): lower --lr or --clip, or enumerate "
               "(hard-enum, vae-enum)"),
    FamilySpec("sparse-categorical", enumerable=True, sparse=True,
               value="a source position z_t [B, T] (int): the prior softmax(scores) in the "
               "model, q = sparsemax(scores) in the guide (exact zeros, enumerated over its "
               "support); the context values[z_t] [..., B, T, dv]",
               enumerated="write the site with infer={'enumerate': 'parallel'} and no target_mask "
               "(as categorical): the guide's q is enumerated over its support"),
    FamilySpec("relaxed-categorical", reparameterized=True,
               value="a point of the simplex [B, T, S] (0 on masked positions)",
               params={"temperature": (0.5, _positive("temperature"))},
               instability="a low temperature makes the Concrete densities very peaked: raise "
               "the temperature or lower --lr"),
    FamilySpec("dirichlet", reparameterized=True,
               value="a point of the simplex [B, T, S] (0 on masked positions)",
               params={"concentration": (1.0, _positive("concentration")),
                       "eps": (1e-3, _positive("eps"))},
               instability="q's concentrations fall to eps as its scores spread, where the "
               "Gamma draws and their gradients are extreme: lower --lr or --clip"),
    FamilySpec("weibull", reparameterized=True, normalizes=True,
               value="unnormalized weights S [B, T, S] > 0; attention S / Σ S",
               params={"k": (10.0, _positive("k")), "beta": (1.0, _positive("beta")), **_BAM},
               instability="a large k makes the Weibull nearly deterministic and its KL to the "
               "Gamma prior steep: lower --lr, or anneal the KL longer (--anneal-rho)"),
    FamilySpec("lognormal", reparameterized=True, normalizes=True,
               value="unnormalized weights S [B, T, S] > 0; attention S / Σ S",
               params={"sigma": (0.5, _positive("sigma")),
                       "prior_sigma": (1.0, _positive("prior_sigma")), **_BAM},
               instability="a small sigma makes the LogNormal KL steep: lower --lr, or anneal "
               "the KL longer (--anneal-rho)"),
    FamilySpec("gaussian-context", reparameterized=True, latent_context=True,
               value="the context vector c [B, T, dv] itself (weights: the soft ones)",
               params={"prior": ("values-mean", _choice("prior", ("zero", "values-mean", "soft"))),
                       "prior_scale": (1.0, _positive("prior_scale")),
                       "posterior_scale": (0.1, _positive("posterior_scale"))}),
    FamilySpec("markov-categorical", enumerable=True, markov=True,
               value="a monotonic chain of positions z_1..T (written by the model through "
               "MonotonicAlignment, not by attend)",
               enumerated="sum the chain out exactly (MonotonicAlignment.log_partition as a "
               "factor): hmm-exact",
               params={"max_jump": (3, _int("max_jump", 1)), "max_back": (0, _int("max_back", 0))}),
    FamilySpec("segment-crf", deterministic=True,
               value="none: a binary CRF's marginals as weights [B, T, S]"),
    FamilySpec("segments", segments=True, selects=True, params={**_SEGMENTS, **_SPARSEMAP},
               needs=_NEEDS,
               value="a selection of source segments (phrases of at most max_len positions) per "
               "query, the event of a semi-Markov CRF [B, T, S, max_len, 2, 2]; the weights its "
               "coverage [B, T, S] (1 on every selected position), the context coverage @ values",
               instability="a sampled selection's score-function gradient has high variance: "
               "lower --lr or --clip, or use its exact marginals (segments-marginals)"),
    FamilySpec("segment-marginals", deterministic=True, segments=True, selects=True,
               params=_SEGMENTS,
               value="none: the exact coverage marginals p(position k selected) [B, T, S] of the "
               "semi-Markov selection as weights"),
    FamilySpec("spans", spans=True, selects=True, params=_SPARSEMAP, needs=_NEEDS,
               value="constituents of a binary tree over the source, each read or not, per "
               "query: the event of a constituency CRF [B, T, S, S, 2]; the weights add each "
               "read span's average [B, T, S], the context weights @ values",
               instability="a sampled tree's score-function gradient has high variance: lower "
               "--lr or --clip, or use its exact marginals (span-marginals)"),
    FamilySpec("span-marginals", deterministic=True, spans=True, selects=True,
               value="none: the exact marginal weights E[w(z)] [B, T, S] of the constituency "
               "selection"),
    FamilySpec("tree", tree=True, params={**_TREE, **_SPARSEMAP}, needs=_NEEDS,
               value="a dependency tree, heads [B, 1, S] (one per sentence, outside the target "
               "plate) or [B, T, S] (one per query); the context reads each word with its "
               "parent and children, [B, T, 3·dv]",
               enumerated="sum the tree out itself where the emission factors over arcs: a "
               "factor of pa.trees.tree_log_likelihood(prior, arc_emission_scores(batch)) under "
               "the batch plate, nothing sampled (tree-exact)",
               instability="a sampled tree's score-function gradient has high variance: lower "
               "--lr or --clip"),
    FamilySpec("tree-marginals", tree=True, deterministic=True, params=_TREE,
               value="none: the arc marginals [B, 1 or T, S, S]; the context is their "
               "expectation, [B, T, 3·dv]"),
]}


class Configured:
    """What both backends' ``Family`` base classes share: a family's parameters checked
    against its ``spec`` and kept (``_configure``), and given back as what rebuilds it
    (``_config``)."""

    spec: FamilySpec | None = None

    def _configure(self, **kwargs) -> dict:
        """Check the parameters against the spec, keep them; the full configuration (a
        parameter given as None takes its default)."""
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        cfg = self.spec.validate(**kwargs) if self.spec is not None else dict(kwargs)
        self._cfg = cfg
        return cfg

    def _config(self) -> dict:
        """The family's parameters (``type(f)(**f._config())`` rebuilds it; a parameter whose
        switch is off is left out, as if not given)."""
        cfg = dict(getattr(self, "_cfg", {}))
        needs = self.spec.needs if self.spec is not None else {}
        return {k: v for k, v in cfg.items() if not (k in needs and not cfg.get(needs[k]))}


def family_registry(base: type, module: str) -> dict[str, type]:
    """A backend's ``{name: class}`` of families, derived from :data:`FAMILY_SPECS`: the
    subclasses of ``base`` defined in ``module`` that declare their own ``spec``, in the specs'
    order. Refused (a defect of the backend, raised at its import) unless every spec has
    exactly one class there and every such class a spec of the table."""
    found: dict[str, list[type]] = {}
    todo = list(base.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        spec = cls.__dict__.get("spec")
        if spec is not None and cls.__module__ == module:
            found.setdefault(spec.name, []).append(cls)
    unknown = sorted(set(found) - set(FAMILY_SPECS))
    missing = [n for n in FAMILY_SPECS if n not in found]
    twice = sorted(n for n, c in found.items() if len(c) > 1)
    if unknown or missing or twice:
        raise RuntimeError(f"{module}: the families do not match core/family_specs.py "
                           f"(no spec: {unknown}; no class: {missing}; two classes: {twice})")
    return {name: found[name][0] for name in FAMILY_SPECS}


def family_spec(name: str) -> FamilySpec:
    try:
        return FAMILY_SPECS[name]
    except KeyError:
        raise UserError(f"unknown family {name!r}; valid: {', '.join(FAMILY_SPECS)}") from None
