"""The model contract both backends share, in pure Python: the declarations a model class makes
(with their defaults), the capabilities a tool may ask of a model, the constructor's options
recorded in ``config``, and the checks that refuse a class or a (class, method) pair before any
work. The Pyro contract (:mod:`ppl_attention.pyro.models.base`, a ``torch.nn.Module``) and the
NumPyro
contract (:mod:`ppl_attention.numpyro.models.base`, a plain class whose programs read their
parameters with ``numpyro.param``) build on it; docs/architecture.md states both in full.
"""

from __future__ import annotations

import functools
import inspect

from ..core.errors import MissingCapability, UserError
from ..core.method_specs import POSTERIORS
from ..data.kinds import DATA_KINDS

__all__ = ["DECLARATIONS", "CAPABILITIES", "BACKENDS_OF_MODELS", "declared", "model_backend",
           "RecordsConfig", "ContractBase", "capabilities", "require", "check_contract",
           "check_method", "check_shape", "check_model_class", "global_latents"]

#: a declaration → its default (docs/architecture.md, "Declarations")
DECLARATIONS = dict(data="pairs", posteriors=POSTERIORS, families=None, site="align",
                    max_plate_nesting=2, training_defaults={}, numpyro_twin=None, latents=(),
                    latent_guide=False, backend="pyro", twin_parameters={}, conjugate=False)

#: the backends a model class may be written for (its ``backend`` declaration)
BACKENDS_OF_MODELS = ("pyro", "numpyro")

#: capability → the member that provides it (for messages)
CAPABILITIES = {
    "alignment": "data = 'pairs' or 'bags' with the alignment site [B, T] over source positions",
    "exact-likelihood": "exact_token_log_likelihood(batch) -> [B, T]",
    "exact-posterior": "exact_posterior(batch) -> [B, T, S]",
    "posterior-samples": "posterior_samples(batch, num_samples, generator) -> [K, B, T]",
    "prior": "prior_probs(batch) -> [B, T, S]",
    "soft-likelihood": "soft_token_log_likelihood(batch) -> [B, T]",
    "predictive": "start_decoding / decoding_step / keep_hypotheses",
    "arc-emissions": "arc_emission_scores(batch) -> [B, 1, S, S]: log p(y | tree, x) as a sum "
                     "over the tree's arcs (its model sums the tree out when enumerate_z)",
}


def declared(model_or_cls, name: str):
    """A declaration of the contract (``data``, ``posteriors`` …), its default if not made."""
    return getattr(model_or_cls, name, DECLARATIONS[name])


def global_latents(model_or_cls) -> tuple[str, ...]:
    """The model's global latents — its ``latents`` when its guide does not sample them
    (``latent_guide = False``: the methods for global latents infer them, MCMC or an autoguide
    over the whole training set) —, or () (no latents, or latents its own guide samples, an
    amortized z as the sequence VAE's: the alignment methods train it)."""
    if declared(model_or_cls, "latent_guide"):
        return ()
    return tuple(declared(model_or_cls, "latents"))


def model_backend(model_or_cls) -> str:
    """The backend a model is written for: its ``backend`` declaration (``"pyro"`` for a
    ``torch.nn.Module``, ``"numpyro"`` for a NumPyro program)."""
    backend = declared(model_or_cls, "backend")
    if backend not in BACKENDS_OF_MODELS:
        name = getattr(model_or_cls, "__name__", type(model_or_cls).__name__)
        raise UserError(f"{name}: backend = {backend!r} is not one of "
                        f"{', '.join(BACKENDS_OF_MODELS)}")
    return backend


class RecordsConfig:
    """A base class whose subclasses record their constructor's arguments (all but ``family``)
    in ``self.config`` — what a run directory rebuilds the model from, ``cls(**config,
    family=…)``. The outermost constructor records, so a subclass of a subclass records its own
    arguments."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is None or getattr(init, "_records_config", False):
            return

        @functools.wraps(init)
        def recording_init(self, *args, **kw):
            init(self, *args, **kw)
            if type(self).__init__ is recording_init:
                bound = inspect.signature(init).bind(self, *args, **kw)
                bound.apply_defaults()
                config = {}
                for name, value in list(bound.arguments.items())[1:]:
                    param = inspect.signature(init).parameters[name]
                    if param.kind is param.VAR_KEYWORD:
                        config.update(value)
                    elif param.kind is not param.VAR_POSITIONAL and name != "family":
                        config[name] = value
                self.config = config

        recording_init._records_config = True
        cls.__init__ = recording_init


# --- capabilities -----------------------------------------------------------------------------

class ContractBase(RecordsConfig):
    """What both backends' ``AlignmentModel`` share: every declaration at its default (from
    :data:`DECLARATIONS`, the one place they are written), ``config`` recorded from the
    constructor (:class:`RecordsConfig`) and :attr:`capabilities`. A backend's base sets only
    ``backend``."""

    locals().update(DECLARATIONS)

    @property
    def capabilities(self) -> frozenset[str]:
        return capabilities(self)


def _own(model, name: str) -> bool:
    """Does the model define ``name`` itself (not only the generic implementation)?"""
    return callable(getattr(model, name, None))


def capabilities(model) -> frozenset[str]:
    """What tools this model instance supports (docs/architecture.md, "Capabilities"): a member
    the model defines, or the generic member derived from its program where its family is
    enumerable and the alignment is its only latent variable."""
    fam = getattr(model, "family", None)
    enumerable = bool(getattr(fam, "enumerable", False))
    alone = not declared(model, "latents")
    generic = enumerable and alone and not getattr(fam, "markov", False)
    caps = set()
    data = declared(model, "data")
    if data in DATA_KINDS and DATA_KINDS[data].alignments:  # pairs, bags
        caps.add("alignment")
    tree = bool(getattr(fam, "tree", False))
    if _own(model, "exact_token_log_likelihood") or generic or \
            (alone and getattr(fam, "deterministic", False)) or \
            (alone and tree and _own(model, "arc_emission_scores")):
        caps.add("exact-likelihood")
    for cap, member in (("exact-posterior", "exact_posterior"),
                        ("posterior-samples", "posterior_samples"), ("prior", "prior_probs")):
        if _own(model, member) or generic:
            caps.add(cap)
    if _own(model, "soft_token_log_likelihood"):
        caps.add("soft-likelihood")
    if all(_own(model, m) for m in ("start_decoding", "decoding_step", "keep_hypotheses")):
        caps.add("predictive")
    if tree and _own(model, "arc_emission_scores"):
        caps.add("arc-emissions")
    # a member the model defines still needs a family it applies to (a model with a Dirichlet
    # family may define exact_posterior, but no exact posterior exists)
    if not (enumerable or getattr(fam, "deterministic", False) or "arc-emissions" in caps):
        caps -= {"exact-likelihood", "exact-posterior", "posterior-samples", "prior"}
    if tree:  # a tree is no [B, T, S] alignment: its posterior is the model's tree_posterior
        caps -= {"exact-posterior", "posterior-samples", "prior"}
    if getattr(fam, "deterministic", False):
        caps -= {"exact-posterior", "posterior-samples", "prior"}
    return frozenset(caps)


def require(model, *caps: str, tool: str = "this command") -> None:
    """Raise :class:`MissingCapability` naming the first capability ``model`` lacks."""
    have = capabilities(model)
    for cap in caps:
        if cap not in have:
            fam = getattr(getattr(model, "family", None), "name", "?")
            raise MissingCapability(
                f"{tool} needs the capability {cap!r}, which {type(model).__name__} with the "
                f"{fam!r} family does not have (it is provided by {CAPABILITIES[cap]}; see "
                f"docs/architecture.md)")


def check_shape(model, member: str, value, expected: tuple[int, ...]) -> None:
    """Refuse a member's result of the wrong shape, naming the member and both shapes."""
    got = tuple(getattr(value, "shape", ()))
    if got != tuple(expected):
        raise UserError(f"{type(model).__name__}.{member} returned shape {list(got)}; the "
                        f"contract asks for {list(expected)} (docs/architecture.md)")


# --- checks -----------------------------------------------------------------------------------

def _accepts(fn, names) -> list[str]:
    """The names of ``names`` that ``fn`` cannot take as keyword arguments."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return list(names)
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return []
    return [n for n in names if n not in params]


def _options_without_default(cls, dims) -> list[str]:
    init = getattr(cls.__init__, "__wrapped__", cls.__init__)
    try:
        params = list(inspect.signature(init).parameters.values())[1:]
    except (TypeError, ValueError):
        return []
    return [p.name for p in params
            if p.name not in dims and p.name != "family" and p.default is p.empty
            and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]


def check_contract(cls, where: str = "the model") -> list[str]:
    """The problems (empty: none) of a model class against the members and declarations both
    backends' contracts ask for: a known data kind, a constructor taking the kind's dimensions
    and ``family`` with every other option defaulted, ``model`` and ``guide`` taking the
    methods' switches, ``posteriors`` among those the methods use."""
    problems = []
    try:
        model_backend(cls)
    except UserError as e:
        problems.append(str(e).split(": ", 1)[-1])
    data = declared(cls, "data")
    if data not in DATA_KINDS:
        problems.append(f"data = {data!r} is not a data kind ({', '.join(DATA_KINDS)})")
    else:
        dims = DATA_KINDS[data].dims
        missing = _accepts(cls.__init__, (*dims, "family"))
        if missing:
            problems.append(f"__init__ takes no {', '.join(missing)} (a {data!r} model is built "
                            f"as cls({', '.join(dims)}, family=…, **options))")
        no_default = _options_without_default(cls, dims)
        if no_default:
            problems.append(f"option(s) {', '.join(no_default)} of __init__ have no default (every "
                            f"option beyond the data's dimensions and family needs one)")
    for name, kws in (("model", ("enumerate_z", "kl_scale")),
                      ("guide", ("posterior", "enumerate_z", "kl_scale"))):
        fn = getattr(cls, name, None)
        if not callable(fn):
            problems.append(f"no {name}(batch, *, {', '.join(kws)}) method")
        else:
            missing = _accepts(fn, kws)
            if missing:
                problems.append(f"{name}() takes no {', '.join(missing)} keyword")
    bad = [p for p in declared(cls, "posteriors") if p not in POSTERIORS]
    if bad:
        problems.append(f"posteriors {bad} are not among {POSTERIORS}")
    return problems


def check_model_class(cls, where: str = "the model") -> None:
    """Refuse, naming every missing member, a class that does not meet the contract (a
    NumPyro model — ``backend = "numpyro"`` — is checked against the NumPyro contract's
    members, which are the same)."""
    if not isinstance(cls, type):
        raise UserError(f"{where}: {cls!r} is not a class (subclass "
                        f"ppl_attention.pyro.models.AlignmentModel or "
                        f"ppl_attention.numpyro.models.AlignmentModel; docs/architecture.md)")
    if declared(cls, "backend") == "pyro" and not _is_torch_module(cls):
        raise UserError(f"{where}: {cls!r} is not a torch.nn.Module class (subclass "
                        f"ppl_attention.pyro.models.AlignmentModel, or for a NumPyro model "
                        f"ppl_attention.numpyro.models.AlignmentModel; docs/architecture.md)")
    refuse(cls, check_contract(cls, where), where)


def _is_torch_module(cls) -> bool:
    """Is ``cls`` a ``torch.nn.Module``? (A Pyro model's module has imported torch already:
    the check loads nothing new for it, and nothing at all for a NumPyro model.)"""
    import sys

    torch = sys.modules.get("torch")
    return torch is not None and issubclass(cls, torch.nn.Module)


def refuse(cls, problems: list[str], where: str) -> None:
    if problems:
        raise UserError(f"{where}: {cls.__name__} does not meet the model contract "
                        f"(docs/architecture.md): " + "; ".join(problems))


def check_method(cls, method, family=None, where: str = "") -> None:
    """Refuse a (model class, method) pair the model cannot train: a guide posterior it does
    not offer, a family it does not support, a capability the method needs."""
    name = cls.__name__
    posteriors = declared(cls, "posteriors")
    if method.posterior not in posteriors:
        raise UserError(f"{where}method {method.name!r} needs the guide posterior "
                        f"{method.posterior!r}, which {name} does not offer (its posteriors: "
                        f"{', '.join(posteriors)})")
    spec = method.family_spec
    families = declared(cls, "families")
    if families is None and spec.tree:
        raise UserError(f"{where}method {method.name!r} attends through a dependency tree "
                        f"({spec.name}); {name} does not declare it in `families` (the tree is "
                        f"one site per sentence, written outside the target plate with "
                        f"attention=; docs/architecture.md)")
    if families is None and spec.markov:
        raise UserError(f"{where}method {method.name!r} samples a Markov chain of alignments "
                        f"({spec.name}); {name} does not declare it in `families` (a chain needs "
                        f"sequential sites, which pa.attend cannot write)")
    if families is not None and spec.name not in families:
        raise UserError(f"{where}method {method.name!r} uses the {spec.name!r} family; {name} "
                        f"supports {', '.join(families)}")
    if family is not None and getattr(family, "spec", None) is not None:
        built = family._config()
        if spec.name != family.name or any(built.get(k, v) != v
                                           for k, v in method.family_options.items()):
            want = ", ".join(f"{k}={v!r}" for k, v in method.family_options.items())
            has = ", ".join(f"{k}={v!r}" for k, v in built.items())
            raise UserError(f"{where}method {method.name!r} trains the {spec.name!r} family"
                            f"{f' ({want})' if want else ''}; the {name} was built with "
                            f"{type(family).__name__}({has}) — build it with "
                            f"family=get_method({method.name!r}).family()")
    for cap in method.requires:
        member = {"soft-likelihood": "soft_token_log_likelihood",
                  "arc-emissions": "arc_emission_scores"}[cap]
        if not callable(getattr(cls, member, None)):
            raise MissingCapability(f"{where}method {method.name!r} needs the capability "
                                    f"{cap!r} ({CAPABILITIES[cap]}), which {name} does not have")


# --- the contract as tables (docs/architecture.md, generated) ---------------------------------


TABLE_START = ("<!-- contract-tables: generated by `python -m ppl_attention.common.contract "
               "--write docs/architecture.md`; tests/pyro/test_contract.py checks it -->")
TABLE_END = "<!-- end of contract-tables -->"

#: what a member providing a capability must return, per kind of family
_RETURNS = {
    "exact-likelihood": "categorical: log Σ_j p(y_t, z_t = j | x, y<t) [B, T], 0 on padding; "
                        "a tree with arc emissions: the sentence's log p(y | x) on its first "
                        "token (generic: the model's own enumerate_z=True program)",
    "soft-likelihood": "log p(y_t | x, y<t) of the soft-attention model, [B, T], 0 on padding: "
                       "the REINFORCE baseline",
    "arc-emissions": "φ [B, 1, S, S], φ[h, m] = log p(the tokens word m emits | m's head is h), "
                     "the diagonal for the root; the model sums the tree out with "
                     "enumerate_z=True",
}


def _row(cells) -> str:
    """A markdown table row (a ``|`` inside a cell escaped)."""
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def _call(name: str, **kw) -> str:
    return f"`{name}(batch, " + ", ".join(f"{k}={v}" for k, v in kw.items()) + ")`"


def method_rows(spec) -> list[str]:
    """One method's cells: family, the model's call, the guide's call, the members it needs."""
    fam = spec.family_spec
    kl = "η·λ(t)" if spec.anneal_rho is not None else "η"
    model = _call("model", enumerate_z=spec.enumerate_model,
                  kl_scale=kl if not fam.deterministic else "1.0")
    if spec.posterior == "none":
        guide = "— (not called)"
    else:
        kw = dict(posterior=f'"{spec.posterior}"', enumerate_z=spec.enumerate_guide,
                  kl_scale=kl)
        if spec.baseline:
            kw["baseline"] = "[B, T]"
        guide = _call("guide", **kw)
    needs = [f"`{CAPABILITIES[c].split(' ->')[0]}`" for c in spec.requires]
    if fam.markov or fam.tree:
        needs.append(f'`families` naming "{fam.name}"')
    if spec.posterior != "none":
        needs.append(f'`posteriors` with "{spec.posterior}"')
    return [f"`{spec.name}`", f"`{fam.name}`", model, guide, "; ".join(needs) or "—"]


def contract_tables() -> str:
    """The contract as markdown, from the method registry, the family specs and the
    capabilities: what each method calls and needs, what each family's site holds and what
    ``enumerate_z=True`` asks of the model, what each capability's member returns."""
    from ..core.family_specs import FAMILY_SPECS
    from ..core.method_specs import METHOD_SPECS

    lines = [TABLE_START, "",
             "**What each method calls and needs.** Every method calls the model's `model` and, "
             "unless it has no guide, its `guide`, with these switches; the last column is what "
             "the model must offer beyond them (a method whose needs a model lacks is refused "
             "before any work, naming the member). η is `--kl-weight`, λ(t) BAM's annealing.", "",
             "| method | family | model is called as | guide is called as | the model needs |",
             "|---|---|---|---|---|"]
    for spec in METHOD_SPECS.values():
        lines.append(_row(method_rows(spec)))
    lines += ["", "**What each family's site holds, and what `enumerate_z=True` asks.** The "
              "value `attend` returns (and the site records) for each family; a method whose "
              "family enumerates calls `model(batch, enumerate_z=True)` (and the generic exact "
              "members of an enumerable family do too): the last column is what the model must "
              "do then. A deterministic family's likelihood is read from "
              "`model(batch, enumerate_z=False)`, the program as it stands.", "",
              "| family | traits | the site's value | `enumerate_z=True` asks the model to |",
              "|---|---|---|---|"]
    for f in FAMILY_SPECS.values():
        traits = ", ".join(k for k, v in f.traits.items() if v) or "—"
        lines.append(_row([f"`{f.name}`", traits, f.value, f.enumerated]))
    lines += ["", "**What each capability's member returns** (optional members; the tools that "
              "need one refuse a model without it, naming it).", "",
              "| capability | member | returns |", "|---|---|---|"]
    for cap, member in CAPABILITIES.items():
        name, _, ret = member.partition(" -> ")
        lines.append(_row([f"`{cap}`", f"`{name}`", _RETURNS.get(cap, ret or "—")]))
    lines += ["", TABLE_END]
    return "\n".join(lines)


def _write_tables(path: str) -> None:
    from pathlib import Path

    text = Path(path).read_text()
    if TABLE_START not in text or TABLE_END not in text:
        raise SystemExit(f"{path}: no contract-tables markers")
    head, rest = text.split(TABLE_START, 1)
    tail = rest.split(TABLE_END, 1)[1]
    Path(path).write_text(head + contract_tables() + tail)


if __name__ == "__main__":  # python -m ppl_attention.common.contract --write docs/architecture.md
    import sys

    if sys.argv[1:2] == ["--write"] and len(sys.argv) == 3:
        _write_tables(sys.argv[2])
    else:
        print(contract_tables())
