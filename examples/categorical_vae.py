"""Categorical alignment with an amortized guide q(z | x, y), trained by REINFORCE (TraceGraph_ELBO
with a decaying-average baseline)."""

import pyro
import pyro.distributions as dist
from _toy import NOISE, guide_scores, make_data, prior_logits, report, train
from pyro.infer import TraceGraph_ELBO

import ppl_attention as pa

values, y, _ = make_data()


def model():
    logits = prior_logits()
    with pyro.plate("seq", y.shape[0], dim=-2), pyro.plate("target", y.shape[1], dim=-1):
        ctx, _ = pa.attend("align", logits.expand(y.shape[0], -1, -1), values,
                           family=pa.Categorical())
        pyro.sample("y", dist.Normal(ctx, NOISE).to_event(1), obs=y)


def guide():
    with pyro.plate("seq", y.shape[0], dim=-2), pyro.plate("target", y.shape[1], dim=-1):
        pa.attend("align", guide_scores(values, y), values, family=pa.Categorical(), guide=True,
                  infer={"baseline": {"use_decaying_avg_baseline": True}})


if __name__ == "__main__":
    elbo = TraceGraph_ELBO(max_plate_nesting=2)
    report("categorical / score function", train(model, guide, elbo))
