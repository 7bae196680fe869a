"""Structured distributions of the structure library (:mod:`ppl_attention.structures`) as
NumPyro distributions — a ``numpyro.sample`` site like any other; the mirror of
:mod:`ppl_attention.pyro.crfs`, from the same recursion on JAX's operation table."""

from __future__ import annotations

import jax.numpy as jnp
from numpyro.distributions import Distribution, constraints
from numpyro.distributions.kl import kl_divergence

from ..structures import jax_ops
from ..structures.ctc import CTCAlignment
from ..structures.distribution import StructuredDistribution
from ..structures.linear_chain import LinearChain
from ..structures.semi_markov import SemiMarkov
from ..structures.tree_crf import TreeCRFStructure
from .sparse import SparseMAP, kl_sparsemap

__all__ = ["LinearChainCRF", "SemiMarkovCRF", "TreeCRF", "CTC"]


class _StructureEvents(type(constraints.boolean)):
    """0/1 arrays, a structure's events. Which of them are structures depends on the
    distribution (its lengths), so no value is feasible for every instance: ``feasible_like``
    refuses, and NumPyro's ``MaskedDistribution.log_prob`` then scores the value at masked
    positions as it is (a draw of the structure) instead of swapping in zeros — which are no
    structure, and ``log_prob`` refuses them."""

    def feasible_like(self, prototype):
        raise NotImplementedError


class _JaxStructured(StructuredDistribution, Distribution):
    ops = jax_ops
    sparse_class = SparseMAP
    arg_constraints: dict = {}
    support = _StructureEvents()
    has_enumerate_support = True
    #: a draw is discrete: no pathwise gradient. NumPyro reads ``has_rsample`` from the
    #: parameters declared reparameterized, and with no declared parameters it would say True
    #: (its ELBOs would then take the zero gradient of a draw instead of scoring it)
    has_rsample = False

    def __init__(self, log_potentials, lengths=None, *, validate_args=None):
        batch_shape, event_shape = self._make_structure(jnp.asarray(log_potentials), lengths)
        super().__init__(batch_shape, event_shape, validate_args=False)

    def sample(self, key, sample_shape=()):
        """Exact draws ``[*sample_shape, batch, *event]``."""
        return self.structure.sample(tuple(sample_shape), key)

    def expand(self, batch_shape):
        batch_shape = tuple(batch_shape)
        pot = jnp.broadcast_to(self.log_potentials, batch_shape + self.event_shape)
        return type(self)(pot, jnp.broadcast_to(self.lengths, batch_shape))


class LinearChainCRF(_JaxStructured):
    """As :class:`ppl_attention.pyro.crfs.LinearChainCRF`: ``log_potentials [..., n, t, t]``,
    ``lengths [...]``; events are indicator arrays of the potentials' shape."""

    structure_class = LinearChain


class SemiMarkovCRF(_JaxStructured):
    """As :class:`ppl_attention.pyro.crfs.SemiMarkovCRF`: ``log_potentials [..., n, m, t, t]``,
    ``lengths [...]``; events are indicator arrays of the potentials' shape."""

    structure_class = SemiMarkov


class CTC(_JaxStructured):
    """As :class:`ppl_attention.pyro.crfs.CTC`: ``log_partition`` is log p(labels | x) =
    −``optax.ctc_loss``; events ``[..., 2L + 1, T]``."""

    has_enumerate_support = False

    def __init__(self, log_potentials, labels, label_lengths=None, input_lengths=None,
                 blank_id: int = 0, *, validate_args=None):
        self.structure = CTCAlignment(jax_ops, jnp.asarray(log_potentials), labels,
                                      label_lengths, input_lengths, blank_id)
        self._args = (jnp.asarray(log_potentials), jnp.asarray(labels), label_lengths,
                      input_lengths, blank_id)
        Distribution.__init__(self, self.structure.batch_shape, self.structure.event_shape,
                              validate_args=False)

    @property
    def extended(self):
        return self.structure.extended

    def expand(self, batch_shape):
        pot, labels, ll, il, blank = self._args
        batch_shape = tuple(batch_shape)
        lead = lambda x: None if x is None else jnp.broadcast_to(x, batch_shape)  # noqa: E731
        return CTC(jnp.broadcast_to(pot, batch_shape + pot.shape[-2:]),
                   jnp.broadcast_to(labels, batch_shape + labels.shape[-1:]), lead(ll),
                   lead(il), blank)


@kl_divergence.register(LinearChainCRF, LinearChainCRF)
def _kl_chain(p, q):
    return p.kl_divergence(q)


@kl_divergence.register(CTC, CTC)
def _kl_ctc(p, q):
    return p.kl_divergence(q)


@kl_divergence.register(SemiMarkovCRF, SemiMarkovCRF)
def _kl_semi_markov(p, q):
    return p.kl_divergence(q)


class TreeCRF(_JaxStructured):
    """As :class:`ppl_attention.pyro.crfs.TreeCRF`: ``log_potentials [..., n, n, l]``,
    ``lengths [...]``; events are indicator arrays of the potentials' shape."""

    structure_class = TreeCRFStructure


@kl_divergence.register(TreeCRF, TreeCRF)
def _kl_tree_crf(p, q):
    return p.kl_divergence(q)


for _cls in (LinearChainCRF, SemiMarkovCRF, TreeCRF, CTC):
    kl_divergence.register(SparseMAP, _cls)(kl_sparsemap)
