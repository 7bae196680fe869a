"""Attention-based multiple-instance classifier (Ilse, Tomczak & Welling 2018), NumPyro alone.

The same maths as ``bag_classifier.py`` (no torch). Data kind ``bags``: a bag
x = (x_1 … x_S) of instances x_i ∈ R^F, one label y per bag.

    h_i   = relu(x_i W_e + b_e)                               instance embedding [B, S, d]
    a_i   = tanh(h_i V + b_V) w + b_w  (gated: ⊙ sigmoid(h_i U + b_U) inside)
    z     ~ family(softmax_i a_i)       which instance (categorical) / weights (simplex, BAM)
    c     = h_z  or  Σ_i w_i h_i
    y | z ~ Categorical(softmax(c W_o + b_o))

Guide (inference network reading the label):  q(z | x, y) ∝ exp(a_i + e_q(y)ᵀ A h_i);
``posterior="prior"`` reuses a_i. ``soft_token_log_likelihood`` is log p(y | x) of the soft
(Ilse) model, the REINFORCE baseline of ``hard-sample`` / ``vae-sample``.

``twin_parameters`` maps every parameter onto ``bag_classifier.py:BagClassifier`` so that
``ppl-attention check-twin`` can compare the two.
"""

import math

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from numpyro import handlers

import ppl_attention.numpyro as pan
from ppl_attention.numpyro.models import AlignmentModel


def _uniform(shape, bound):
    return lambda key: jax.random.uniform(key, shape, minval=-bound, maxval=bound)


class BagClassifier(AlignmentModel):
    data = "bags"
    option_help = {"dim": "instance embedding size", "attn_hidden": "width of Ilse's attention MLP",
                   "gated": "gated attention (Ilse et al.'s gated variant)"}
    twin_parameters = {
        "embed_w": ("embed.weight", "transpose"), "embed_b": "embed.bias",
        "att_v_w": ("att_v.weight", "transpose"), "att_v_b": "att_v.bias",
        "att_u_w": ("att_u.weight", "transpose"), "att_u_b": "att_u.bias",
        "att_w_w": ("att_w.weight", "transpose"), "att_w_b": "att_w.bias",
        "out_w": ("out.weight", "transpose"), "out_b": "out.bias",
        "q_label": "q_label.weight", "q_bilinear": ("q_bilinear.weight", "transpose"),
    }

    def __init__(self, n_features: int, n_classes: int, *, family, dim: int = 32,
                 attn_hidden: int = 32, gated: bool = False):
        self.family = pan.make_family(family, key_dim=dim)
        self.n_features, self.n_classes = n_features, n_classes
        self.dim, self.attn_hidden, self.gated = dim, attn_hidden, gated

    def _linear(self, name, x, n_in, n_out):
        b = 1 / math.sqrt(n_in)
        w = numpyro.param(f"{name}_w", _uniform((n_in, n_out), b))
        bias = numpyro.param(f"{name}_b", _uniform((n_out,), b))
        return x @ w + bias

    def instances(self, batch):
        return jax.nn.relu(self._linear("embed", batch.features, self.n_features, self.dim))

    def prior_scores(self, batch, h):
        a = jnp.tanh(self._linear("att_v", h, self.dim, self.attn_hidden))
        g = jax.nn.sigmoid(self._linear("att_u", h, self.dim, self.attn_hidden))
        if self.gated:
            a = a * g
        s = self._linear("att_w", a, self.attn_hidden, 1)[..., 0]       # [B, S]
        T = batch.tgt_out.shape[1]
        return jnp.broadcast_to(s[:, None, :], (s.shape[0], T, s.shape[1]))

    def _labels(self, batch):
        return jnp.clip(batch.tgt_out, 0, self.n_classes - 1)

    def model(self, batch, *, enumerate_z=False, kl_scale=1.0):
        h = self.instances(batch)
        scores = self.prior_scores(batch, h)
        b = 1 / math.sqrt(self.dim)
        out_w = numpyro.param("out_w", _uniform((self.dim, self.n_classes), b))
        out_b = numpyro.param("out_b", _uniform((self.n_classes,), b))
        B, T = batch.tgt_out.shape
        with numpyro.plate("batch", B, dim=-2), numpyro.plate("target", T, dim=-1):
            with handlers.scale(scale=kl_scale):
                ctx, _ = pan.attend(
                    "align", scores, h, self.family, mask=batch.src_mask,
                    target_mask=None if enumerate_z else batch.tgt_mask,
                    infer={"enumerate": "parallel"} if enumerate_z else None)
            logits = ctx @ out_w + out_b
            numpyro.sample("y", dist.Categorical(logits=logits).mask(batch.tgt_mask),
                           obs=batch.tgt_out)

    def guide(self, batch, *, posterior="inference", enumerate_z=False, kl_scale=1.0,
              baseline=None):
        if posterior == "none":
            return
        h = self.instances(batch)
        scores = self.prior_scores(batch, h)
        if posterior == "inference":
            b = 1 / math.sqrt(self.dim)
            E = numpyro.param("q_label",
                              lambda key: jax.random.normal(key, (self.n_classes, self.dim)))
            A = numpyro.param("q_bilinear", _uniform((self.dim, self.dim), b))
            ey = E[self._labels(batch)]                                   # [B, T, d]
            scores = scores + ey @ jnp.swapaxes(h @ A, 1, 2)
        B, T = batch.tgt_out.shape
        with numpyro.plate("batch", B, dim=-2), numpyro.plate("target", T, dim=-1), \
                handlers.scale(scale=kl_scale):
            pan.attend("align", scores, h, self.family, mask=batch.src_mask, guide=True,
                       target_mask=batch.tgt_mask,
                       infer={"enumerate": "parallel"} if enumerate_z else None)

    def soft_token_log_likelihood(self, batch):
        """log p(y | x) of the soft-attention (Ilse) model, [B, T], 0 on padding."""
        h = self.instances(batch)
        scores = jnp.where(batch.src_mask[:, None, :], self.prior_scores(batch, h), -jnp.inf)
        w = jax.nn.softmax(scores, -1)
        b = 1 / math.sqrt(self.dim)
        out_w = numpyro.param("out_w", _uniform((self.dim, self.n_classes), b))
        out_b = numpyro.param("out_b", _uniform((self.n_classes,), b))
        logp = jax.nn.log_softmax((w @ h) @ out_w + out_b, -1)
        ll = jnp.take_along_axis(logp, self._labels(batch)[..., None], -1)[..., 0]
        return jnp.where(batch.tgt_mask, ll, 0.0)

    def extra_report(self, batches):
        """Test accuracy of the label: mixture predictive Σ_i p(z = i | x) p(y | h_i), and soft."""
        b = 1 / math.sqrt(self.dim)
        right_mix = right_soft = n = 0
        for batch in batches:
            h = self.instances(batch)
            out_w = numpyro.param("out_w", _uniform((self.dim, self.n_classes), b))
            out_b = numpyro.param("out_b", _uniform((self.n_classes,), b))
            scores = jnp.where(batch.src_mask, self.prior_scores(batch, h)[:, 0], -jnp.inf)
            w = jax.nn.softmax(scores, -1)
            p_mix = (w[..., None] * jax.nn.softmax(h @ out_w + out_b, -1)).sum(1)
            p_soft = jax.nn.softmax((w[:, :, None] * h).sum(1) @ out_w + out_b, -1)
            y, keep = batch.tgt_out[:, 0], batch.tgt_mask[:, 0]
            right_mix += int(((p_mix.argmax(-1) == y) & keep).sum())
            right_soft += int(((p_soft.argmax(-1) == y) & keep).sum())
            n += int(keep.sum())
        return {"accuracy": right_mix / max(n, 1), "accuracy_soft": right_soft / max(n, 1)}
