"""BAMClassifier: a Transformer-encoder classifier whose every attention head is a ``pa.attend``
site (Fan et al. 2020's Bayesian Attention Modules on a plain classifier).

    tokens x [B, N, f] ──Linear──► + positions, a [CLS] token prepended  → h⁰ [B, N+1, d]
    layer l:  Q, K, V = heads(h) [B, H, N+1, d/H];  e = QKᵀ/√(d/H)
              W ~ family(e) at site "attn_l" (Soft: softmax(e); Weibull / LogNormal: BAM)
              h = LN(h + Wo(W V));  h = LN(h + FF(h))
    y ~ Categorical(Linear(h_CLS))                                   site "y"

Guide (BAM, ``posterior="prior"``): each layer's weights from q(W | e), the family's posterior
at the *same* scores (mean softmax(e)); the prior is the family's (contextual: key-dependent
Gamma / LogNormal mean, or constant: uniform mean). The family comes from the method (``soft``,
``bam-weibull``, ``bam-lognormal``); the attention sites' KL terms are weighted by
η·sigmoid(t·ρ − 6) (BAM's annealing; this model's defaults η = 10⁻³, ρ = 0.01) while training.
Prediction: ``mode="mean"`` uses the deterministic mean weights softmax(e) (BAM at test time);
``mode="sample"`` draws the weights from q (posterior sampling, for uncertainty).
"""

from __future__ import annotations

import contextlib
import math

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import torch
from pyro.infer.util import is_validation_enabled
from torch import nn

from ...core.checks import check_choice
from ...core.errors import UserError
from ..attend import attend
from ..families import Family, make_family, masked_softmax
from .base import AlignmentModel

__all__ = ["BAMClassifier", "attend_by_mode", "layer_family", "predict_probs", "label_report"]

BAM_FAMILIES = ("soft", "weibull", "lognormal")


def layer_family(family, prior: str, key_dim: int) -> Family:
    """A fresh copy of ``family`` for one attention layer, its BAM prior set to ``prior``
    (contextual or constant) and its prior network sized for ``key_dim``."""
    family = make_family(family)
    cfg = family._config()
    if "prior" in cfg:
        cfg["prior"] = check_choice("prior", prior, ("contextual", "constant"))
    return make_family(type(family), key_dim=key_dim, **cfg)


def attend_by_mode(name: str, scores, values, family, mask, keys, mode: str, plates=(),
                   scale=None):
    """The context of one stochastic-attention layer in each mode of a BAM network: ``"mean"``
    (the deterministic mean weights softmax(e), BAM at test time — also every deterministic
    family), ``"sample"`` (weights drawn from q, outside any Pyro trace: posterior sampling for
    uncertainty), ``"model"`` / ``"guide"`` (the site ``name`` under ``plates``, KL-weighted by the
    ``scale`` handler)."""
    if mode == "mean" or family.deterministic:
        return masked_softmax(scores, mask) @ values
    if mode == "sample":
        w = family.posterior(scores, mask, values).rsample()
        return family.weights(w, scores, mask) @ values
    with contextlib.ExitStack() as stack:
        for p in plates:
            stack.enter_context(p)
        stack.enter_context(scale or contextlib.nullcontext())
        ctx, _ = attend(name, scores, values, family, mask=mask, keys=keys, guide=mode == "guide")
    return ctx


class BAMClassifier(AlignmentModel):
    """Args: ``n_tokens`` and ``token_dim`` of an input ``[B, n_tokens, token_dim]``,
    ``n_classes``; ``d`` model width, ``heads``, ``layers``; ``family`` of every head (soft,
    weibull or lognormal; from the method) and its BAM ``prior`` (contextual or constant)."""

    data = "images"
    posteriors = ("none", "prior")
    families = BAM_FAMILIES
    max_plate_nesting = 3
    training_defaults = {"lr": 3e-3, "steps": 1500, "kl_weight": 1e-3, "anneal_rho": 0.01}
    option_help = {"d": "model width", "heads": "attention heads per layer",
                   "layers": "Transformer-encoder layers",
                   "prior": "BAM prior of the attention weights: contextual or constant"}

    def __init__(self, n_tokens: int, token_dim: int, n_classes: int, d: int = 32,
                 heads: int = 2, layers: int = 2, family: Family | str | None = "soft",
                 prior: str = "contextual"):
        super().__init__()
        for name, value in (("d", d), ("heads", heads), ("layers", layers)):
            if not isinstance(value, int) or value < 1:
                raise UserError(f"{name} must be a positive int, got {value!r}")
        if d % heads:
            raise UserError(f"d ({d}) must be divisible by heads ({heads})")
        self.heads, self.dh = heads, d // heads
        self.embed = nn.Linear(token_dim, d)
        self.pos = nn.Parameter(0.02 * torch.randn(n_tokens + 1, d))
        self.cls = nn.Parameter(0.02 * torch.randn(d))
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(layers))
        self.out = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.ff = nn.ModuleList(nn.Sequential(nn.Linear(d, 2 * d), nn.ReLU(), nn.Linear(2 * d, d))
                                for _ in range(layers))
        self.ln1 = nn.ModuleList(nn.LayerNorm(d) for _ in range(layers))
        self.ln2 = nn.ModuleList(nn.LayerNorm(d) for _ in range(layers))
        self.layer_families = nn.ModuleList(layer_family(family, prior, self.dh)
                                      for _ in range(layers))
        self.head = nn.Linear(d, n_classes)

    @property
    def family(self) -> Family:
        """The family of every head (each layer holds its own copy)."""
        return self.layer_families[0]

    @property
    def stochastic(self) -> bool:
        return not self.family.deterministic

    def check_input(self, x: torch.Tensor) -> None:
        c = self.config
        if x.dim() != 3 or x.shape[1:] != (c["n_tokens"], c["token_dim"]):
            raise UserError(f"input must be [B, {c['n_tokens']}, {c['token_dim']}] "
                             f"(tokens × features), got {list(x.shape)}")
        if is_validation_enabled() and not torch.isfinite(x).all():  # reads the values
            raise UserError("input has NaN or infinite values")

    def _plates(self, x):
        """The plates of the attention sites (one object each, reused across layers)."""
        return (pyro.plate("batch", x.shape[0], dim=-3), pyro.plate("heads", self.heads, dim=-2),
                pyro.plate("queries", x.shape[1] + 1, dim=-1))

    def network(self, x: torch.Tensor, mode: str, kl_scale: float = 1.0,
                plates=None) -> torch.Tensor:
        """Class logits ``[B, C]``. ``mode``: "model" (weights from the prior, or replayed),
        "guide" (weights from q), "mean" (deterministic mean weights), "sample" (from q, no
        Pyro trace needed)."""
        self.check_input(x)
        B = x.shape[0]
        h = torch.cat([self.cls.expand(B, 1, -1), self.embed(x)], 1) + self.pos
        N = h.shape[1]
        mask = torch.ones(B, self.heads, N, N, dtype=torch.bool, device=h.device)
        scale = (poutine.scale(scale=kl_scale) if kl_scale != 1.0 and mode in ("model", "guide")
                 else contextlib.nullcontext())
        for layer in range(len(self.qkv)):
            q, k, v = self.qkv[layer](h).view(B, N, 3, self.heads, self.dh).permute(2, 0, 3, 1, 4)
            e = q @ k.transpose(-1, -2) / math.sqrt(self.dh)  # [B, H, N, N]
            ctx = attend_by_mode(f"attn_{layer}", e, v, self.layer_families[layer], mask, k, mode,
                                 plates or (), scale)
            h = self.ln1[layer](h + self.out[layer](ctx.transpose(1, 2).reshape(B, N, -1)))
            h = self.ln2[layer](h + self.ff[layer](h))
        return self.head(h[:, 0])

    def model(self, batch, *, enumerate_z: bool = False, kl_scale: float = 1.0):
        """p(y, W | x): every head's weights from the family's prior, the class observed."""
        pyro.module("bam_classifier", self)
        x, y = batch.x, batch.y
        self.check_input(x)
        plates = self._plates(x)
        logits = self.network(x, "model", kl_scale, plates)
        with plates[0]:
            pyro.sample("y", dist.Categorical(logits=logits.view(-1, 1, 1, logits.shape[-1])),
                        obs=None if y is None else y.view(-1, 1, 1))

    def guide(self, batch, *, posterior: str = "prior", enumerate_z: bool = False,
              kl_scale: float = 1.0, baseline=None):
        """q(W | x): the family's posterior at the same scores (``posterior="prior"``)."""
        pyro.module("bam_classifier", self)
        if posterior == "prior" and self.stochastic:
            self.check_input(batch.x)
            self.network(batch.x, "guide", kl_scale, self._plates(batch.x))

    def extra_report(self, test, samples: int = 20, seed: int = 0) -> dict:
        """Accuracy with the mean weights, ECE and PAvPU of ``samples`` posterior draws, on the
        clean and (where the data has one) the noisy test images (``test``: the images
        data)."""
        cases = (("", test.test_x),) + ((("_noisy", test.test_x_noisy),)
                                        if test.test_x_noisy is not None else ())
        return label_report(lambda x, s: predict_probs(self, x, s, seed), cases, test.test_y,
                            samples)


def label_report(predict, cases, labels, samples: int = 20) -> dict:
    """``accuracy`` (mean weights), ``ece`` and ``pavpu`` (p < 0.05; also ``pavpu_0.01`` …) of
    ``samples`` posterior draws per case ``(suffix, inputs)``; ``predict(inputs, n)`` gives class
    probabilities ``[n, N, C]``."""
    from ...common.metrics import PAVPU_THRESHOLDS, expected_calibration_error, pavpu

    if samples < 2:
        raise UserError(f"--samples must be at least 2 (PAvPU's t-test), got {samples}")
    out = {"samples": samples}
    for suffix, x in cases:
        mean, draws = predict(x, 1), predict(x, samples)
        out["accuracy" + suffix] = float((mean[0].argmax(-1) == labels).float().mean())
        out["ece" + suffix] = expected_calibration_error(draws, labels)
        for t in PAVPU_THRESHOLDS:
            out[f"pavpu_{t}{suffix}"] = pavpu(draws, labels, t)
        out["pavpu" + suffix] = out[f"pavpu_0.05{suffix}"]
    return out


@torch.no_grad()
def predict_probs(model: BAMClassifier, x, samples: int = 1, seed: int = 0) -> torch.Tensor:
    """Class probabilities ``[S, N, C]``: S = 1 with the deterministic mean weights, else S
    posterior draws of every attention weight (a soft model gives S identical rows)."""
    model.eval()
    if samples <= 1:
        return model.network(x, "mean").softmax(-1).unsqueeze(0)
    torch.manual_seed(seed)
    return torch.stack([model.network(x, "sample").softmax(-1) for _ in range(samples)])
