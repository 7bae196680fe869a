"""Numerical constants both backends share.

``LOG_ZERO``: the finite stand-in for log 0 wherever a log-probability or a score must be
impossible but stay differentiable — exp(LOG_ZERO) underflows to exactly 0 in float32 and
float64, and unlike −∞ it gives no NaN in gradients (0 · ∞) or in log-sum-exp over an
all-masked row. A masked position *at the top of the model* is −∞ (the families refuse it in
scores); inside recursions (semirings, chains, trees) it is ``LOG_ZERO``."""

LOG_ZERO = -1e30
