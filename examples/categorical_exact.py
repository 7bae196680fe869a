"""Categorical alignment, marginalized exactly: TraceEnum_ELBO with z enumerated in the model."""

import pyro
import pyro.distributions as dist
from _toy import NOISE, make_data, prior_logits, report, train
from pyro.infer import TraceEnum_ELBO

import ppl_attention as pa

values, y, _ = make_data()


def model():
    logits = prior_logits()
    with pyro.plate("seq", y.shape[0], dim=-2), pyro.plate("target", y.shape[1], dim=-1):
        ctx, _ = pa.attend("align", logits.expand(y.shape[0], -1, -1), values,
                           family=pa.Categorical(), infer={"enumerate": "parallel"})
        pyro.sample("y", dist.Normal(ctx, NOISE).to_event(1), obs=y)


def guide():  # nothing to guess: z is summed out exactly
    pass


if __name__ == "__main__":
    report("categorical / exact", train(model, guide, TraceEnum_ELBO(max_plate_nesting=2)))
