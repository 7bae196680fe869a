"""Dirichlet alignment (Deng et al.'s relaxed attention), implicit reparameterization.

The prior scores are the learned table; the guide sees y. Trained with Trace_ELBO."""

import pyro
import pyro.distributions as dist
from _toy import NOISE, guide_scores, make_data, prior_logits, report, train
from pyro.infer import Trace_ELBO

import ppl_attention as pa

values, y, _ = make_data()
family = pa.Dirichlet(concentration=1.0)


def model():
    logits = prior_logits()
    with pyro.plate("seq", y.shape[0], dim=-2), pyro.plate("target", y.shape[1], dim=-1):
        ctx, _ = pa.attend("align", logits.expand(y.shape[0], -1, -1), values, family=family)
        pyro.sample("y", dist.Normal(ctx, NOISE).to_event(1), obs=y)


def guide():
    with pyro.plate("seq", y.shape[0], dim=-2), pyro.plate("target", y.shape[1], dim=-1):
        pa.attend("align", guide_scores(values, y), values, family=family, guide=True)


if __name__ == "__main__":
    report("dirichlet", train(model, guide, Trace_ELBO(max_plate_nesting=2)))
