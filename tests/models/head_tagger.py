"""A tagger whose labels are read off a latent dependency tree, observed through a categorical
site so that it can be simulated (and calibrated). Each source word m emits one label from its
own embedding and its head's:

    p(z | x)       = DependencyTree(θ),  θ = BiaffineArcScore(e(x))     (one tree per source)
    p(y_m | z, x)  = softmax(W [e(x_m); e(x_head(m))] + b)_{y_m}         (the root's head: r)
    p(<eos> | x)   = softmax(c)_{<eos>}                                   (after the last word)

so log p(y | z, x) = Σ_{(h→m) ∈ z} φ_hm + log p(<eos>) with φ_hm = log p(y_m | m's head is h):
the emission factors over arcs (``arc_emission_scores``), log p(y | x) = log Z(θ + φ) − log Z(θ)
+ log p(<eos>) (``tree-exact``), and the exact posterior is the tree of θ + φ — which the guide
offers as its ``"inference"`` posterior. Under ``tree-marginals`` each word's label is the
mixture Σ_h μ_hm p(y_m | m's head is h) under the arc marginals μ (structured attention), a
different model whose likelihood is its own. Targets are one label per source word, then
``<eos>``.
"""
import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from torch import nn

import ppl_attention as pa
from ppl_attention.pyro.trees import heads_to_arcs, tree_log_likelihood


class HeadTagger(pa.models.AlignmentModel):
    families = ("tree", "tree-marginals")
    posteriors = ("none", "inference")

    def __init__(self, src_vocab: int, tgt_vocab: int, *, family, dim: int = 16):
        super().__init__()
        self.family = pa.make_family(family)
        self.embed = nn.Embedding(src_vocab, dim)
        self.arc_scores = pa.BiaffineArcScore(dim)
        self.root = nn.Parameter(torch.zeros(dim))
        self.out = nn.Linear(2 * dim, tgt_vocab)
        self.end = nn.Parameter(torch.zeros(tgt_vocab))

    # --- pieces --------------------------------------------------------------------------
    def _arcs(self, batch):
        return self.arc_scores(self.embed(batch.src)).unsqueeze(1)  # [B, 1, S, S]

    def _label_logp(self, batch):
        """log p(y_m = · | m's head is h) ``[B, h, m, V]`` (the diagonal: the root)."""
        e = self.embed(batch.src)
        B, S, d = e.shape
        heads = e.unsqueeze(2).expand(B, S, S, d)
        eye = torch.eye(S, dtype=torch.bool, device=e.device)[None, :, :, None]
        heads = torch.where(eye, self.root.expand(B, S, S, d), heads)
        mods = e.unsqueeze(1).expand(B, S, S, d)
        return self.out(torch.cat([mods, heads], -1)).log_softmax(-1)

    def _token_logits(self, batch, arcs):
        """Logits ``[B, T, V]`` of every target position given arc indicators or marginals
        ``arcs [B, S(h), S(m)]``: the words' labels from their (expected) heads, then <eos>."""
        logp = self._label_logp(batch)  # [B, h, m, V]
        words = torch.einsum("bhm,bhmv->bmv", arcs, logp.exp()).clamp_min(1e-30).log()
        B, S, V = words.shape
        T = batch.tgt_out.shape[1]
        end = self.end.log_softmax(-1).expand(B, T, V)
        padded = torch.cat([words, end[:, : max(T - S, 0)]], 1)[:, :T]
        lengths = batch.src_mask.sum(-1, keepdim=True)  # <eos> right after the last word
        t = torch.arange(T, device=batch.src.device)[None, :]
        return torch.where((t >= lengths).unsqueeze(-1), end, padded)

    def arc_emission_scores(self, batch):
        """φ ``[B, 1, S, S]``: φ_hm = log p(y_m | x_m, x_h)."""
        logp = self._label_logp(batch)
        B, S = batch.src.shape
        y = batch.tgt_out[:, :S].clamp_max(logp.shape[-1] - 1)
        phi = logp.gather(-1, y[:, None, :, None].expand(B, S, S, 1)).squeeze(-1)
        return phi.masked_fill(~batch.src_mask[:, None, :], 0.0).unsqueeze(1)

    def _eos_log_prob(self, batch):
        lengths = batch.src_mask.sum(-1)
        eos = batch.tgt_out.gather(1, lengths[:, None])[:, 0]
        return self.end.log_softmax(-1)[eos]  # [B]

    # --- the contract ----------------------------------------------------------------------
    def model(self, batch, *, enumerate_z=False, kl_scale=1.0):
        pyro.module("head_tagger", self)
        B, T = batch.tgt_out.shape
        with pyro.plate("batch", B, dim=-2):
            if enumerate_z:  # tree-exact: the tree summed out
                prior = self.family.tree_distribution(self._arcs(batch), batch.src_mask)
                ll = tree_log_likelihood(prior, self.arc_emission_scores(batch))[:, 0]
                pyro.factor("y", (ll + self._eos_log_prob(batch))[:, None])
                return
            with poutine.scale(scale=kl_scale):
                _, tree = pa.attend("align", self._arcs(batch), self.embed(batch.src),
                                    self.family, mask=batch.src_mask)
            arcs = tree if self.family.deterministic else heads_to_arcs(tree, self.end.dtype)
            logits = self._token_logits(batch, arcs.reshape(B, *arcs.shape[-2:]))
            with pyro.plate("target", T, dim=-1):
                pyro.sample("y", dist.Categorical(logits=logits).mask(batch.tgt_mask),
                            obs=batch.tgt_out)

    def guide(self, batch, *, posterior="inference", enumerate_z=False, kl_scale=1.0,
              baseline=None):
        if posterior == "none":
            return
        pyro.module("head_tagger", self)
        q = self._arcs(batch) + self.arc_emission_scores(batch)  # the exact posterior's arcs
        infer = {"baseline": {"baseline_value": baseline}} if baseline is not None else None
        with pyro.plate("batch", batch.size, dim=-2), poutine.scale(scale=kl_scale):
            pa.attend("align", q, self.embed(batch.src), self.family, mask=batch.src_mask,
                      guide=True, infer=infer)

    def soft_token_log_likelihood(self, batch):
        """The structured-attention (marginal) model's ``[B, T]`` log-likelihood: the
        baseline of ``tree-sample``."""
        prior = self.family.tree_distribution(self._arcs(batch), batch.src_mask)
        B = batch.size
        logits = self._token_logits(batch, prior.marginals.reshape(B, *prior.marginals.shape[-2:]))
        lp = dist.Categorical(logits=logits).log_prob(batch.tgt_out)
        return lp.masked_fill(~batch.tgt_mask, 0.0)
