"""Structured distributions written once: each structure's dynamic program is one function of a
semiring and a table of array operations (:mod:`.torch_ops` for PyTorch, :mod:`.jax_ops` for
JAX), and every exact operation — log Z, marginals, the MAP structure, exact samples, entropy,
cross-entropy, KL, ``log_prob`` — follows from it (:mod:`.structure`). The backends serve them as
distributions: ``pa.LinearChainCRF`` (a ``torch.distributions.Distribution``, a ``pyro.sample``
site) and ``pa.numpyro.LinearChainCRF`` (a NumPyro distribution).

Nothing here imports torch or JAX at module level but the two operation tables.
"""
