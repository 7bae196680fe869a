"""Graphs for node classification, made offline: a contextual stochastic block model (features
and labels from a seed; Deshpande et al. 2018) and Zachary's karate club (networkx)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..core.errors import UserError

__all__ = ["Graph", "contextual_sbm", "karate_club", "check_graph"]


@dataclass
class Graph:
    features: torch.Tensor  # [N, F]
    adjacency: torch.Tensor  # [N, N] bool, symmetric, no self-loops needed
    labels: torch.Tensor  # [N]
    train_mask: torch.Tensor  # [N] bool
    test_mask: torch.Tensor  # [N] bool
    n_classes: int

    @property
    def size(self) -> int:
        return 1

    @property
    def n_tokens(self) -> int:
        """What the loss is averaged over: the labelled nodes."""
        return max(1, int(self.train_mask.sum()))

    def to(self, device) -> Graph:
        """The same graph with its tensors on ``device``."""
        return Graph(self.features.to(device), self.adjacency.to(device), self.labels.to(device),
                     self.train_mask.to(device), self.test_mask.to(device), self.n_classes)

    def noisy(self, scale: float, seed: int = 0) -> Graph:
        """The same graph with Gaussian noise of sd ``scale`` added to the features."""
        g = torch.Generator().manual_seed(seed)
        noise = scale * torch.randn(self.features.shape, generator=g)
        return Graph(self.features + noise, self.adjacency, self.labels, self.train_mask,
                     self.test_mask, self.n_classes)


def check_graph(g: Graph, values: bool = True) -> None:
    """Clear errors for a graph of the wrong shape or, with ``values``, labels out of range or
    non-finite features (checks that read the tensors: each waits for an accelerator)."""
    n = g.features.shape[0] if g.features.dim() == 2 else None
    if g.features.dim() != 2:
        raise UserError(f"features must be [nodes, features], got {list(g.features.shape)}")
    if g.adjacency.shape != (n, n):
        raise UserError(f"adjacency must be [{n}, {n}] for {n} nodes, got "
                         f"{list(g.adjacency.shape)}")
    for name in ("labels", "train_mask", "test_mask"):
        t = getattr(g, name)
        if t.shape != (n,):
            raise UserError(f"{name} must have one entry per node ({n}), got {list(t.shape)}")
    if not values:
        return
    if g.labels.numel() and (int(g.labels.min()) < 0 or int(g.labels.max()) >= g.n_classes):
        bad = int(((g.labels < 0) | (g.labels >= g.n_classes)).nonzero()[0])
        raise UserError(f"label {int(g.labels[bad])} of node {bad} is outside "
                         f"[0, {g.n_classes})")
    if not torch.isfinite(g.features).all():
        raise UserError("features have NaN or infinite values")


def contextual_sbm(n: int = 300, classes: int = 3, p_in: float = 0.05, p_out: float = 0.01,
                   dim: int = 16, signal: float = 1.0, train_per_class: int = 20,
                   seed: int = 0) -> Graph:
    """Nodes in ``classes`` equal blocks; an edge with probability ``p_in`` inside a block and
    ``p_out`` across; features = ``signal``·μ_class + N(0, I) with μ_class ~ N(0, I/dim)·√dim
    fixed by the seed; ``train_per_class`` labelled nodes per class, the rest test."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(classes), -(-n // classes))[:n]
    rng.shuffle(y)
    p = np.where(y[:, None] == y[None, :], p_in, p_out)
    upper = np.triu(rng.random((n, n)) < p, 1)
    adj = upper | upper.T
    means = rng.standard_normal((classes, dim))
    x = signal * means[y] + rng.standard_normal((n, dim))
    train = np.zeros(n, bool)
    for c in range(classes):
        train[rng.permutation(np.flatnonzero(y == c))[:train_per_class]] = True
    return Graph(torch.tensor(x, dtype=torch.float32), torch.tensor(adj), torch.tensor(y),
                 torch.tensor(train), torch.tensor(~train), classes)


def karate_club(train_per_class: int = 4, seed: int = 0) -> Graph:
    """Zachary's karate club (34 members, the two factions as labels), one-hot node features."""
    import networkx as nx

    g = nx.karate_club_graph()
    n = g.number_of_nodes()
    adj = torch.zeros(n, n, dtype=torch.bool)
    for a, b in g.edges():
        adj[a, b] = adj[b, a] = True
    y = torch.tensor([0 if g.nodes[i]["club"] == "Mr. Hi" else 1 for i in range(n)])
    rng = np.random.default_rng(seed)
    train = torch.zeros(n, dtype=torch.bool)
    for c in (0, 1):
        idx = rng.permutation(np.flatnonzero(y.numpy() == c))[:train_per_class]
        train[torch.as_tensor(idx)] = True
    return Graph(torch.eye(n), adj, y, train, ~train, 2)
