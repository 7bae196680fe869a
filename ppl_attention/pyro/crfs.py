"""Structured distributions of the structure library (:mod:`ppl_attention.structures`) as
``torch.distributions.Distribution`` — a ``pyro.sample`` site like any other. Each structure's
recursion is written once there; this module gives it PyTorch's operation table and the
distribution's interface. The NumPyro mirror is :mod:`ppl_attention.numpyro.crfs`.
"""

from __future__ import annotations

import torch
from pyro.distributions import TorchDistribution
from torch.distributions import constraints
from torch.distributions.kl import register_kl

from ..structures import torch_ops
from ..structures.ctc import CTCAlignment
from ..structures.distribution import StructuredDistribution
from ..structures.linear_chain import LinearChain
from ..structures.semi_markov import SemiMarkov
from ..structures.tree_crf import TreeCRFStructure
from .sparse import SparseMAP

__all__ = ["LinearChainCRF", "SemiMarkovCRF", "TreeCRF", "CTC"]


class _TorchStructured(StructuredDistribution, TorchDistribution):
    ops = torch_ops
    sparse_class = SparseMAP
    arg_constraints: dict = {}
    support = constraints.boolean
    has_enumerate_support = True

    def __init__(self, log_potentials: torch.Tensor, lengths=None, validate_args=None):
        batch_shape, event_shape = self._make_structure(log_potentials, lengths)
        super().__init__(torch.Size(batch_shape), torch.Size(event_shape),
                         validate_args=False)

    def sample(self, sample_shape=()):
        """Exact draws ``[*sample_shape, batch, *event]`` (torch's global generator, seeded by
        ``pyro.set_rng_seed``)."""
        return self.structure.sample(tuple(sample_shape))

    def expand(self, batch_shape, _instance=None):
        batch_shape = torch.Size(batch_shape)
        pot = self.log_potentials.expand(batch_shape + self.event_shape)
        return type(self)(pot, self.lengths.expand(batch_shape))


class LinearChainCRF(_TorchStructured):
    """A linear-chain CRF in SynJax's convention (:mod:`ppl_attention.structures.linear_chain`):
    ``log_potentials [..., n, t, t]`` — ``[i, a, b]`` scores label a at position i−1 followed
    by label b at i; at i = 0 only row a = 0 counts —, ``lengths [...]`` in 1 … n (None: n).
    An event is the indicator array of the potentials' shape (0 past a row's length);
    :func:`~ppl_attention.structures.linear_chain.labels_to_event` and
    :func:`~ppl_attention.structures.linear_chain.event_to_labels` convert."""

    structure_class = LinearChain


class SemiMarkovCRF(_TorchStructured):
    """A semi-Markov CRF in SynJax's convention (:mod:`ppl_attention.structures.semi_markov`):
    ``log_potentials [..., n, m, t, t]`` — ``[i, j, a, b]`` scores a segment that ends at
    position i, has length j + 1 and label b, after a segment labelled a (0 for the first) —,
    ``lengths [...]`` in 1 … n. An event is the indicator array of the potentials' shape, one 1
    per segment; :func:`~ppl_attention.structures.semi_markov.segments_to_event` and
    :func:`~ppl_attention.structures.semi_markov.event_to_segments` convert."""

    structure_class = SemiMarkov


class CTC(_TorchStructured):
    """CTC alignments (:mod:`ppl_attention.structures.ctc`): ``log_potentials [..., T, V]``,
    ``labels [..., L]``, ``label_lengths``, ``input_lengths``, ``blank_id``; ``log_partition``
    is log p(labels | x) = −``torch.nn.functional.ctc_loss``. An event is each frame's
    extended-label state, ``[..., 2L + 1, T]``; ``extended`` gives each row's extended labels
    (:func:`~ppl_attention.structures.ctc.event_to_frame_labels` reads an event's frame
    labels)."""

    has_enumerate_support = False

    def __init__(self, log_potentials, labels, label_lengths=None, input_lengths=None,
                 blank_id: int = 0, validate_args=None):
        self.structure = CTCAlignment(torch_ops, log_potentials, labels, label_lengths,
                                      input_lengths, blank_id)
        self._args = (log_potentials, labels, label_lengths, input_lengths, blank_id)
        TorchDistribution.__init__(self, torch.Size(self.structure.batch_shape),
                                   torch.Size(self.structure.event_shape), validate_args=False)

    @property
    def extended(self):
        return self.structure.extended

    def expand(self, batch_shape, _instance=None):
        pot, labels, ll, il, blank = self._args
        batch_shape = torch.Size(batch_shape)
        lead = lambda x: None if x is None else torch.as_tensor(x).expand(batch_shape)  # noqa: E731
        return CTC(pot.expand(batch_shape + pot.shape[-2:]),
                   torch.as_tensor(labels).expand(batch_shape + labels.shape[-1:]), lead(ll),
                   lead(il), blank)


@register_kl(LinearChainCRF, LinearChainCRF)
def _kl_chain(p, q):
    return p.kl_divergence(q)


@register_kl(CTC, CTC)
def _kl_ctc(p, q):
    return p.kl_divergence(q)


@register_kl(SemiMarkovCRF, SemiMarkovCRF)
def _kl_semi_markov(p, q):
    return p.kl_divergence(q)


class TreeCRF(_TorchStructured):
    """A constituency tree CRF in SynJax's convention (:mod:`ppl_attention.structures.tree_crf`):
    ``log_potentials [..., n, n, l]`` — ``[i, j, c]`` scores the span i … j (inclusive) with
    label c; a binary tree over L words has 2L − 1 spans, leaves and root included —,
    ``lengths [...]`` in 1 … n. An event is the indicator array of the potentials' shape, one 1
    per span; :func:`~ppl_attention.structures.tree_crf.spans_to_event` and
    :func:`~ppl_attention.structures.tree_crf.event_to_spans` convert."""

    structure_class = TreeCRFStructure


@register_kl(TreeCRF, TreeCRF)
def _kl_tree_crf(p, q):
    return p.kl_divergence(q)
