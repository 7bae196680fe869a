"""BAM-W (Fan et al. 2020): normalized Weibull attention weights,
with a key-dependent contextual prior.

As in BAM, q(S | x) uses the queries' scores (here the learned table) and not y, so it is usable
at test time; the prior p(S | keys) is a small key MLP shared by every query. TraceMeanField_ELBO
uses the analytic KL of :mod:`ppl_attention.pyro.kl`.
"""

import pyro
import pyro.distributions as dist
from _toy import NOISE, make_data, prior_logits, report, train
from pyro.infer import TraceMeanField_ELBO

import ppl_attention as pa

values, y, _ = make_data()
family = pa.Weibull(k=10.0, key_dim=2)


def model():
    pyro.module("bam_prior", family)  # the contextual prior network trains with the model
    with pyro.plate("seq", y.shape[0], dim=-2), pyro.plate("target", y.shape[1], dim=-1):
        scores = values.new_zeros(y.shape[0], y.shape[1], values.shape[0])  # unused by BAM prior
        ctx, _ = pa.attend("align", scores, values, family=family, keys=values)
        pyro.sample("y", dist.Normal(ctx, NOISE).to_event(1), obs=y)


def guide():
    logits = prior_logits()
    with pyro.plate("seq", y.shape[0], dim=-2), pyro.plate("target", y.shape[1], dim=-1):
        pa.attend("align", logits.expand(y.shape[0], -1, -1), values, family=family, guide=True)


if __name__ == "__main__":
    report("weibull", train(model, guide, TraceMeanField_ELBO(max_plate_nesting=2)))
    prior = family.prior_mean(values, values.new_ones(1, values.shape[0]).bool()).squeeze()
    print("contextual prior mean over keys:", " ".join(f"{p:.2f}" for p in prior.tolist()))
