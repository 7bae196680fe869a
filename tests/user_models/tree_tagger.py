"""A tagger whose attention reads a latent dependency tree over the source (Pyro).

Pairs data: a source sentence x_1 … x_S and one tag per source word, y_1 … y_S, then <eos>
(so target position t < S is word t's tag). A latent projective dependency tree z over the
source (one per sentence), with arc scores from a biaffine scorer over BiLSTM states k:

    θ = BiaffineArcScore(k)                  θ_hm: arc h → m,  θ_mm: root → m
    z ~ DependencyTree(θ)                    p(z | x) = exp(Σ_{(h→m) ∈ z} θ_hm) / Z(θ)
    y_m | z, x ~ Categorical(softmax(A v_m + P v_{head_z(m)} + b))    (v_root := 0)
    <eos> ~ Categorical(softmax(e))           independent of z

v = word embeddings. The tag reads the word and its head only, through ``pa.attend`` with the
tree family (u_m(z) = [v_m; Σ_h z_hm v_h; Σ_c z_mc v_c]; query t attends to word t alone), so
the emission factors over arcs: log p(y | z, x) = Σ_{(h→m) ∈ z} φ_hm with
φ_hm = log p(y_m | v_m, v_h) and φ_mm = log p(y_m | v_m, root) + log p(<eos>); then
log p(y | x) = log Z(θ + φ) − log Z(θ) and p(z | x, y) is the tree of θ + φ (``tree-exact``).

Methods:
  tree-marginals   z replaced by its arc marginals (structured attention, Kim et al. 2017);
  tree-sample      guide q(z | x, y) = DependencyTree(θ + Biaffine([k; e_q(y)])), an inference
                   network reading the tags; ELBO by the score function with the exact tree KL;
                   the baseline is ``soft_token_log_likelihood`` (the tree-marginals model);
  tree-exact       the tree summed out exactly (``arc_emission_scores``).
"""

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from torch import nn

import ppl_attention as pa


class TreeTagger(pa.models.AlignmentModel):
    families = ("tree", "tree-marginals")
    posteriors = ("none", "inference")
    option_help = {"dim": "word embedding size (the values)", "hidden": "BiLSTM width (keys)"}

    def __init__(self, src_vocab: int, tgt_vocab: int, *, family, dim: int = 32,
                 hidden: int = 32):
        super().__init__()
        self.family = pa.make_family(family, key_dim=dim)
        self.dim = dim
        self.embed = nn.Embedding(src_vocab, dim)
        self.encoder = nn.LSTM(dim, hidden // 2, batch_first=True, bidirectional=True)
        self.arcs = pa.BiaffineArcScore(hidden)
        self.self_out = nn.Linear(dim, tgt_vocab)
        self.head_out = nn.Linear(dim, tgt_vocab, bias=False)
        self.eos_logits = nn.Parameter(torch.zeros(tgt_vocab))
        self.q_tag = nn.Embedding(tgt_vocab, dim)                       # the inference network
        self.q_arcs = pa.BiaffineArcScore(hidden + dim)

    # -- pieces -------------------------------------------------------------------------------
    def encode(self, batch):
        v = self.embed(batch.src)                                        # [B, S, d]
        k, _ = self.encoder(v)                                           # [B, S, h]
        return v, k

    def lengths(self, batch):
        return batch.src_mask.sum(-1)

    def query_scores(self, batch):
        """Query t reads word t alone: 0 on the diagonal, −1e4 elsewhere, [B, T, S]."""
        S, T = batch.src.shape[1], batch.tgt_out.shape[1]
        t = torch.arange(T, device=batch.src.device)[:, None]
        j = torch.arange(S, device=batch.src.device)[None, :]
        e = torch.where(t == j, 0.0, -1e4).to(self.self_out.weight.dtype)
        return e.expand(batch.src.shape[0], T, S)

    def is_eos(self, batch):
        T = batch.tgt_out.shape[1]
        t = torch.arange(T, device=batch.src.device)
        return t[None, :] == self.lengths(batch)[:, None]                # [B, T]

    def tag_logits(self, batch, ctx):
        """ctx [..., B, T, 3d] → logits [..., B, T, V]; <eos> from its own logits."""
        d = self.dim
        word = self.self_out(ctx[..., :d]) + self.head_out(ctx[..., d:2 * d])
        return torch.where(self.is_eos(batch)[..., None], self.eos_logits, word)

    def source_tags(self, batch):
        """The tags of the source words, [B, S] (target position m is word m's tag)."""
        S = batch.src.shape[1]
        y = batch.tgt_out[:, :S]
        if y.shape[1] < S:
            y = torch.cat([y, y.new_ones(y.shape[0], S - y.shape[1])], 1)
        return y

    # -- the contract -------------------------------------------------------------------------
    def model(self, batch, *, enumerate_z=False, kl_scale=1.0):
        pyro.module("treetagger", self)
        v, k = self.encode(batch)
        theta = self.arcs(k)                                             # [B, S, S]
        B, T = batch.tgt_out.shape
        if enumerate_z:                                                  # tree-exact
            prior = pa.DependencyTree(theta, self.lengths(batch))
            ll = pa.trees.tree_log_likelihood(prior, self.arc_emission_scores(batch)[:, 0])
            with pyro.plate("batch", B, dim=-2), poutine.scale(scale=kl_scale):
                pyro.factor("y_tree", ll.reshape(B, 1))
            return
        with pyro.plate("batch", B, dim=-2):
            with poutine.scale(scale=kl_scale):
                ctx, _ = pa.attend("align", theta.unsqueeze(1), v, self.family,
                                   mask=batch.src_mask, attention=self.query_scores(batch))
            with pyro.plate("target", T, dim=-1):
                pyro.sample("y", dist.Categorical(logits=self.tag_logits(batch, ctx))
                            .mask(batch.tgt_mask), obs=batch.tgt_out)

    def guide(self, batch, *, posterior="inference", enumerate_z=False, kl_scale=1.0,
              baseline=None):
        if posterior == "none":
            return
        pyro.module("treetagger", self)
        v, k = self.encode(batch)
        theta = self.arcs(k)
        if posterior == "inference":                                     # reads the tags
            theta = theta + self.q_arcs(torch.cat([k, self.q_tag(self.source_tags(batch))], -1))
        infer = {}
        if baseline is not None:
            infer["baseline"] = {"baseline_value": baseline}
        B = batch.src.shape[0]
        with pyro.plate("batch", B, dim=-2), poutine.scale(scale=kl_scale):
            pa.attend("align", theta.unsqueeze(1), v, self.family, mask=batch.src_mask,
                      guide=True, attention=self.query_scores(batch), infer=infer or None)

    # -- capabilities -------------------------------------------------------------------------
    def arc_emission_scores(self, batch):
        """φ [B, 1, S, S]: φ[h, m] = log p(y_m | v_m, v_h); φ[m, m] = log p(y_m | v_m, root)
        + log p(<eos>) (every tree has exactly one root arc)."""
        v, _ = self.encode(batch)
        y = self.source_tags(batch)                                      # [B, S]
        base = self.self_out(v)                                          # [B, S, V] (word m)
        head = self.head_out(v)                                          # [B, S, V] (head h)
        logits = base[:, None, :, :] + head[:, :, None, :]               # [B, h, m, V]
        lp = torch.log_softmax(logits, -1)
        phi = lp.gather(-1, y[:, None, :, None].expand(-1, v.shape[1], -1, 1)).squeeze(-1)
        root = torch.log_softmax(base, -1).gather(-1, y[..., None]).squeeze(-1)      # [B, S]
        eos_id = batch.tgt_out.gather(1, self.lengths(batch)[:, None]).squeeze(1)     # [B]
        eos = torch.log_softmax(self.eos_logits, -1)[eos_id]                          # [B]
        phi = phi.clone()
        idx = torch.arange(v.shape[1], device=v.device)
        phi[:, idx, idx] = root + eos[:, None]
        keep = batch.src_mask[:, None, :] & batch.src_mask[:, :, None]
        return torch.where(keep, phi, torch.zeros_like(phi)).unsqueeze(1)

    def soft_token_log_likelihood(self, batch):
        """log p(y_t | x) of the tree-marginals model (the parent block is Σ_h μ_hm v_h), [B, T]."""
        v, k = self.encode(batch)
        mu = pa.DependencyTree(self.arcs(k), self.lengths(batch)).marginals          # [B, S, S]
        eye = torch.eye(v.shape[1], dtype=torch.bool, device=v.device)
        parent = mu.masked_fill(eye, 0.0).transpose(1, 2) @ v                        # [B, S, d]
        d = self.dim
        ctx = torch.cat([v, parent, torch.zeros_like(v)], -1)                         # [B, S, 3d]
        T = batch.tgt_out.shape[1]
        S = v.shape[1]
        if T > S:
            ctx = torch.cat([ctx, ctx.new_zeros(ctx.shape[0], T - S, 3 * d)], 1)
        ctx = ctx[:, :T]
        lp = torch.log_softmax(self.tag_logits(batch, ctx), -1)
        ll = lp.gather(-1, batch.tgt_out[..., None]).squeeze(-1)
        return ll * batch.tgt_mask
