"""Connectionist temporal classification as a structured distribution over alignments.

``log_potentials [..., T, V]`` (frame scores over the vocabulary, blank included),
``labels [..., L]`` (the target, padded past ``label_lengths``), ``input_lengths`` T' ≤ T
(None: T), ``label_lengths`` L' ≤ L (None: L), ``blank_id``. The extended labels are
(blank, l_1, blank, l_2, …, l_{L'}, blank), S' = 2L' + 1 states; a path π_0 … π_{T'−1} moves
from a state to itself, to the next, or skips a blank to the next label where that label
differs from the one before; it starts at state 0 or 1 and ends at S' − 1 or S' − 2. Its score
is Σ_t log_softmax(log_potentials)[t, ext(π_t)], so

    log Z = log p(labels | x) = −ctc_loss

(``torch.nn.functional.ctc_loss`` and ``optax.ctc_loss``). An event is the indicator of each
frame's extended-label state, ``[..., 2L + 1, T]`` (0 past T' and past S').

The recursion (over any semiring ⊕, ⊗ = +), θ_t(s) the frame's score of state s:

    α_0(s) = θ_0(s) for s ∈ {0, 1},  α_t(s) = ⊕(α_{t−1}(s), α_{t−1}(s − 1), α_{t−1}(s − 2) if
    the skip is allowed) + θ_t(s),    log Z = ⊕_{s ∈ {S'−1, S'−2}} α_{T'−1}(s)
"""

from __future__ import annotations

import numpy as np

from ..core.errors import UserError
from ..core.numerics import LOG_ZERO
from .structure import Structure


def ctc_value(ops, semiring, theta, aux, key=None):
    """⊕ over every allowed path of its score ``[...]``; ``theta [..., S, T]``, ``aux`` =
    (input_lengths [...], skip [..., S], final [..., S]) (the recursion above)."""
    input_lengths, skip, final = aux
    S, T = theta.shape[-2], theta.shape[-1]
    states = ops.arange(S, theta)
    alpha = ops.lift(semiring, ops.where(states < 2, theta[..., 0], LOG_ZERO))  # [..., S]
    if T > 1:
        frames = ops.moveaxis(theta[..., 1:], -1, 0)  # [T − 1, ..., S]
        positions = ops.arange(T - 1, theta) + 1
        # α carried with two log-0 states in front, so that staying, moving one state and
        # skipping a blank are three views of it (s, s − 1, s − 2); a skip where the labels
        # either side are equal (or s is a blank) adds log 0
        low = ops.full_last(alpha, 2, LOG_ZERO)
        no_skip = ops.where(skip, 0.0, ops.full_like(theta[..., 0], LOG_ZERO))  # [..., S]

        def step(padded, x):
            th, t = x
            stay, move = padded[..., 2:], padded[..., 1:-1]
            jump = padded[..., :-2] + no_skip
            new = ops.plus_of(semiring, (stay, move, jump), ops.fold_in(key, t)) + th
            return ops.where((t < input_lengths)[..., None], ops.concat([low, new], -1),
                             padded)

        alpha = ops.scan(step, ops.concat([low, alpha], -1), (frames, positions))[..., 2:]
    return ops.plus(semiring, ops.where(final, alpha, LOG_ZERO), -1, ops.fold_in(key, T))


class CTCAlignment(Structure):
    """CTC (module docstring) for :class:`Structure`'s operations: its potentials are the
    frames' scores of the extended-label states, ``[..., 2L + 1, T]``."""

    event_dims = 2
    name = "CTC"
    no_evidence_because = ("its potentials are the frames' scores before log_softmax (each "
                           "path's score is normalized per frame), so evidence φ added to them "
                           "is not a factor over the parts; add φ to the log-likelihood of your "
                           "model instead")

    def __init__(self, ops, log_potentials, labels, label_lengths=None, input_lengths=None,
                 blank_id: int = 0):
        self.ops = ops
        shape = tuple(log_potentials.shape)
        if len(shape) < 2:
            raise UserError(f"CTC: log_potentials must be [..., T, V], got shape {shape}")
        T, V = shape[-2], shape[-1]
        lab = np.asarray(ops.concrete(ops.to_index(labels)))
        if lab.ndim < 1 or lab.shape[:-1] != shape[:-2]:
            raise UserError(f"CTC: labels must be [..., L] with the batch shape "
                            f"{shape[:-2]} of log_potentials [..., T, V], got {lab.shape}")
        if not isinstance(blank_id, int | np.integer) or not 0 <= blank_id < V:
            raise UserError(f"CTC: blank_id must be a vocabulary index in 0 … {V - 1}, got "
                            f"{blank_id!r}")
        L = lab.shape[-1]
        ll = (np.full(shape[:-2], L) if label_lengths is None
              else np.broadcast_to(np.asarray(ops.concrete(ops.to_index(label_lengths))),
                                   shape[:-2]))
        il = (np.full(shape[:-2], T) if input_lengths is None
              else np.broadcast_to(np.asarray(ops.concrete(ops.to_index(input_lengths))),
                                   shape[:-2]))
        if ll.size and (ll.min() < 0 or ll.max() > L):
            raise UserError(f"CTC: label_lengths must lie in 0 … {L}, got {ll.min()} … "
                            f"{ll.max()}")
        if il.size and (il.min() < 1 or il.max() > T):
            raise UserError(f"CTC: input_lengths must lie in 1 … {T}, got {il.min()} … "
                            f"{il.max()}")
        real = np.arange(L) < ll[..., None]
        if (real & ((lab < 0) | (lab >= V))).any():
            raise UserError(f"CTC: labels must be vocabulary indices in 0 … {V - 1}, got "
                            f"{lab[real].min()} … {lab[real].max()}")
        if (real & (lab == blank_id)).any():
            raise UserError(f"CTC: a label equals the blank ({blank_id}); labels are the "
                            f"non-blank symbols")
        if ops.any_nan(log_potentials):
            raise UserError("CTC: log_potentials hold NaN or +inf")
        needed = ll + np.where(real[..., 1:] & (lab[..., 1:] == lab[..., :-1]), 1, 0).sum(-1) \
            if L > 1 else ll
        short = needed > il
        if short.any():
            row = tuple(int(i) for i in np.argwhere(short)[0])
            raise UserError(f"CTC: row {row if len(row) != 1 else row[0]} has "
                            f"{int(il[row])} frames but its labels need at least "
                            f"{int(needed[row])} (one per label, one more per repeat)")
        S = 2 * L + 1
        ext = np.full(shape[:-2] + (S,), blank_id)
        ext[..., 1::2] = np.where(real, lab, blank_id)
        s_row = 2 * ll + 1
        states = np.arange(S)
        inside = states < s_row[..., None]
        previous = np.concatenate([np.full(shape[:-2] + (2,), -1), ext[..., :-2]], -1)
        skip = (states % 2 == 1) & (states >= 3) & (ext != previous) & inside
        final = (states == s_row[..., None] - 1) | (states == s_row[..., None] - 2)
        logp = ops.log_softmax(log_potentials, -1)  # [..., T, V]
        theta = ops.take_last(logp, ops.from_numpy_int(ext, log_potentials))  # [..., T, S]
        theta = ops.moveaxis(theta, -1, -2)  # [..., S, T]
        theta = ops.where(ops.from_numpy_bool(inside[..., None], log_potentials), theta,
                          LOG_ZERO)
        self.log_potentials = theta
        self.batch_shape = shape[:-2]
        self.event_shape = (S, T)
        self.extended = ext
        self.lengths = (ops.from_numpy_int(il, log_potentials),
                        ops.from_numpy_bool(skip, log_potentials),
                        ops.from_numpy_bool(final, log_potentials))
        self.input_lengths, self.state_counts, self.skip = il, s_row, skip

    @staticmethod
    def value(ops, semiring, theta, aux, key=None):
        return ctc_value(ops, semiring, theta, aux, key)

    def _same(self, other) -> None:
        """Two CTCs compare (cross-entropy, KL) only over the same alignments: the same
        extended labels and frames on every row, not only the same shape."""
        super()._same(other)
        if not (np.array_equal(self.extended, other.extended)
                and np.array_equal(self.input_lengths, other.input_lengths)
                and np.array_equal(self.state_counts, other.state_counts)):
            raise UserError("CTC: the other CTC must align the same labels (label_lengths, "
                            "blank_id) over the same input_lengths on every row: KL and "
                            "cross-entropy are sums over one set of alignments")

    @staticmethod
    def size(theta) -> int:
        return theta.shape[-1]

    def sample(self, sample_shape=(), key=None):
        shape = tuple(sample_shape) + tuple(self.log_potentials.shape)
        theta = self.ops.expand(self.ops.stop_gradient(self.log_potentials), shape)
        lead = tuple(sample_shape) + self.batch_shape
        il, skip, final = self.lengths
        aux = (self.ops.expand(il, lead), self.ops.expand(skip, lead + skip.shape[-1:]),
               self.ops.expand(final, lead + final.shape[-1:]))
        return self.ops.grad(lambda th: self.ops.compiled(self.value)(
            self.ops, "sample", th, aux, key), theta)

    def invalid(self, events) -> str | None:
        """Why NumPy ``events [..., S, T]`` are not allowed paths (None when they all are)."""
        if not np.isin(events, (0, 1)).all():
            return "entries must be 0 or 1"
        lead = events.shape[:-2]
        il = np.broadcast_to(self.input_lengths, lead).reshape(-1)
        sr = np.broadcast_to(self.state_counts, lead).reshape(-1)
        skip = np.broadcast_to(self.skip, lead + self.skip.shape[-1:]).reshape(
            -1, self.skip.shape[-1])
        for ev, t_len, s_len, sk in zip(events.reshape((-1,) + events.shape[-2:]), il, sr,
                                        skip, strict=True):
            per_frame = ev.sum(0)
            if (per_frame[:t_len] != 1).any() or (per_frame[t_len:] != 0).any():
                return "each frame within the input length holds exactly one state, none past it"
            path = ev[:, :t_len].argmax(0)
            if path[0] > 1 or path[-1] < s_len - 2 or path.max() >= s_len:
                return "a path starts at state 0 or 1 and ends at one of the last two states"
            steps = np.diff(path)
            if (steps < 0).any() or (steps > 2).any() or (
                    (steps == 2) & ~sk[path[1:]]).any():
                return ("a path moves to the same state, the next, or skips a blank between "
                        "two different labels")
        return None


def event_to_frame_labels(event, extended) -> list:
    """Each frame's vocabulary label (blank included) of one event ``[S, T]``, given the row's
    extended labels ``[S]``, up to the first frame without a state."""
    ev = np.asarray(event)
    out = []
    for t in range(ev.shape[1]):
        hit = np.flatnonzero(ev[:, t] > 0.5)
        if not len(hit):
            break
        out.append(int(np.asarray(extended)[hit[0]]))
    return out


__all__ = ["CTCAlignment", "ctc_value", "event_to_frame_labels"]
