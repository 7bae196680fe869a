"""The networks of the NumPyro mirror as plain JAX functions over parameter dicts.

Parameters live in a flat dict keyed exactly like the torch modules' ``state_dict()``
(``"encoder.weight_ih_l0"``, ``"score.W.weight"``, …), arrays in torch's layout (a Linear's
weight is ``[out, in]``; LSTM gates in torch's order i, f, g, o). Weights therefore move between
the backends by name with no conversion table: :func:`from_torch`, and a run
directory's ``checkpoint.pt`` is read and written by both.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

Params = dict[str, jnp.ndarray]


def from_torch(state_dict, prefix: str = "") -> Params:
    """torch ``state_dict`` (or the part under ``prefix``) → dict of jnp float32 arrays."""
    out = {}
    for k, v in state_dict.items():
        if k.startswith(prefix):
            out[k[len(prefix):]] = jnp.asarray(v.detach().cpu().numpy())
    return out


def sub(params: Params, prefix: str) -> Params:
    """The entries under ``prefix.`` with the prefix removed (a submodule's parameters)."""
    p = prefix + "."
    return {k[len(p):]: v for k, v in params.items() if k.startswith(p)}


def linear(params: Params, name: str, x: jnp.ndarray) -> jnp.ndarray:
    """torch.nn.Linear: ``x @ W.T + b`` (bias optional)."""
    y = x @ params[f"{name}.weight"].T
    b = params.get(f"{name}.bias")
    return y if b is None else y + b


def init_linear(key, name: str, d_in: int, d_out: int, bias: bool = True) -> Params:
    """torch's default Linear init: U(−1/√d_in, 1/√d_in) for weight and bias."""
    k1, k2 = jax.random.split(key)
    bound = 1.0 / math.sqrt(d_in)
    p = {f"{name}.weight": jax.random.uniform(k1, (d_out, d_in), minval=-bound, maxval=bound)}
    if bias:
        p[f"{name}.bias"] = jax.random.uniform(k2, (d_out,), minval=-bound, maxval=bound)
    return p


def lstm_update(gi, gh, state):
    """The LSTM update from its gate pre-activations: input part ``gi = W_ih x + b_ih`` and
    recurrent part ``gh = W_hh h + b_hh`` (``[..., 4h]``, torch's gate order i, f, g, o)."""
    i, f, g, o = jnp.split(gi + gh, 4, axis=-1)
    c = jax.nn.sigmoid(f) * state[1] + jax.nn.sigmoid(i) * jnp.tanh(g)
    return jax.nn.sigmoid(o) * jnp.tanh(c), c


def gru_update(gi, gh, h):
    """The GRU update (torch's gates r, z, n) from ``gi = W_ih x + b_ih``, ``gh = W_hh h + b_hh``
    ``[..., 3h]``:  n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn)), h' = (1 − z) ⊙ n + z ⊙ h."""
    ir, iz, in_ = jnp.split(gi, 3, axis=-1)
    hr, hz, hn = jnp.split(gh, 3, axis=-1)
    r, z = jax.nn.sigmoid(ir + hr), jax.nn.sigmoid(iz + hz)
    n = jnp.tanh(in_ + r * hn)
    return (1.0 - z) * n + z * h


def gates(params: Params, kind: str, suffix: str, v, prefix: str = ""):
    """``W_{kind} v + b_{kind}`` of a torch LSTM/GRU (``kind`` "ih" or "hh")."""
    return v @ params[f"{prefix}weight_{kind}{suffix}"].T + params[f"{prefix}bias_{kind}{suffix}"]


def lstm_cell(params: Params, suffix: str, x, state, prefix: str = ""):
    """One torch LSTM(Cell) step. ``prefix`` e.g. ``"decoder."``, ``suffix`` e.g. ``"_l0"``
    (nn.LSTM) or ``""`` (nn.LSTMCell)."""
    return lstm_update(gates(params, "ih", suffix, x, prefix),
                       gates(params, "hh", suffix, state[0], prefix), state)


def gru_cell(params: Params, suffix: str, x, h, prefix: str = ""):
    """One torch GRU(Cell) step."""
    return gru_update(gates(params, "ih", suffix, x, prefix),
                      gates(params, "hh", suffix, h, prefix), h)


def _run_directions(params, prefix, suffixes, xs, mask, cell: str = "lstm"):
    """Scan D LSTMs (or GRUs) — one per ``suffixes`` entry, with its own input ``xs[d]`` — in
    one ``lax.scan`` from a zero state: ``xs [D, B, L, d]``, ``mask [B, L]`` → ``[D, B, L, h]``.
    The input projections W_ih x_t of every step are one matmul before the scan; each step
    does the D recurrent products as one batched matmul. The state is held where ``mask`` is
    False (padding after a sequence's end), outputs there are 0."""
    D, B = xs.shape[:2]
    W_hh = jnp.stack([params[f"{prefix}weight_hh{s}"] for s in suffixes])  # [D, G·h, h]
    b_hh = jnp.stack([params[f"{prefix}bias_hh{s}"] for s in suffixes])[:, None]  # [D, 1, G·h]
    gi = jnp.stack([gates(params, "ih", s, xs[d], prefix) for d, s in enumerate(suffixes)])
    hidden = W_hh.shape[-1]
    zeros = jnp.zeros((D, B, hidden), xs.dtype)

    def step(state, inp):
        gi_t, m = inp
        m = m[None, :, None]
        h = state if cell == "gru" else state[0]
        gh = jnp.einsum("dbh,dgh->dbg", h, W_hh) + b_hh
        if cell == "gru":
            h = gru_update(gi_t, gh, state)
            return jnp.where(m, h, state), jnp.where(m, h, 0.0)
        h, c = lstm_update(gi_t, gh, state)
        state = (jnp.where(m, h, state[0]), jnp.where(m, c, state[1]))
        return state, jnp.where(m, h, 0.0)

    init = zeros if cell == "gru" else (zeros, zeros)
    _, out = jax.lax.scan(step, init, (jnp.moveaxis(gi, 2, 0), mask.T))  # over L
    return jnp.moveaxis(out, 0, 2)


def bilstm(params: Params, prefix: str, xs: jnp.ndarray, mask: jnp.ndarray,
           cell: str = "lstm", layers: int = 1) -> jnp.ndarray:
    """A bidirectional torch ``nn.LSTM`` (``cell="gru"``: ``nn.GRU``) of ``layers`` stacked
    layers (layer k reads layer k−1's ``[fwd; bwd]``; torch's inter-layer dropout is a training
    device the mirror does not have) over packed sequences: ``xs [B, L, d]``, ``mask [B, L]`` (a
    prefix of True per row) → ``[B, L, 2·h]``, 0 on padding. The backward direction starts at
    each row's last real token, as ``pack_padded_sequence`` makes it; both directions run in
    one scan."""
    lengths = mask.sum(-1)
    L = xs.shape[1]
    pos = jnp.arange(L)[None, :]
    rev = jnp.where(pos < lengths[:, None], lengths[:, None] - 1 - pos, pos)  # reverse in-length
    for k in range(layers):
        xs_rev = jnp.take_along_axis(xs, rev[..., None], axis=1)
        fwd, bwd = _run_directions(params, prefix + ".", (f"_l{k}", f"_l{k}_reverse"),
                                   jnp.stack([xs, xs_rev]), mask, cell)
        bwd = jnp.take_along_axis(bwd, rev[..., None], axis=1)
        xs = jnp.concatenate([fwd, bwd], -1)
    return xs


def layer_norm(params: Params, name: str, x, eps: float = 1e-5):
    """torch.nn.LayerNorm over the last dim."""
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + eps) * params[f"{name}.weight"] + params[f"{name}.bias"]


def multi_head_attention(params: Params, name: str, q, kv, heads: int, key_padding_mask=None,
                         causal: bool = False):
    """torch.nn.MultiheadAttention (batch_first, packed in_proj): ``q [B, T, d]``, ``kv [B, S,
    d]``; ``key_padding_mask [B, S]`` True where a key is padding; ``causal``: query t sees keys
    ≤ t. Returns ``[B, T, d]``."""
    d = q.shape[-1]
    w, b = params[f"{name}.in_proj_weight"], params[f"{name}.in_proj_bias"]
    Q = q @ w[:d].T + b[:d]
    K = kv @ w[d:2 * d].T + b[d:2 * d]
    V = kv @ w[2 * d:].T + b[2 * d:]

    def split(x):
        return x.reshape(*x.shape[:-1], heads, d // heads).swapaxes(-2, -3)  # [B, H, L, dh]

    Q, K, V = split(Q), split(K), split(V)
    logits = Q @ K.swapaxes(-1, -2) / math.sqrt(d // heads)  # [B, H, T, S]
    if key_padding_mask is not None:
        logits = jnp.where(key_padding_mask[:, None, None, :], -jnp.inf, logits)
    if causal:
        T, S = logits.shape[-2:]
        logits = jnp.where(jnp.tril(jnp.ones((T, S), bool)), logits, -jnp.inf)
    out = jax.nn.softmax(logits, -1) @ V  # [B, H, T, dh]
    out = out.swapaxes(-2, -3).reshape(*q.shape[:-1], d)
    return linear(params, f"{name}.out_proj", out)


def transformer_encoder_layer(params: Params, name: str, x, heads: int, key_padding_mask):
    """torch.nn.TransformerEncoderLayer (post-norm, ReLU, no dropout)."""
    x = layer_norm(params, f"{name}.norm1", x + multi_head_attention(
        params, f"{name}.self_attn", x, x, heads, key_padding_mask))
    ff = linear(params, f"{name}.linear2", jax.nn.relu(linear(params, f"{name}.linear1", x)))
    return layer_norm(params, f"{name}.norm2", x + ff)


def transformer_decoder_layer(params: Params, name: str, x, memory, heads: int,
                              memory_key_padding_mask=None):
    """torch.nn.TransformerDecoderLayer (post-norm, ReLU, no dropout) with a causal self-mask."""
    x = layer_norm(params, f"{name}.norm1", x + multi_head_attention(
        params, f"{name}.self_attn", x, x, heads, causal=True))
    x = layer_norm(params, f"{name}.norm2", x + multi_head_attention(
        params, f"{name}.multihead_attn", x, memory, heads, memory_key_padding_mask))
    ff = linear(params, f"{name}.linear2", jax.nn.relu(linear(params, f"{name}.linear1", x)))
    return layer_norm(params, f"{name}.norm3", x + ff)
