"""Attention-based multiple-instance classifier (Ilse, Tomczak & Welling 2018), Pyro.

Data kind ``bags``: a bag x = (x_1 … x_S) of real-valued instances x_i ∈ R^F, one label y.

Generative story (one target per bag, the label):

    h_i   = relu(W_e x_i + b_e)                               instance embedding [B, S, d]
    a_i   = wᵀ tanh(V h_i)          (gated: ⊙ sigmoid(U h_i))  instance score (Ilse's attention)
    z     ~ family(softmax_i a_i)                             which instance the label reads
                                                              (categorical: one instance;
                                                              simplex families: weights)
    c     = h_z  (categorical)   or  Σ_i w_i h_i  (soft / simplex / BAM)
    y | z ~ Categorical(softmax(W_o c + b_o))

Guide (inference network, reads the label):

    q(z | x, y) ∝ exp(a_i + e_q(y)ᵀ A h_i)

``posterior="prior"`` reuses a_i (hard attention, BAM). ``soft_token_log_likelihood`` is the
soft-attention model log p(y | x) with c = Σ_i softmax(a)_i h_i (the REINFORCE baseline), so
``hard-sample`` / ``vae-sample`` apply too.
"""

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from torch import nn

import ppl_attention as pa


class BagClassifier(pa.models.AlignmentModel):
    data = "bags"
    option_help = {"dim": "instance embedding size", "attn_hidden": "width of Ilse's attention MLP",
                   "gated": "gated attention (Ilse et al.'s gated variant)"}

    def __init__(self, n_features: int, n_classes: int, *, family, dim: int = 32,
                 attn_hidden: int = 32, gated: bool = False):
        super().__init__()
        self.family = pa.make_family(family, key_dim=dim)
        self.n_classes = n_classes
        self.embed = nn.Linear(n_features, dim)
        self.att_v = nn.Linear(dim, attn_hidden)
        self.att_u = nn.Linear(dim, attn_hidden)
        self.att_w = nn.Linear(attn_hidden, 1)
        self.gated = gated
        self.out = nn.Linear(dim, n_classes)
        self.q_label = nn.Embedding(n_classes, dim)       # the inference network
        self.q_bilinear = nn.Linear(dim, dim, bias=False)

    # -- pieces -------------------------------------------------------------------------------
    def instances(self, batch):
        return torch.relu(self.embed(batch.features))      # [B, S, d]

    def prior_scores(self, batch, h):
        a = torch.tanh(self.att_v(h))
        if self.gated:
            a = a * torch.sigmoid(self.att_u(h))
        s = self.att_w(a).squeeze(-1)                       # [B, S]
        T = batch.tgt_out.shape[1]
        return s[:, None, :].expand(-1, T, -1)             # [B, T, S]

    # -- the contract -------------------------------------------------------------------------
    def model(self, batch, *, enumerate_z=False, kl_scale=1.0):
        pyro.module("bagmil", self)
        h = self.instances(batch)
        B, T = batch.tgt_out.shape
        with pyro.plate("batch", B, dim=-2), pyro.plate("target", T, dim=-1):
            with poutine.scale(scale=kl_scale):
                ctx, _ = pa.attend(
                    "align", self.prior_scores(batch, h), h, self.family, mask=batch.src_mask,
                    target_mask=None if enumerate_z else batch.tgt_mask,
                    infer={"enumerate": "parallel"} if enumerate_z else None)
            logits = self.out(ctx)                          # [..., B, T, C]
            pyro.sample("y", dist.Categorical(logits=logits).mask(batch.tgt_mask),
                        obs=batch.tgt_out)

    def guide(self, batch, *, posterior="inference", enumerate_z=False, kl_scale=1.0,
              baseline=None):
        if posterior == "none":
            return
        pyro.module("bagmil", self)
        h = self.instances(batch)
        scores = self.prior_scores(batch, h)
        if posterior == "inference":
            ey = self.q_label(batch.tgt_out.clamp(0, self.n_classes - 1))      # [B, T, d]
            scores = scores + ey @ self.q_bilinear(h).transpose(1, 2)
        infer = {"enumerate": "parallel"} if enumerate_z else {}
        if baseline is not None:
            infer["baseline"] = {"baseline_value": baseline}
        B, T = batch.tgt_out.shape
        with pyro.plate("batch", B, dim=-2), pyro.plate("target", T, dim=-1), \
                poutine.scale(scale=kl_scale):
            pa.attend("align", scores, h, self.family, mask=batch.src_mask, guide=True,
                      target_mask=batch.tgt_mask, infer=infer or None)

    def soft_token_log_likelihood(self, batch):
        """log p(y | x) of the soft-attention (Ilse) model, [B, T], 0 on padding."""
        h = self.instances(batch)
        scores = self.prior_scores(batch, h).masked_fill(~batch.src_mask[:, None, :], float("-inf"))
        w = torch.softmax(scores, -1)
        logp = torch.log_softmax(self.out(w @ h), -1)
        ll = logp.gather(-1, batch.tgt_out.clamp(0, self.n_classes - 1)[..., None]).squeeze(-1)
        return ll * batch.tgt_mask

    def extra_report(self, batches):
        """Test accuracy of the label: under the mixture predictive Σ_i p(z = i | x) p(y | h_i)
        (the categorical model's own p(y | x)) and under soft attention."""
        right_mix = right_soft = n = 0
        with torch.no_grad():
            for batch in batches:
                h = self.instances(batch)
                scores = self.prior_scores(batch, h)[:, 0]
                scores = scores.masked_fill(~batch.src_mask, float("-inf"))
                w = torch.softmax(scores, -1)                               # [B, S]
                p_mix = (w[..., None] * torch.softmax(self.out(h), -1)).sum(1)   # [B, C]
                p_soft = torch.softmax(self.out((w[:, :, None] * h).sum(1)), -1)
                y = batch.tgt_out[:, 0]
                keep = batch.tgt_mask[:, 0]
                right_mix += ((p_mix.argmax(-1) == y) & keep).sum().item()
                right_soft += ((p_soft.argmax(-1) == y) & keep).sum().item()
                n += keep.sum().item()
        return {"accuracy": right_mix / max(n, 1), "accuracy_soft": right_soft / max(n, 1)}
