"""Device correctness of the torch side, proven without a GPU: every program runs on PyTorch's
``meta`` device.

A meta tensor has a shape, a dtype and a device but no values. The models' parameters are moved
with ``.to("meta")`` and the batches' tensors put on ``meta``; a tensor that a program makes
without taking its device from its inputs (``torch.arange(B)``) lands on the CPU, and the first
operation mixing it with a meta tensor raises "… is not on the expected device meta", as it
would next to CUDA tensors. Two such tensors slip past that check, as they pass on CUDA: one
used only as an index (CUDA copies it over, at a synchronization per call) and a zero-dimensional
one. A second net, :class:`CpuTensorGuard` (a ``TorchFunctionMode``), raises when a torch
function called from the project's own code (``ppl_attention/``, ``examples/``) returns a CPU
tensor while a program runs.

What runs on meta:

- every built-in torch model of ``common/registry.py`` (``seq2seq``, ``seq-vae`` — its GRU and
  its Transformer configuration —, ``bam-classifier``, ``gat``) and the tutorial's
  ``DiagonalAlignment`` × every method it supports (``check_method``): the model and guide
  programs with the method's switches (``inference.methods.programs``), traced by the method's
  own ELBO (``elbo._get_traces``: its enumeration, its vectorized particles, its score-function
  parts), the mean-field methods' closed-form KLs; for the first method of each family of a
  model (what follows depends on the family only) also the gradient of the summed
  log-densities, and the capabilities the model has with that family (exact likelihood, exact
  posterior, posterior draws, prior, soft likelihood, the decoding members, ``evaluate``'s IWAE
  weights);
- ``Seq2SeqAlignment.markov_model_enumerated``, the Markov chain as sequential enumerated sites;
- every family of ``families.py`` through ``pa.attend``, prior and guide side (the BAM prior
  network also built on first use), the Markov chain's transition tables;
- ``structured.MonotonicAlignment`` on both paths: log_partition, token_log_likelihood,
  marginals, viterbi, sample, log_prob.

What needs values is switched off or replaced: Pyro's validation, which also gates the
project's own checks of values (finite scores, empty rows, labels in range), and torch's
``validate_args`` (a fixture, restored after); packing a padded batch, whose lengths
``pack_padded_sequence`` takes on the CPU on every device (``models.rnn.run_packed`` is replaced
by the same RNN over the padding: the same shapes). The paths that cannot run on meta at all are
the explicitly marked parameters of :func:`test_what_cannot_run_on_meta` (strict xfail: each
must fail for the reason given, so a change that lets one run shows up): the values of Pyro's
ELBOs (``torch_item``; TraceEnum's Dice reads ``mask.all()``) — hence the traces above rather
than ``differentiable_loss`` —, ``AttentionSeqVAE.generate`` (it stops once every sequence has
ended) and ``latent_diagnostics`` (numbers for a report), the gradient of a Dirichlet draw
(torch has no meta kernel for ``_standard_gamma_grad``; the Dirichlet rows run without it), and
a sparse q whose support is found from the scores' values (sparsemax's enumerated support,
SparseMAP's active set: ``sparse-marginal``, ``hard-sparse``, ``*-sparsemap`` are left out of
the matrix above and not proven on meta: their tensors take device and dtype from the scores'
by the structures' ``ops``, as every structure's do).

Planted, once each (``python tests/plant_faults.py dev1 dev2`` replays them; both restored):
dev1, ``torch.arange(B, device=emis.device)`` → ``torch.arange(B)`` in
``Seq2SeqAlignment.markov_model_enumerated`` (an index only: meta alone lets it pass); caught by
test_the_markov_chain_as_sequential_sites_on_meta, "seq2seq.py:322: arange made a CPU tensor
next to meta inputs". dev2, ``device=h.device`` removed from the attention mask of
``BAMClassifier.network``; caught by test_every_model_and_method_on_meta[bam-classifier-soft,
-bam-weibull, -bam-lognormal], "bam_classifier.py:140: ones made a CPU tensor …"; without the
guard, by the meta device itself: "Tensor on device meta is not on the expected device cpu!".
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pyro
import pytest
import torch
from pyro import poutine
from pyro.infer import TraceMeanField_ELBO
from pyro.poutine.util import site_is_subsample
from torch.distributions import kl_divergence
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

import ppl_attention as pa
import ppl_attention.pyro.models.rnn as rnn
from ppl_attention.common.registry import MODELS, load_model_class
from ppl_attention.core.errors import UserError
from ppl_attention.core.method_specs import METHOD_SPECS
from ppl_attention.data import Vocab, make_batches
from ppl_attention.data.digits import ImageBatch
from ppl_attention.data.graphs import Graph
from ppl_attention.data.kinds import DATA_KINDS
from ppl_attention.pyro.families import FAMILIES, MarkovCategorical
from ppl_attention.pyro.inference.evaluate import log_importance_weights
from ppl_attention.pyro.inference.methods import differentiable_loss, get_method, programs
from ppl_attention.pyro.models import base
from ppl_attention.pyro.models.seq_vae_diagnostics import latent_diagnostics
from ppl_attention.pyro.structured import MonotonicAlignment

ROOT = Path(__file__).resolve().parents[2]
PROJECT = (str(Path(pa.__file__).parent), str(ROOT / "examples"))  # wherever it is imported from
TORCH = str(Path(torch.__file__).parent)
META = torch.device("meta")
TUTORIAL = f"{ROOT / 'examples' / 'tutorial' / 'diagonal.py'}:DiagonalAlignment"


# --- the detector ------------------------------------------------------------------------------

class CpuTensorGuard(TorchFunctionMode):
    """Raise when a torch function called from a file under ``roots`` returns a CPU tensor."""

    def __init__(self, roots=PROJECT):
        super().__init__()
        self.roots = roots

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        leaves = tree_leaves(out)
        if any(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in leaves):
            where = self._caller()
            if where:
                name = getattr(func, "__name__", str(func))
                raise AssertionError(f"{where}: {name} made a CPU tensor next to meta inputs "
                                     f"(take the device from the inputs)")
        return out

    def _caller(self) -> str | None:
        """``file:line`` of the code that called torch, when it is under ``roots``."""
        frame = sys._getframe(2)
        while frame is not None:
            file = frame.f_code.co_filename
            if frame.f_code not in _GUARD_CODE and not file.startswith(TORCH):
                return f"{file}:{frame.f_lineno}" if file.startswith(self.roots) else None
            frame = frame.f_back
        return None


_GUARD_CODE = {CpuTensorGuard.__torch_function__.__code__, CpuTensorGuard._caller.__code__}


def _unpacked(module, inputs, mask):
    """``run_packed`` on meta: the RNN over the padding too (no lengths to pack by)."""
    return module(inputs)[0].masked_fill(~mask.unsqueeze(-1), 0.0)


@pytest.fixture
def meta(monkeypatch):
    """Validation off (it reads values), packing replaced, all restored after; the guard to
    enter around the programs (data and models are made on the CPU, then moved)."""
    pyro_validation = pyro.infer.util.is_validation_enabled()
    torch_validation = torch.distributions.Distribution._validate_args
    pyro.enable_validation(False)
    torch.distributions.Distribution.set_default_validate_args(False)
    packed = rnn.run_packed
    for module in list(sys.modules.values()):
        if getattr(module, "run_packed", None) is packed and \
                getattr(module, "__name__", "").startswith("ppl_attention"):
            monkeypatch.setattr(module, "run_packed", _unpacked)
    try:
        yield CpuTensorGuard()
    finally:
        pyro.enable_validation(pyro_validation)
        torch.distributions.Distribution.set_default_validate_args(torch_validation)


def _all_meta(*outputs) -> None:
    for t in tree_leaves(outputs):
        if isinstance(t, torch.Tensor):
            assert t.device == META, f"a result on {t.device}"


def test_the_detectors_catch_a_planted_cpu_tensor(meta):
    """A planted ``torch.arange(B)`` without a device: next to a meta tensor it raises; used as
    an index only, meta lets it pass and the guard raises. With the device, neither does."""
    x = torch.ones(3, 2, device=META)

    def scaled(x, device=None):
        return x * torch.arange(x.shape[0], device=device)[:, None]

    def gathered(x, device=None):
        return x[torch.arange(x.shape[0], device=device), 0]

    with pytest.raises(RuntimeError, match="expected device meta|is on cpu|not on the expected"):
        scaled(x)
    with CpuTensorGuard(roots=(__file__,)):  # this file's code counts as the project's here
        with pytest.raises(AssertionError, match="arange made a CPU tensor"):
            gathered(x)
        _all_meta(scaled(x, x.device), gathered(x, x.device))
    _all_meta(gathered(x))  # meta alone: passes


# --- tiny data and models ----------------------------------------------------------------------

PAIRS = [(["a", "b", "c"], ["x"]), (["d"], ["z", "x"])]  # padding on both sides


def _pairs_case():
    sv = Vocab.build(s for s, _ in PAIRS)
    tv = Vocab.build(t for _, t in PAIRS)
    (b,) = make_batches(PAIRS, sv, tv, 2)
    return (len(sv), len(tv)), b


def _sequences_case():
    seqs = [s for s, _ in PAIRS]
    v = Vocab.build(seqs)
    (b,) = make_batches([(s, s) for s in seqs], v, v, 2)
    return (len(v),), b


def _images_case():
    g = torch.Generator().manual_seed(0)
    return (4, 3, 3), ImageBatch(torch.randn(2, 4, 3, generator=g), torch.tensor([0, 2]))


def _graph_case():
    adjacency = torch.zeros(5, 5, dtype=torch.bool)
    adjacency[[0, 1, 2, 3], [1, 2, 3, 4]] = True
    adjacency |= adjacency.T.clone()
    mask = torch.tensor([True, True, False, True, False])
    g = Graph(torch.randn(5, 3, generator=torch.Generator().manual_seed(0)), adjacency,
              torch.tensor([0, 1, 1, 0, 1]), mask, ~mask, 2)
    return (3, 2), g


CASES = {"pairs": _pairs_case, "sequences": _sequences_case, "images": _images_case,
         "graph": _graph_case}
TINY = {  # the smallest options of each model
    "seq2seq": {"hidden": 4},
    "seq-vae": {"hidden": 4, "latent": 2, "heads": 2, "max_len": 8},
    "seq-vae-transformer": {"hidden": 4, "latent": 2, "heads": 2, "max_len": 8,
                            "encoder": "transformer", "decoder": "transformer", "z_slots": 2},
    "bam-classifier": {"d": 4, "heads": 2, "layers": 1},
    "gat": {"hidden": 2, "heads": 2},
    "tutorial": {"dim": 4},
}
CLASSES = {name: MODELS[name].target for name in ("seq2seq", "seq-vae", "bam-classifier", "gat")}
CLASSES.update({"seq-vae-transformer": MODELS["seq-vae"].target, "tutorial": TUTORIAL})
assert {e.name for e in MODELS.values()
        if not e.target.startswith("ppl_attention.numpyro.")} <= set(CLASSES)  # torch models


def _supported(cls, method):
    try:
        base.check_method(cls, get_method(method))
    except UserError:
        return False
    return True


def _matrix():
    """(model, method, first): ``first`` for the first method of each family of a model, which
    also differentiates and runs the capabilities (they depend on the family only)."""
    for name, target in CLASSES.items():
        cls, families = load_model_class(target), set()
        for method in METHOD_SPECS:
            family = get_method(method).family_spec
            if name == "seq-vae-transformer" and not family.deterministic:
                continue  # the Transformer decoder's attention is soft only (refused otherwise)
            if _support_from_values(method):
                continue  # see test_what_cannot_run_on_meta
            if _supported(cls, method):
                yield pytest.param(name, method, family.name not in families,
                                   id=f"{name}-{method}")
                families.add(family.name)


def _support_from_values(method: str) -> bool:
    """A sparse q (sparsemax's support, SparseMAP's active set) whose size is read from the
    scores' values: its shapes are not known on meta."""
    spec = METHOD_SPECS[method]
    return spec.family_spec.sparse and not spec.family_spec.deterministic or \
        bool(spec.family_kwargs().get("sparsemap"))


def _model_on_meta(name: str, method: str):
    cls = load_model_class(CLASSES[name])
    dims, batch = CASES[base.declared(cls, "data")]()
    torch.manual_seed(0)
    model = cls(*dims, family=get_method(method).family(), **TINY[name])
    return model.to(META), batch.to(META)  # every data kind's batch has .to(device)


# --- every model × method ----------------------------------------------------------------------

def _method_traces(model, batch, method, gradient=True):
    """The method's model and guide programs traced by its ELBO on ``batch``; the summed
    log-densities (and the closed-form KLs of a mean-field method), differentiated."""
    m = get_method(method)
    step = getattr(model, "step_arguments", lambda step: {})(0)
    p, q = programs(m, model, batch, kl=0.5, step_kwargs=step)
    elbo = m.elbo(base.declared(model, "max_plate_nesting"))
    total = 0.0
    for model_trace, guide_trace in elbo._get_traces(p, q, (batch,), {}):
        for trace, sign in ((model_trace, 1.0), (guide_trace, -1.0)):
            for site in trace.nodes.values():
                if site["type"] == "sample" and not site_is_subsample(site):
                    if (site.get("infer") or {}).get("relaxed") or \
                            (sign > 0 and "log_prob" not in site):  # a relaxed draw: its KL only
                        _all_meta(site["value"])
                        continue
                    _all_meta(site["value"], site["log_prob"])
                    total = total + sign * site["log_prob_sum"]
        if isinstance(elbo, TraceMeanField_ELBO):
            for name, site in guide_trace.nodes.items():
                if site["type"] == "sample" and name in model_trace.nodes:
                    kl = kl_divergence(site["fn"], model_trace.nodes[name]["fn"])
                    _all_meta(kl)
                    total = total + kl.sum()
    if gradient:
        params = [p for p in model.parameters() if p.requires_grad]
        _all_meta(torch.autograd.grad(total, params, allow_unused=True))


def _capabilities(model, batch, method):
    """Every capability member the model has with this family, on ``batch``."""
    caps = base.capabilities(model) if DATA_KINDS[base.declared(model, "data")].token_data \
        else set()  # images and graphs: the model's own report (extra_report), not these
    out = []
    if "exact-likelihood" in caps:
        out.append(base.exact_token_log_likelihood(model, batch))
    if "exact-posterior" in caps:
        out.append(base.exact_posterior(model, batch))
    if "posterior-samples" in caps:
        out.append(base.posterior_samples(model, batch, 3))
    if "prior" in caps:
        out.append(base.prior_probs(model, batch))
    if "soft-likelihood" in caps:
        out.append(model.soft_token_log_likelihood(batch))
    if "predictive" in caps:
        out.extend(_decoding(model, batch))
    if DATA_KINDS[base.declared(model, "data")].token_data and "exact-likelihood" not in caps:
        run = type("Run", (), {"model": model, "method": method})  # evaluate's IWAE bound
        out.append(log_importance_weights(run, batch, k=2))
    _all_meta(*out)


def _decoding(model, batch):
    """Two steps of beam decoding's member calls: one hypothesis, then two."""
    st = model.start_decoding(batch.src[:1], batch.src_mask[:1])
    bos = torch.full((1,), 2, dtype=torch.long, device=batch.src.device)
    logp, st = model.decoding_step(st, bos)
    rows = torch.zeros(2, dtype=torch.long, device=batch.src.device)
    st = model.keep_hypotheses(st, rows, rows + 4)
    logp2, st = model.decoding_step(st, rows + 4)
    return logp, logp2


@pytest.mark.parametrize("name, method, first", list(_matrix()))
def test_every_model_and_method_on_meta(meta, name, method, first):
    model, batch = _model_on_meta(name, method)
    model.train()
    with meta:  # the Dirichlet sampler's gradient: see test_what_cannot_run_on_meta
        _method_traces(model, batch, method, gradient=first and method != "dirichlet")
    if first:
        model.eval()
        with meta, torch.no_grad():
            _capabilities(model, batch, method)


def test_the_markov_chain_as_sequential_sites_on_meta(meta):
    """``markov_model_enumerated`` — T enumerated sites under ``pyro.markov`` — traced by
    TraceEnum_ELBO's own enumeration."""
    model, batch = _model_on_meta("seq2seq", "hmm-exact")
    elbo = get_method("hmm-exact").elbo()
    with meta:
        for model_trace, _ in elbo._get_traces(model.markov_model_enumerated, lambda b: None,
                                               (batch,), {}):
            sites = [s for s in model_trace.nodes.values() if s["type"] == "sample"]
            assert len(sites) == 2 * batch.tgt_out.shape[1]
            _all_meta(*[s["log_prob"] for s in sites])


# --- families, the monotonic chain ------------------------------------------------------------

B, T, S, D = 2, 3, 4, 5


def _scores():
    mask = torch.ones(B, S, dtype=torch.bool, device=META)
    return (torch.empty(B, T, S, device=META), torch.empty(B, S, D, device=META), mask,
            torch.ones(B, T, dtype=torch.bool, device=META))


ATTENDED = [n for n, cls in FAMILIES.items()
            if not cls.markov and not cls.tree and n != "sparse-categorical"]


@pytest.mark.parametrize("guide", [False, True], ids=["prior", "guide"])
@pytest.mark.parametrize("name", ATTENDED + ["weibull-lazy-prior-net", "lognormal-constant"])
def test_every_family_through_attend_on_meta(meta, name, guide):
    """Each family's site, traced (and enumerated where it can be), its log-density, context
    and weights on meta; BAM's prior network also built on first use, on the keys' device."""
    family = {"weibull-lazy-prior-net": lambda: pa.Weibull(),
              "lognormal-constant": lambda: pa.LogNormal(prior="constant")}.get(
        name, lambda: pa.make_family(name, key_dim=D))().to(META)
    scores, values, mask, target_mask = _scores()
    scale = torch.empty(B, T, D, device=META) if name == "gaussian-context" else None

    def program(enumerate_z=False):
        with pyro.plate("batch", B, dim=-2), pyro.plate("target", T, dim=-1):
            return pa.attend("align", scores, values, family, mask=mask, guide=guide,
                             target_mask=None if enumerate_z else target_mask, scale=scale,
                             infer={"enumerate": "parallel"} if enumerate_z else None)

    with meta:
        trace = poutine.trace(program).get_trace()
        trace.compute_log_prob()
        _all_meta(program(), [s["log_prob"] for s in trace.nodes.values()
                              if s["type"] == "sample" and not site_is_subsample(s)])
        if family.enumerable:
            enumerated = poutine.trace(poutine.enum(program, first_available_dim=-3))
            _all_meta(enumerated.get_trace(enumerate_z=True).nodes["align"]["value"])


@pytest.mark.parametrize("guide", [False, True], ids=["prior", "guide"])
@pytest.mark.parametrize("name", [n for n, cls in FAMILIES.items() if cls.tree])
def test_tree_families_through_attend_on_meta(meta, name, guide):
    """A tree family's site (one tree per source, inside the batch plate only), its
    log-density, context and weights on meta; the tree's marginals, MAP and draws too."""
    family = pa.make_family(name).to(META)
    scores, values, mask, _ = _scores()
    arcs = torch.empty(B, 1, S, S, device=META)

    def program():
        with pyro.plate("batch", B, dim=-2):
            return pa.attend("align", arcs, values, family, mask=mask, guide=guide,
                             attention=scores)

    with meta:
        trace = poutine.trace(program).get_trace()
        trace.compute_log_prob()
        _all_meta(program(), [s["log_prob"] for s in trace.nodes.values()
                              if s["type"] == "sample" and not site_is_subsample(s)])
        tree = family.tree_distribution(arcs, mask)
        _all_meta(tree.log_partition, tree.marginals, tree.entropy(), tree.argmax(),
                  tree.sample((2,)))


def test_the_markov_familys_tables_on_meta(meta):
    family = MarkovCategorical(max_jump=2, max_back=1).to(META)
    scores, _, mask, target_mask = _scores()
    prev = torch.zeros(B, dtype=torch.long, device=META)
    with meta:
        _all_meta(family.start_log_probs(scores[:, 0], mask),
              family.transition_log_probs(scores[:, 1], mask, prev),
              family.transition_matrix(scores[:, 1], mask),
              family.dense_chain(scores, mask, scores, target_mask).log_partition,
              family.alignment_distribution(scores, mask, scores, target_mask).log_partition())


@pytest.mark.parametrize("method", ["sequential", "parallel"])
def test_the_monotonic_alignment_on_meta(meta, method):
    W = 3
    chain = MonotonicAlignment(torch.empty(B, S, device=META),
                               torch.empty(B, T, S, W, device=META),
                               torch.empty(B, T, S, device=META),
                               torch.ones(B, T, dtype=torch.bool, device=META), 1, method)
    z = torch.zeros(B, T, dtype=torch.long, device=META)
    with meta:
        _all_meta(chain.log_partition(), chain.token_log_likelihood(), chain.marginals(),
                  chain.viterbi(), chain.sample(3), chain.log_prob(z))


# --- what cannot run on meta, said explicitly -------------------------------------------------

def _elbo_value(method):
    def run(guard):
        model, batch = _model_on_meta("seq2seq", method)
        m = get_method(method)
        with guard:
            differentiable_loss(m, m.elbo(), model, batch, 0)
    return run


def _generate(guard):
    model, _ = _model_on_meta("seq-vae", "soft")
    with guard:
        model.generate(torch.empty(2, 2, device=META), bos=2, eos=3, max_len=3)


def _latent_diagnostics(guard):
    """Not under the guard: it draws its noise on a CPU generator on purpose (the same numbers
    on every device), then moves it."""
    model, batch = _model_on_meta("seq-vae", "soft")
    latent_diagnostics(model, [batch], iwae_k=2)


def _dirichlet_gradient(guard):
    model, batch = _model_on_meta("seq2seq", "dirichlet")
    with guard:
        _method_traces(model, batch, "dirichlet", gradient=True)


def _sparse_support(method):
    def run(guard):
        model, batch = _model_on_meta("seq2seq", method)
        with guard:
            _method_traces(model, batch, method, gradient=False)
    return run


def _cannot(what, id, error, message, reason):
    """A path that cannot run on meta: it must fail with ``error`` saying ``message``."""
    return pytest.param(what, error, message, id=id, marks=pytest.mark.xfail(
        raises=error, strict=True, reason=f"{reason}: {message}"))


NEEDS_VALUES = "Tensor.item() cannot be called on meta tensors"
UNREACHABLE = [
    _cannot(_elbo_value("soft"), "Trace_ELBO-value", RuntimeError, NEEDS_VALUES,
            "Pyro's torch_item reads the loss"),
    _cannot(_elbo_value("exact"), "TraceEnum_ELBO-value", RuntimeError, NEEDS_VALUES,
            "Pyro's Dice reads mask.all()"),
    _cannot(_generate, "seq-vae-generate", RuntimeError, NEEDS_VALUES,
            "generation stops once every sequence has ended"),
    _cannot(_latent_diagnostics, "seq-vae-latent-diagnostics", RuntimeError, NEEDS_VALUES,
            "numbers for a report"),
    _cannot(_dirichlet_gradient, "dirichlet-rsample-gradient", NotImplementedError,
            "aten::_standard_gamma_grad", "no meta kernel for the Gamma sampler's gradient"),
    _cannot(_sparse_support("sparse-marginal"), "sparsemax-support", RuntimeError, NEEDS_VALUES,
            "q's enumerated support is as wide as the widest row's count of non-zeros"),
    _cannot(_sparse_support("tree-sparsemap"), "sparsemap-active-set", RuntimeError,
            NEEDS_VALUES, "SparseMAP's active-set loop stops on the values of its gaps"),
]


@pytest.mark.parametrize("what, error, message", UNREACHABLE)
def test_what_cannot_run_on_meta(meta, what, error, message):
    with pytest.raises(error, match=re.escape(message)) as err:
        what(meta)
    raise err.value  # the expected failure, reported as such
