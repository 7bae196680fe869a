"""BayesianGAT: graph attention (Veličković et al. 2018) whose attention over each node's
neighbours is a ``pa.attend`` site — Soft (GAT), or BAM's Weibull / LogNormal with a contextual
or constant prior (Fan et al. 2020, §5.1).

    layer l, head h:  z = W x;  e_ij = LeakyReLU(a_srcᵀ z_i + a_dstᵀ z_j), j ∈ N(i) ∪ {i}
                      W_i· ~ family(e_i·) over the neighbourhood     site "attn_l"
                      x'_i = ELU(concat_h Σ_j W_ij z_j)     (the last layer: one head, logits)
    y_i ~ Categorical(logits_i) for the labelled nodes               site "y"

Every node attends to itself (a self-loop is always added), so an isolated node has the one
neighbour it needs and no NaN weights. Full-batch training on one graph.
"""

from __future__ import annotations

import contextlib
import math

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import torch
import torch.nn.functional as F
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from torch import nn

from ..data.graphs import Graph, check_graph
from ..families import Soft
from .bam_classifier import attend_by_mode, make_attention_family

__all__ = ["BayesianGAT", "train_gat", "predict_gat"]


class BayesianGAT(nn.Module):
    def __init__(self, in_dim: int, n_classes: int, hidden: int = 8, heads: int = 4,
                 family: str = "soft", prior: str = "contextual", k: float = 10.0,
                 sigma: float = 0.5):
        super().__init__()
        self.config = dict(in_dim=in_dim, n_classes=n_classes, hidden=hidden, heads=heads,
                           family=family, prior=prior, k=k, sigma=sigma)
        self.layer_heads = (heads, 1)
        dims = ((in_dim, hidden), (hidden * heads, n_classes))
        self.W = nn.ModuleList(nn.Linear(i, o * h, bias=False)
                               for (i, o), h in zip(dims, self.layer_heads))
        self.a_src = nn.ParameterList(nn.Parameter(0.1 * torch.randn(h, o))
                                      for (_, o), h in zip(dims, self.layer_heads))
        self.a_dst = nn.ParameterList(nn.Parameter(0.1 * torch.randn(h, o))
                                      for (_, o), h in zip(dims, self.layer_heads))
        self.families = nn.ModuleList(make_attention_family(family, prior, o, k, sigma)
                                      for _, o in dims)

    @property
    def stochastic(self) -> bool:
        return not isinstance(self.families[0], Soft)

    def network(self, g: Graph, mode: str, kl_scale: float = 1.0) -> torch.Tensor:
        """Node logits ``[N, C]``; ``mode`` as :meth:`BAMClassifier.network`."""
        check_graph(g)
        if g.features.shape[1] != self.config["in_dim"]:
            raise ValueError(f"features have {g.features.shape[1]} columns; this model takes "
                             f"{self.config['in_dim']}")
        n = g.features.shape[0]
        nbr = g.adjacency.bool() | torch.eye(n, dtype=torch.bool)
        x = g.features
        scale = (poutine.scale(scale=kl_scale) if kl_scale != 1.0 and mode in ("model", "guide")
                 else contextlib.nullcontext())
        plate_n = pyro.plate("nodes", n, dim=-1)
        for layer, heads in enumerate(self.layer_heads):
            z = self.W[layer](x).view(n, heads, -1).transpose(0, 1)  # [H, N, o]
            e = F.leaky_relu((z * self.a_src[layer][:, None]).sum(-1)[:, :, None]
                             + (z * self.a_dst[layer][:, None]).sum(-1)[:, None, :], 0.2)
            mask = nbr.expand(heads, n, n)
            plates = ((pyro.plate(f"heads_{layer}", heads, dim=-2), plate_n)
                      if mode in ("model", "guide") else ())
            out = attend_by_mode(f"attn_{layer}", e, z, self.families[layer], mask, z, mode,
                                 plates, scale)
            x = F.elu(out.transpose(0, 1).reshape(n, -1)) if layer == 0 else out[0]
        return x

    def model(self, g: Graph, kl_scale: float = 1.0):
        pyro.module("gat", self)
        logits = self.network(g, "model", kl_scale)
        idx = g.train_mask.nonzero().squeeze(-1)
        with pyro.plate("labelled", idx.numel()):
            pyro.sample("y", dist.Categorical(logits=logits[idx]), obs=g.labels[idx])

    def guide(self, g: Graph, kl_scale: float = 1.0):
        pyro.module("gat", self)
        if self.stochastic:
            self.network(g, "guide", kl_scale)

    def make_elbo(self):
        return TraceMeanField_ELBO(max_plate_nesting=2) if self.stochastic else \
            Trace_ELBO(max_plate_nesting=2)


def train_gat(model: BayesianGAT, g: Graph, steps: int = 300, lr: float = 5e-3,
              weight_decay: float = 5e-4, rho: float = 0.05, kl_weight: float = 1.0,
              seed: int = 0) -> list[float]:
    """Adam on the annealed ELBO of the labelled nodes, KL weight η·sigmoid(t·ρ − 6) (η =
    ``kl_weight``; 1 is the ELBO — BAM tunes η because the attention KLs of every node outweigh
    the few labelled nodes' likelihood)."""
    pyro.clear_param_store()
    pyro.set_rng_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    elbo = model.make_elbo()
    losses = []
    model.train()
    for step in range(steps):
        kl = kl_weight / (1.0 + math.exp(-(step * rho - 6.0)))
        opt.zero_grad()
        loss = elbo.loss_and_grads(lambda gg, kl=kl: model.model(gg, kl),
                                   lambda gg, kl=kl: model.guide(gg, kl), g)
        opt.step()
        losses.append(loss / max(1, int(g.train_mask.sum())))
    model.eval()
    return losses


@torch.no_grad()
def predict_gat(model: BayesianGAT, g: Graph, samples: int = 1, seed: int = 0) -> torch.Tensor:
    """Node class probabilities ``[S, N, C]`` (S = 1: mean weights; else posterior draws)."""
    if samples <= 1:
        return model.network(g, "mean").softmax(-1).unsqueeze(0)
    torch.manual_seed(seed)
    return torch.stack([model.network(g, "sample").softmax(-1) for _ in range(samples)])
