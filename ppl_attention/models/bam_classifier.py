"""BAMClassifier: a Transformer-encoder classifier whose every attention head is a ``pa.attend``
site (Fan et al. 2020's Bayesian Attention Modules on a plain classifier).

    tokens x [B, N, f] ──Linear──► + positions, a [CLS] token prepended  → h⁰ [B, N+1, d]
    layer l:  Q, K, V = heads(h) [B, H, N+1, d/H];  e = QKᵀ/√(d/H)
              W ~ family(e) at site "attn_l" (Soft: softmax(e); Weibull / LogNormal: BAM)
              h = LN(h + Wo(W V));  h = LN(h + FF(h))
    y ~ Categorical(Linear(h_CLS))                                   site "y"

Guide (BAM): each layer's weights from q(W | e), the family's posterior at the *same* scores
(mean softmax(e)); the prior is the family's (contextual: key-dependent Gamma / LogNormal mean,
or constant: uniform mean). The attention sites' KL terms are weighted by λ(t) = sigmoid(t·ρ − 6)
(BAM's annealing) while training. Prediction: ``mode="mean"`` uses the deterministic mean
weights softmax(e) (BAM at test time); ``mode="sample"`` draws the weights from q (posterior
sampling, for uncertainty).
"""

from __future__ import annotations

import contextlib
import math

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import torch
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from torch import nn

from ..attend import attend
from ..families import LogNormal, Soft, Weibull, masked_softmax

__all__ = ["BAMClassifier", "attend_by_mode", "make_attention_family", "train_classifier",
           "predict_probs"]


def make_attention_family(name: str, prior: str, key_dim: int, k: float = 10.0,
                          sigma: float = 0.5):
    """``soft`` | ``weibull`` | ``lognormal`` with a ``contextual`` or ``constant`` prior."""
    if name == "soft":
        return Soft()
    if name == "weibull":
        return Weibull(k=k, prior=prior, key_dim=key_dim)
    if name == "lognormal":
        return LogNormal(sigma=sigma, prior=prior, key_dim=key_dim)
    raise ValueError(f"attention family must be soft, weibull or lognormal; got {name!r}")


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


class BAMClassifier(nn.Module):
    """Args: ``n_tokens`` and ``token_dim`` of an input ``[B, n_tokens, token_dim]``,
    ``n_classes``; ``d`` model width, ``heads``, ``layers``; ``family`` / ``prior`` of every
    head (see :func:`make_attention_family`)."""

    def __init__(self, n_tokens: int, token_dim: int, n_classes: int, d: int = 32,
                 heads: int = 2, layers: int = 2, family: str = "soft",
                 prior: str = "contextual", k: float = 10.0, sigma: float = 0.5):
        super().__init__()
        if d % heads:
            raise ValueError(f"d ({d}) must be divisible by heads ({heads})")
        self.config = dict(n_tokens=n_tokens, token_dim=token_dim, n_classes=n_classes, d=d,
                           heads=heads, layers=layers, family=family, prior=prior, k=k,
                           sigma=sigma)
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
        self.families = nn.ModuleList(make_attention_family(family, prior, self.dh, k, sigma)
                                      for _ in range(layers))
        self.head = nn.Linear(d, n_classes)

    @property
    def stochastic(self) -> bool:
        return not isinstance(self.families[0], Soft)

    def check_input(self, x: torch.Tensor) -> None:
        c = self.config
        if x.dim() != 3 or x.shape[1:] != (c["n_tokens"], c["token_dim"]):
            raise ValueError(f"input must be [B, {c['n_tokens']}, {c['token_dim']}] "
                             f"(tokens × features), got {list(x.shape)}")
        if not torch.isfinite(x).all():
            raise ValueError("input has NaN or infinite values")

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
        mask = torch.ones(B, self.heads, N, N, dtype=torch.bool)
        scale = (poutine.scale(scale=kl_scale) if kl_scale != 1.0 and mode in ("model", "guide")
                 else contextlib.nullcontext())
        for layer in range(len(self.qkv)):
            q, k, v = self.qkv[layer](h).view(B, N, 3, self.heads, self.dh).permute(2, 0, 3, 1, 4)
            e = q @ k.transpose(-1, -2) / math.sqrt(self.dh)  # [B, H, N, N]
            ctx = attend_by_mode(f"attn_{layer}", e, v, self.families[layer], mask, k, mode,
                                 plates or (), scale)
            h = self.ln1[layer](h + self.out[layer](ctx.transpose(1, 2).reshape(B, N, -1)))
            h = self.ln2[layer](h + self.ff[layer](h))
        return self.head(h[:, 0])

    def model(self, x, y=None, kl_scale: float = 1.0):
        pyro.module("bam_classifier", self)
        self.check_input(x)
        plates = self._plates(x)
        logits = self.network(x, "model", kl_scale, plates)
        with plates[0]:
            pyro.sample("y", dist.Categorical(logits=logits.view(-1, 1, 1, logits.shape[-1])),
                        obs=None if y is None else y.view(-1, 1, 1))

    def guide(self, x, y=None, kl_scale: float = 1.0):
        pyro.module("bam_classifier", self)
        if self.stochastic:
            self.check_input(x)
            self.network(x, "guide", kl_scale, self._plates(x))

    def make_elbo(self):
        """Analytic KLs for the BAM families (TraceMeanField_ELBO), Trace_ELBO for soft."""
        return TraceMeanField_ELBO(max_plate_nesting=3) if self.stochastic else \
            Trace_ELBO(max_plate_nesting=3)


def train_classifier(model: BAMClassifier, x, y, steps: int = 1500, batch_size: int = 64,
                     lr: float = 3e-3, rho: float = 0.01, kl_weight: float = 1.0, seed: int = 0,
                     progress: bool = False) -> list[float]:
    """Adam on the annealed ELBO, KL weight η·sigmoid(t·ρ − 6) (η = ``kl_weight``, 1: the
    ELBO); returns the losses per example."""
    from tqdm.auto import tqdm

    pyro.clear_param_store()
    g = torch.Generator().manual_seed(seed)
    pyro.set_rng_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    elbo = model.make_elbo()
    losses = []
    model.train()
    for step in tqdm(range(steps), disable=not progress, desc="train", leave=False):
        idx = torch.randint(0, x.shape[0], (batch_size,), generator=g)
        kl = kl_weight / (1.0 + math.exp(-(step * rho - 6.0)))
        opt.zero_grad()
        loss = elbo.loss_and_grads(lambda a, b, kl=kl: model.model(a, b, kl),
                                   lambda a, b, kl=kl: model.guide(a, b, kl), x[idx], y[idx])
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        opt.step()
        losses.append(loss / batch_size)
    model.eval()
    return losses


@torch.no_grad()
def predict_probs(model: BAMClassifier, x, samples: int = 1, seed: int = 0) -> torch.Tensor:
    """Class probabilities ``[S, N, C]``: S = 1 with the deterministic mean weights, else S
    posterior draws of every attention weight (a soft model gives S identical rows)."""
    model.eval()
    if samples <= 1:
        return model.network(x, "mean").softmax(-1).unsqueeze(0)
    torch.manual_seed(seed)
    return torch.stack([model.network(x, "sample").softmax(-1) for _ in range(samples)])
