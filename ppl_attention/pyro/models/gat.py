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

import pyro
import pyro.distributions as dist
import pyro.poutine as poutine
import torch
import torch.nn.functional as F
from pyro.infer.util import is_validation_enabled
from torch import nn

from ...core.errors import UserError
from ...data.graphs import Graph, check_graph
from ..families import Family
from .bam_classifier import BAM_FAMILIES, attend_by_mode, label_report, layer_family
from .base import AlignmentModel

__all__ = ["BayesianGAT", "predict_gat"]


class BayesianGAT(AlignmentModel):
    """Args: ``in_dim`` node features, ``n_classes``; ``hidden`` units per head, ``heads`` of the
    first layer; ``family`` (soft, weibull or lognormal; from the method) and its BAM ``prior``.
    Trained full-batch (the batch is the graph; the loss is averaged over labelled nodes)."""

    data = "graph"
    posteriors = ("none", "prior")
    families = BAM_FAMILIES
    training_defaults = {"lr": 5e-3, "weight_decay": 5e-4, "clip": 0.0, "steps": 300,
                         "kl_weight": 1e-3, "anneal_rho": 0.05}
    option_help = {"hidden": "units per head", "heads": "heads of the first layer",
                   "prior": "BAM prior of the attention weights: contextual or constant"}

    def __init__(self, in_dim: int, n_classes: int, hidden: int = 8, heads: int = 4,
                 family: Family | str | None = "soft", prior: str = "contextual"):
        super().__init__()
        for name, value in (("hidden", hidden), ("heads", heads)):
            if not isinstance(value, int) or value < 1:
                raise UserError(f"{name} must be a positive int, got {value!r}")
        self.in_dim = in_dim
        self.layer_heads = (heads, 1)
        dims = ((in_dim, hidden), (hidden * heads, n_classes))
        self.W = nn.ModuleList(nn.Linear(i, o * h, bias=False)
                               for (i, o), h in zip(dims, self.layer_heads))
        self.a_src = nn.ParameterList(nn.Parameter(0.1 * torch.randn(h, o))
                                      for (_, o), h in zip(dims, self.layer_heads))
        self.a_dst = nn.ParameterList(nn.Parameter(0.1 * torch.randn(h, o))
                                      for (_, o), h in zip(dims, self.layer_heads))
        self.layer_families = nn.ModuleList(layer_family(family, prior, o) for _, o in dims)

    @property
    def family(self) -> Family:
        return self.layer_families[0]

    @property
    def stochastic(self) -> bool:
        return not self.family.deterministic

    def network(self, g: Graph, mode: str, kl_scale: float = 1.0) -> torch.Tensor:
        """Node logits ``[N, C]``; ``mode`` as :meth:`BAMClassifier.network`."""
        check_graph(g, values=is_validation_enabled())
        if g.features.shape[1] != self.in_dim:
            raise UserError(f"features have {g.features.shape[1]} columns; this model takes "
                            f"{self.in_dim}")
        n = g.features.shape[0]
        nbr = g.adjacency.bool() | torch.eye(n, dtype=torch.bool, device=g.adjacency.device)
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
            out = attend_by_mode(f"attn_{layer}", e, z, self.layer_families[layer], mask, z, mode,
                                 plates, scale)
            x = F.elu(out.transpose(0, 1).reshape(n, -1)) if layer == 0 else out[0]
        return x

    def model(self, g: Graph, *, enumerate_z: bool = False, kl_scale: float = 1.0):
        """p(labels, W | features): the attention weights from the family's prior, the
        labelled nodes' classes observed."""
        pyro.module("gat", self)
        logits = self.network(g, "model", kl_scale)
        with pyro.plate("labels", logits.shape[0], dim=-1):  # unlabelled nodes masked out
            pyro.sample("y", dist.Categorical(logits=logits).mask(g.train_mask), obs=g.labels)

    def guide(self, g: Graph, *, posterior: str = "prior", enumerate_z: bool = False,
              kl_scale: float = 1.0, baseline=None):
        pyro.module("gat", self)
        if posterior == "prior" and self.stochastic:
            self.network(g, "guide", kl_scale)

    def extra_report(self, test, samples: int = 20, seed: int = 0) -> dict:
        """Accuracy, ECE and PAvPU on the unlabelled nodes of the clean and the noisy graph
        (``test``: the pair (graph, noisy graph))."""
        g, noisy = test
        te = g.test_mask
        return label_report(lambda graph, s: predict_gat(self, graph, s, seed)[:, te],
                            (("", g), ("_noisy", noisy)), g.labels[te], samples)


@torch.no_grad()
def predict_gat(model: BayesianGAT, g: Graph, samples: int = 1, seed: int = 0) -> torch.Tensor:
    """Node class probabilities ``[S, N, C]`` (S = 1: mean weights; else posterior draws)."""
    if samples <= 1:
        return model.network(g, "mean").softmax(-1).unsqueeze(0)
    torch.manual_seed(seed)
    return torch.stack([model.network(g, "sample").softmax(-1) for _ in range(samples)])
