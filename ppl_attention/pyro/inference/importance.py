"""The importance-corrected posterior under Pyro: K draws of a run's guide per sentence, their
log weights by the model's own densities, and the values the link marginals average — the
arrays :mod:`ppl_attention.common.importance_weights` smooths and weighs (its docstring has the
maths)."""

from __future__ import annotations

import numpy as np
import pyro
import torch
from pyro import poutine
from pyro.poutine.messenger import Messenger

from ...common.importance_weights import check_importance
from ...core.errors import UserError
from ..attend import recording
from ..models.base import declared
from ..models.device import model_device
from .evaluate import _per_pair, guide_posterior

__all__ = ["importance_arrays", "check_importance"]


class _Fixed(Messenger):
    """The guide site ``site`` takes ``value`` instead of a draw — still a latent (not
    observed) site, so the model replays it as it would a draw."""

    def __init__(self, site: str, value):
        super().__init__()
        self.site, self.value = site, value

    def _pyro_sample(self, msg):
        if msg["name"] == self.site:
            msg["value"], msg["done"] = self.value, True


def _values(model, call, node, batch) -> torch.Tensor:
    """What one draw contributes to the link marginals: the attention weights ``[B, T, S]``
    (one-hot of a categorical z), or for a tree family the arc indicators ``[B, S, S]``."""
    fam = model.family
    S = batch.src.shape[1]
    if fam.latent_context:  # the context vector itself
        return node["value"].float()
    if getattr(fam, "tree", False):
        heads = node["value"].reshape(batch.size, -1, S)[:, 0]
        return torch.nn.functional.one_hot(heads.long(), S).transpose(-1, -2).float()
    if fam.enumerable:
        return torch.nn.functional.one_hot(node["value"].long(), S).float()
    return call.weights.float()


@torch.no_grad()
def importance_arrays(run, batch, k: int, seed: int = 0, draws=None, wrap_guide=None) -> dict:
    """``log_w [K, B]`` (float64), ``log_q [K, B]``, ``values [K, B, …]`` and ``token_ll
    [K, B, T]`` (log p(y_t | ·, z_k) of the observed sites) of K draws of the run's guide on
    ``batch`` (numpy), with Pyro's RNG seeded by ``seed``; ``draws`` (the guide
    site's K values, ``[K, …]``) fixes the draws instead (backends compared on the same ones)."""
    model = run.model
    batch = batch.to(model_device(model))
    site = declared(model, "site")
    post = guide_posterior(run)
    base_guide = model.guide if wrap_guide is None else wrap_guide(model.guide)
    pyro.set_rng_seed(seed)
    log_w, log_q, values, token_ll = [], [], [], []
    B, T = batch.tgt_out.shape
    for i in range(k):
        guide = base_guide if draws is None else _Fixed(
            site, torch.as_tensor(np.asarray(draws[i]), device=batch.src.device))(base_guide)
        with recording() as calls, poutine.block():
            g = poutine.trace(guide).get_trace(batch, posterior=post)
            mt = poutine.trace(poutine.replay(model.model, trace=g)).get_trace(batch)
        g.compute_log_prob()
        mt.compute_log_prob()
        lq = _per_pair(g, batch)
        log_w.append(_per_pair(mt, batch) - lq)
        log_q.append(lq)
        call = next((c for c in calls if c.name == site and c.guide), None)
        if call is None:
            raise UserError(f"the guide wrote no site {site!r} (declare the model's `site`)")
        values.append(_values(model, call, g.nodes[site], batch))
        token_ll.append(torch.broadcast_to(_observed(mt, site), (B, T)))
    return {"log_w": torch.stack(log_w).double().cpu().numpy(),
            "log_q": torch.stack(log_q).double().cpu().numpy(),
            "values": torch.stack(values).cpu().numpy().astype(np.float32),
            "token_ll": torch.stack(token_ll).cpu().numpy().astype(np.float32)}


def _observed(trace, skip: str):
    """Σ of the observed sites' log-densities per token (those under the target plate)."""
    total = 0.0
    for name, site in trace.nodes.items():
        if site["type"] == "sample" and site["is_observed"] and name != skip \
                and not name.startswith("_"):
            total = total + site["log_prob"]
    return total
