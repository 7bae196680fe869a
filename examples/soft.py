"""Soft attention: no latent variable; the prior table is fit by maximum likelihood."""

import pyro
import pyro.distributions as dist
from _toy import NOISE, make_data, prior_logits, report, train
from pyro.infer import Trace_ELBO

import ppl_attention as pa

values, y, _ = make_data()


def model():
    logits = prior_logits()
    with pyro.plate("seq", y.shape[0], dim=-2), pyro.plate("target", y.shape[1], dim=-1):
        ctx, _ = pa.attend("align", logits.expand(y.shape[0], -1, -1), values, family=pa.Soft())
        pyro.sample("y", dist.Normal(ctx, NOISE).to_event(1), obs=y)


def guide():
    pass


if __name__ == "__main__":
    report("soft", train(model, guide, Trace_ELBO(max_plate_nesting=2)))
    print("(soft attention averages the values, so its table need not match the truth:"
          " E[f(z)] ≠ f(E[z]))")
