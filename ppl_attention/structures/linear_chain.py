"""A linear-chain CRF over label sequences, in SynJax's convention.

``log_potentials [..., n, t, t]``: ``log_potentials[i, a, b]`` scores label a at position i−1
followed by label b at position i; at i = 0 only row a = 0 counts (the initial state). A
sequence y_0 … y_{L−1} (L = ``lengths``, 1 ≤ L ≤ n) scores

    s(y) = Σ_{i<L} log_potentials[i, y_{i−1}, y_i],    y_{−1} = 0,

and p(y) = exp(s(y) − log Z). An event is the indicator array of the potentials' shape:
``event[i, a, b] = 1`` where y_{i−1} = a and y_i = b (i < L), 0 elsewhere — positions past a
row's length included.

The recursion (forward algorithm over any semiring ⊕, ⊗ = +):

    α_0(b) = θ_0(0, b),    α_i(b) = ⊕_a α_{i−1}(a) + θ_i(a, b)  (i < L),    log Z = ⊕_b α_{L−1}(b)
"""

from __future__ import annotations

from ..core.errors import UserError
from ..core.numerics import LOG_ZERO
from .structure import Structure


def chain_forward(ops, semiring, alpha, steps, keep, contract, key=None, normalize=False,
                  filters=True):
    """The one forward recursion of every chain in the package (this structure, the monotonic
    alignment's banded chain, the Markov family and the word aligners' HMM are its clients):

        α_i = contract(α_{i−1}, steps[i], key_i)  where keep[i],  else α_i = α_{i−1},

    ``alpha [..., t]`` α_0 as semiring values, ``steps`` a tuple of arrays whose leading axis
    (n − 1) runs over the positions after the first, ``keep [n − 1, ...]`` bool (None: every
    step kept, no selection made — every row full). Returns the last α. With ``normalize``
    (the log or the probability semiring), each kept α_i is divided by its sum c_i = ⊕ α_i
    and the result is ``(α_last, (filters [n − 1, ..., t], c [n − 1, ...]))`` (c the
    semiring's one on a step not kept), so that log Z = Σ_i log c_i (in log space Σ_i c_i)
    and filters_i = p(z_i | evidence ≤ i); with ``filters=False`` only ``(c,)`` is
    collected. Under PROB a step whose c is 0 keeps its predecessor (and reports c = 0)."""
    count = steps[0].shape[0]
    if count == 0:
        return (alpha, None) if normalize else alpha
    positions = ops.arange(count, steps[0]) + 1
    if keep is None:
        keep = ops.full_like(positions, 1) > 0  # [n − 1], broadcast over the batch
        if not normalize:
            return ops.scan(lambda a, x: contract(a, *x[:-1], ops.fold_in(key, x[-1])), alpha,
                            (*steps, positions))

    def step(alpha, x):
        *inputs, kept, i = x
        new = contract(alpha, *inputs, ops.fold_in(key, i))
        if not normalize:
            return ops.where(kept[..., None], new, alpha)
        c = ops.plus(semiring, new, -1)
        ok = kept & ops.normalizer_ok(semiring, c)
        safe = ops.where(ok, c, ops.one(semiring))
        alpha = ops.where(ok[..., None], ops.divide(semiring, new, safe[..., None]), alpha)
        c = ops.where(kept, c, ops.one(semiring))
        return alpha, ((alpha, c) if filters else (c,))

    xs = (*steps, keep, positions)
    return ops.scan_collect(step, alpha, xs) if normalize else ops.scan(step, alpha, xs)


def dense_contract(ops, semiring):
    """The chain's step over dense transitions: α_i(b) = ⊕_a α_{i−1}(a) + θ_i(a, b)."""
    def contract(alpha, theta, key):
        return ops.plus(semiring, alpha[..., :, None] + theta, -2, key)
    return contract


def chain_value(ops, semiring, log_potentials, lengths, key=None):
    """⊕ over every label sequence of its score ``[...]`` (the recursion of the module
    docstring: :func:`chain_forward` over dense transitions)."""
    n = log_potentials.shape[-3]
    alpha = ops.lift(semiring, log_potentials[..., 0, 0, :])  # [..., t]
    steps = (ops.moveaxis(log_potentials[..., 1:, :, :], -3, 0),)  # [n−1, ..., t, t]
    keep = _kept(ops, n, lengths, log_potentials)
    alpha = chain_forward(ops, semiring, alpha, steps, keep, dense_contract(ops, semiring), key)
    return ops.plus(semiring, alpha, -1, ops.fold_in(key, n))


def _kept(ops, n, lengths, like):
    """``[n − 1, ...]``: position i + 1 lies within its row's length (None: every row full)."""
    if lengths is None:
        return None
    positions = ops.arange(n - 1, like) + 1  # [n−1]
    return ops.moveaxis(positions < lengths[..., None], -1, 0)


class LinearChain(Structure):
    """The linear-chain structure (module docstring) for :class:`Structure`'s operations."""

    event_dims = 3
    name = "LinearChainCRF"
    full_lengths_as_none = True

    @staticmethod
    def check(log_potentials, lengths) -> None:
        shape = tuple(log_potentials.shape)
        if len(shape) < 3 or shape[-1] != shape[-2]:
            raise UserError(f"LinearChainCRF: log_potentials must be [..., n, t, t] (label a at "
                            f"i−1 followed by b at i), got shape {shape}")

    @staticmethod
    def value(ops, semiring, log_potentials, lengths, key=None):
        return chain_value(ops, semiring, log_potentials, lengths, key)

    @staticmethod
    def all_events(event_shape, length: int):
        """The event of every label sequence of ``length`` (nested lists; small sizes)."""
        import itertools

        n, t = event_shape[0], event_shape[-1]
        for labels in itertools.product(range(t), repeat=length):
            yield labels_to_event(labels, n, t)

    @staticmethod
    def invalid_events(events, lengths):
        """Why NumPy ``events [..., n, t, t]`` are not label sequences of ``lengths [...]``
        (None when they all are)."""
        import numpy as np

        n = events.shape[-3]
        if not np.isin(events, (0, 1)).all():
            return "entries must be 0 or 1"
        real = np.arange(n) < lengths[..., None]  # [..., n]
        per_position = events.sum((-1, -2))
        if (per_position[real] != 1).any():
            return "each position within the length holds exactly one transition a → b"
        if (per_position[~real] != 0).any():
            return "positions past a row's length hold no transition"
        if events[..., 0, 1:, :].any():
            return "at position 0 only row a = 0 (the initial state) counts"
        came = events[..., :-1, :, :].sum(-2)  # [..., n−1, t]: the label at i
        left = events[..., 1:, :, :].sum(-1)  # [..., n−1, t]: the label before i + 1
        inside = real[..., 1:]
        if (came[inside] != left[inside]).any():
            return "a transition a → b at i + 1 must start from the label b of position i"
        return None


def labels_to_event(labels, n: int, t: int) -> list:
    """The event (nested lists ``[n][t][t]``) of a label sequence."""
    ev = [[[0.0] * t for _ in range(t)] for _ in range(n)]
    prev = 0
    for i, b in enumerate(labels):
        ev[i][prev][b] = 1.0
        prev = b
    return ev


def event_to_labels(event) -> list:
    """The label sequence of one event (``[n, t, t]``, NumPy or nested lists): each position's
    b where its row holds a transition, up to the first empty position."""
    import numpy as np

    ev = np.asarray(event)
    labels = []
    for i in range(ev.shape[0]):
        hit = np.argwhere(ev[i] > 0.5)
        if not len(hit):
            break
        labels.append(int(hit[0][1]))
    return labels


__all__ = ["LinearChain", "chain_forward", "dense_contract", "chain_value", "labels_to_event",
           "event_to_labels"]


def segment_potentials(ops, scores, mask, transitions):
    """Kim et al. (2017)'s segmentation attention as a binary linear chain: labels s_j ∈ {0, 1}
    over the source positions, ``scores [..., S]`` the unary potential of s_j = 1 (0 for
    s_j = 0), ``transitions [2, 2]`` A[s_{j−1}, s_j], and the positions a bool ``mask [..., S]``
    leaves out taken out of the chain (their neighbours become adjacent). As potentials of
    :class:`LinearChain` ``[..., S, 2, 2]`` (t = 2):

        θ_j(a, b) = A[a, b] + u_j(b)    a real position after the first,
        θ_j(a, b) = u_j(b)              the first real position (no predecessor),
        θ_j(a, b) = 0 if a = b else log 0    a masked one (the label carried through),

    so log Z and the marginals p(s_j = 1) = Σ_a μ_j(a, 1) are the chain's."""
    two = ops.arange(2, scores)
    carry = ops.cast_like(ops.where(two[:, None] == two[None, :], 0.0, LOG_ZERO), scores)
    unary = ops.stack([scores * 0, scores], -1)[..., None, :]  # [..., S, 1, 2]
    real = ops.cast_like(mask, scores)
    after_first = (ops.cumsum(real, -1) - real) > 0  # a real position before j
    own = ops.where(after_first[..., None, None], transitions + unary, unary + carry * 0)
    return ops.where(mask[..., None, None], own, carry)


def segment_log_partition(ops, scores, mask, transitions):
    """log Z ``[...]`` of :func:`segment_potentials`' chain."""
    return LinearChain(ops, segment_potentials(ops, scores, mask, transitions)).log_partition()


def segment_marginals(ops, scores, mask, transitions):
    """p(s_j = 1) ``[..., S]`` (0 where masked) of :func:`segment_potentials`' chain: the
    gradient of the one chain recursion's log Z, Σ_a μ_j(a, 1)."""
    chain = LinearChain(ops, segment_potentials(ops, scores, mask, transitions))
    selected = chain.marginals()[..., 1].sum(-1)
    return ops.where(mask, selected, selected * 0)


def hmm_potentials(ops, start, transitions, emissions):
    """An HMM's chain over T steps with the evidence, as :class:`LinearChain` potentials
    ``[..., T, S, S]`` (t = S states): ``start [..., S]`` log p(z_0), ``transitions
    [..., T, S, S]`` log p(z_t = b | z_{t−1} = a) (step 0's unused), ``emissions [..., T, S]``
    log p(y_t | z_t):

        θ_0(0, b) = log p(z_0 = b) + log p(y_0 | b),    θ_t(a, b) = log p(b | a) + log p(y_t | b),

    so that log Z over the first L steps is log p(y_0 … y_{L−1}) and the chain's marginals
    Σ_a μ_t(a, b) are p(z_t = b | y)."""
    first = ops.concat([(start + emissions[..., 0, :])[..., None, None, :],
                        ops.full_like(transitions[..., :1, 1:, :], LOG_ZERO)], -2)
    rest = transitions[..., 1:, :, :] + emissions[..., 1:, None, :]
    return ops.concat([first, rest], -3)
