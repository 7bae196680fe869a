"""A latent-tree model whose emission factors over arcs (the capability ``arc-emissions``): each
source word m emits one target label from its own embedding and its head's,

    p(z | x)          = DependencyTree(θ),  θ = BiaffineArcScore(e(x)),
    p(y | z, x)       = Π_m softmax(W [e(x_m); e(x_{head(m)})])_{y_m}   (the root's head: r),

so log p(y | z, x) = Σ_{(h→m) ∈ z} φ_hm and log p(y | x) = log Z(θ + φ) − log Z(θ) exactly
(method ``tree-exact``); the exact posterior is the tree of θ + φ, which the guide offers as its
``"inference"`` posterior. Targets are one label per source word (then ``<eos>``).
"""
import pyro
import torch
from pyro import poutine
from torch import nn

import ppl_attention as pa
from ppl_attention.pyro.trees import heads_to_arcs, tree_log_likelihood


class HeadLabeller(pa.models.AlignmentModel):
    families = ("tree",)
    posteriors = ("none", "inference")

    def __init__(self, src_vocab: int, tgt_vocab: int, *, family, dim: int = 16):
        super().__init__()
        self.family = pa.make_family(family)
        self.embed = nn.Embedding(src_vocab, dim)
        self.arc_scores = pa.BiaffineArcScore(dim)
        self.root = nn.Parameter(torch.zeros(dim))
        self.out = nn.Linear(2 * dim, tgt_vocab)

    def arc_emission_scores(self, batch):
        """φ ``[B, 1, S, S]``: φ_hm = log p(y_m | x_m, x_h), the diagonal with the root."""
        e = self.embed(batch.src)  # [B, S, d]
        B, S, d = e.shape
        heads = e.unsqueeze(2).expand(B, S, S, d)  # [B, h, m, d]
        eye = torch.eye(S, dtype=torch.bool, device=e.device)[None, :, :, None]
        heads = torch.where(eye, self.root.expand(B, S, S, d), heads)
        mods = e.unsqueeze(1).expand(B, S, S, d)
        logp = self.out(torch.cat([mods, heads], -1)).log_softmax(-1)  # [B, h, m, V]
        y = batch.tgt_out[:, :S]  # the label of each word
        phi = logp.gather(-1, y[:, None, :, None].expand(B, S, S, 1)).squeeze(-1)
        return phi.unsqueeze(1)

    def _arcs(self, batch):
        return self.arc_scores(self.embed(batch.src)).unsqueeze(1)  # [B, 1, S, S]

    def model(self, batch, *, enumerate_z=False, kl_scale=1.0):
        pyro.module("head_labels", self)
        phi = self.arc_emission_scores(batch)
        with pyro.plate("batch", batch.size, dim=-2):
            if enumerate_z:  # the tree summed out: log Z(θ + φ) − log Z(θ)
                prior = self.family.tree_distribution(self._arcs(batch), batch.src_mask)
                pyro.factor("y", tree_log_likelihood(prior, phi))
                return
            with poutine.scale(scale=kl_scale):
                _, heads = pa.attend("align", self._arcs(batch), self.embed(batch.src),
                                     self.family, mask=batch.src_mask)
            pyro.factor("y", (heads_to_arcs(heads, phi.dtype) * phi).sum((-1, -2)))

    def guide(self, batch, *, posterior="inference", enumerate_z=False, kl_scale=1.0,
              baseline=None):
        if posterior == "none":
            return
        pyro.module("head_labels", self)
        q = self._arcs(batch) + self.arc_emission_scores(batch)  # the exact posterior's arcs
        infer = {"baseline": {"baseline_value": baseline}} if baseline is not None else None
        with pyro.plate("batch", batch.size, dim=-2), poutine.scale(scale=kl_scale):
            pa.attend("align", q, self.embed(batch.src), self.family, mask=batch.src_mask,
                      guide=True, infer=infer)

    def exact_token_log_likelihood(self, batch):
        """The pair's log p(y | x) on its first token, 0 elsewhere (the tree couples the labels:
        no token has a likelihood of its own), ``[B, T]``."""
        prior = self.family.tree_distribution(self._arcs(batch), batch.src_mask)
        ll = tree_log_likelihood(prior, self.arc_emission_scores(batch))[:, 0]
        out = torch.zeros_like(batch.tgt_out, dtype=ll.dtype)
        out[:, 0] = ll
        return out
