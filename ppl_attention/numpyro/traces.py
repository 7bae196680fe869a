"""Reading a NumPyro trace the way every loss and tool of the NumPyro side needs it: a guide's
draws replayed into the model *with their intermediates*, and a site's log-density computed from
them.

NumPyro's own ``handlers.replay`` copies a guide site's value into the model but not its
intermediates, so the model scores the value alone. For a relaxed categorical draw that is
wrong wherever a coordinate underflowed (its log is in the intermediates,
:class:`~ppl_attention.numpyro.distributions.MaskedRelaxedCategorical`); replayed through
:func:`replay`, the model's site carries the same intermediates and :func:`site_log_prob` scores
both sides of the ELBO at the exact draw, as the torch side does with ``value._pa_log_value``.
"""

from __future__ import annotations

from numpyro import handlers

__all__ = ["replay", "site_log_prob"]


class replay(handlers.replay):  # noqa: N801 (a handler, named as NumPyro's)
    """``numpyro.handlers.replay`` that also copies each replayed site's intermediates."""

    def process_message(self, msg):
        super().process_message(msg)
        if msg["type"] == "sample" and not msg["is_observed"] and msg["name"] in self.trace:
            msg["intermediates"] = list(self.trace[msg["name"]].get("intermediates") or [])


def site_log_prob(site, scaled: bool = True):
    """The log-density of a sample site at its value, from its intermediates where it has any
    (as NumPyro's ELBOs compute it), times the site's scale when ``scaled``."""
    inter = site.get("intermediates")
    lp = site["fn"].log_prob(site["value"], inter) if inter else site["fn"].log_prob(site["value"])
    scale = site.get("scale")
    return lp * scale if scaled and scale is not None else lp
