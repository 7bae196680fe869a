"""SparseMAP: a sparse distribution over the structures of any structure that has an argmax,
written once over an operation table (:mod:`.torch_ops`, :mod:`.jax_ops`).

For potentials θ over a structure's parts (the event array: a structure z is its 0/1 event,
score ⟨z, θ⟩), SparseMAP (Niculae, Martins, Blondel & Cardie 2018, eq. 4) is

    μ* = argmax_{μ ∈ M} ⟨θ, μ⟩ − ½ ‖μ‖²  =  the Euclidean projection of θ on the marginal
    polytope M = conv{z},

and its solution is a combination μ* = Σ_k p_k z_k of a few structures: q(z_k) = p_k is a
distribution over an *active set* of structures, the rest of the (exponentially many) with
probability exactly 0. Expectations under q are exact sums over the active set — cheap where
the active set is small (Correia, Niculae, Aziz & Martins 2020, §3.2).

The solver is the active-set method of Nocedal & Wright (Algorithm 16.3) on the quadratic
programme over p (min ½ pᵀ G p − pᵀ c on the simplex, G = Z Zᵀ, c = Z θ), the structures
found by the structure's own MAP oracle, argmax_z ⟨θ − μ, z⟩ (the Frank–Wolfe vertex), as
vene/sparsemap does. Each step solves the equality-constrained programme on the working set
by its KKT system,

    [G_W  1] [p_W]   [c_W]
    [1ᵀ   0] [ν  ] = [ 1 ],

then either takes a blocking step (a weight that would turn negative leaves the set) or, when
the solution is feasible, asks the oracle for the structure of largest ⟨θ − μ, z⟩: if it beats
the active ones by more than a tolerance it joins the set, otherwise μ is optimal. The search
runs on fixed slots (``max_active`` structures) for a bounded number of steps, so it compiles
once under JAX.

**Statistics.** The quadratic need not be on the event itself. Where a structure's potentials
score a linear statistic of the event, θ = Aᵀe so that ⟨θ, z⟩ = ⟨e, A z⟩ (a segment selection
scores its coverage, :mod:`.segment_selection`), the event over-counts: ‖z‖² is the number of
its parts (a selection's segments), so the projection favours structures of few, long parts
whatever the scores say of the positions they cover. SparseMAP then regularizes the statistic,
as Niculae et al. (2018, §3) regularize only the unary parts of a factor graph:

    μ* = argmax_{μ ∈ M} ⟨θ, μ⟩ − ½ ‖A μ‖²,

the same search with G = (A Z)(A Z)ᵀ and the oracle at θ − Aᵀ A μ (``statistics``: the linear
map A as a function, whose matrix is read once from the event's unit vectors).

The backward pass: with the active set held fixed, p is the solution of the KKT system above,
a linear function of θ through c = Z θ — so p is computed once more, differentiably, from the
final active set, and automatic differentiation gives vene/sparsemap's exact backward pass
(d p = the KKT system's solution for d c = Z dθ).
"""

from __future__ import annotations

from ..core.errors import UserError
from ..core.numerics import LOG_ZERO

__all__ = ["sparsemap", "DEFAULT_MAX_ACTIVE"]

#: the active set's slots by default
DEFAULT_MAX_ACTIVE = 10


def _kkt_solve(ops, gram, c, working):
    """p on the working set ``[N, K]`` (bool): the solution of the equality-constrained
    programme's KKT system (slots outside the set: 0)."""
    K = gram.shape[-1]
    both = working[:, :, None] & working[:, None, :]
    eye = ops.cast_like(ops.arange(K, gram)[:, None] == ops.arange(K, gram)[None, :], gram)
    g = ops.where(both, gram, ops.broadcast_to(eye, tuple(gram.shape)))
    ones = ops.cast_like(working, gram)
    top = ops.concat([g, ones[:, :, None]], -1)
    bottom = ops.concat([ones[:, None, :], ops.full_like(ones[:, None, :1], 0.0)], -1)
    kkt = ops.concat([top, bottom], -2)  # [N, K + 1, K + 1]
    rhs = ops.concat([ops.where(working, c, ops.full_like(c, 0.0)),
                      ops.full_like(c[:, :1], 1.0)], -1)
    return ops.solve(kkt, rhs)[:, :K]


def sparsemap(ops, theta, argmax, event_dims: int, max_active: int = DEFAULT_MAX_ACTIVE,
              max_iter: int | None = None, statistics=None):
    """SparseMAP of ``theta [..., *event]`` (``event_dims`` trailing dimensions; the ones before
    are the batch). ``argmax(potentials)`` → the event ``[..., *event]`` of the best structure
    of each row under those potentials (the structure's MAP oracle, its lengths bound).

    Returns ``(events [K, ..., *event], probs [K, ...], converged [...], active [...])``: the
    K = ``max_active`` slots' structures (a slot out of the active set holds a structure the
    search met, with probability 0); their probabilities, differentiable in ``theta`` and
    summing to 1; whether each row's search reached the optimum (False: the slots filled up,
    or ``max_iter`` steps — default 4·K — ran out, and q is the best distribution over the
    structures found); and the active set's size. ``statistics``: the regularized statistic
    of the module docstring, a linear function ``A(events [n, *event]) → [n, F]`` (default:
    the event itself)."""
    if isinstance(max_active, bool) or not isinstance(max_active, int) or max_active < 1:
        raise UserError(f"sparsemap: max_active must be a positive integer, got {max_active!r}")
    K = max_active
    max_iter = 4 * K if max_iter is None else max_iter
    batch = tuple(theta.shape[:len(theta.shape) - event_dims])
    event = tuple(theta.shape[len(theta.shape) - event_dims:])
    D = 1
    for d in event:
        D *= d
    N = 1
    for d in batch:
        N *= d
    th = ops.stop_gradient(theta).reshape((N, D))
    if statistics is None:
        def stat(ev):  # [N, K, D] → [N, K, F]
            return ev

        def stat_adjoint(v):  # [N, F] → [N, D]
            return v
    else:  # A's matrix [D, F], from the unit vectors of the event
        units = ops.cast_like(ops.arange(D, th)[:, None] == ops.arange(D, th)[None, :], th)
        matrix = ops.stop_gradient(statistics(units.reshape((D,) + event))).reshape((D, -1))

        def stat(ev):
            return ops.einsum("nkd,df->nkf", ev, matrix)

        def stat_adjoint(v):
            return ops.einsum("nf,df->nd", v, matrix)

    def oracle(potentials):
        return ops.stop_gradient(argmax(potentials.reshape(batch + event))).reshape((N, D))

    eps = ops.eps(th)
    # the gap's tolerance is relative to the potentials of the parts a structure can hold: a
    # part none holds (LOG_ZERO, −10³⁰) would make it 10²⁴ and end every search at one structure
    live = ops.where(th > 0.5 * LOG_ZERO, th, ops.full_like(th, 0.0))
    tol = 64.0 * eps * (1.0 + ops.maximum(live, 0.0).sum(-1) + ops.maximum(-live, 0.0).sum(-1))
    z0 = oracle(th)
    slots = ops.arange(K, th)
    events = ops.broadcast_to(z0[:, None], (N, K, D)) * 1.0  # [N, K, D]: rows first
    working = ops.broadcast_to(slots[None, :] == 0, (N, K))  # [N, K]
    p = ops.cast_like(working, th)
    done = ops.full_like(th[:, 0], 0.0) > 1.0
    optimal = done
    it = ops.full_like(th[:, 0], 0.0)

    def step(carry):
        events, working, p, done, optimal, it = carry
        feats = stat(events)
        gram = ops.einsum("nkf,njf->nkj", feats, feats)
        c = ops.einsum("nkd,nd->nk", events, th)
        p_new = _kkt_solve(ops, gram, c, working)
        feasible = (working & (p_new < -1e3 * eps)).sum(-1) == 0
        # feasible: p = p_new, then the oracle's structure joins unless μ is optimal
        p1 = ops.where(working, ops.maximum(p_new, 0.0), ops.full_like(p_new, 0.0))
        mu = ops.einsum("nk,nkd->nd", p1, events)
        grad = th - stat_adjoint(ops.einsum("nk,nkf->nf", p1, feats))
        z = oracle(grad)
        gap = (grad * z).sum(-1) - (grad * mu).sum(-1)
        free = ~working
        has_free = free.sum(-1) > 0
        slot = ops.argmax(ops.cast_like(free, th), -1)  # the first free slot
        # a structure already in the set cannot improve on μ (the gap was rounding): optimal
        same = ops.cast_like(events != z[:, None], th).sum(-1) == 0  # [N, K]
        again = (working & same).sum(-1) > 0
        gap = ops.where(again, ops.full_like(gap, 0.0), gap)
        put = (gap > tol) & has_free  # [N]
        at = (slots[None, :] == slot[:, None]) & put[:, None]  # [N, K]
        events1 = ops.where(at[:, :, None], ops.broadcast_to(z[:, None], (N, K, D)), events)
        working1 = working | at
        stop1 = ~put
        # infeasible: the blocking step, the blocking slot leaves the set
        falling = working & (p_new < p)
        ratio = ops.where(falling, p / ops.where(falling, p - p_new, ops.full_like(p, 1.0)),
                          ops.full_like(p, float("inf")))
        block = ops.argmax(-ratio, -1)
        step_ = ops.take_along_last(ratio, block[:, None])[:, 0]
        step_ = ops.where(step_ < 1.0, step_, ops.full_like(step_, 1.0))
        p2 = p + step_[:, None] * (p_new - p)
        out = (slots[None, :] == block[:, None])
        p2 = ops.where(out | ~working, ops.full_like(p2, 0.0), ops.maximum(p2, 0.0))
        working2 = working & ~out
        # each row takes its branch; finished rows keep their state
        go = ~done
        f = feasible & go
        nf = ~feasible & go
        events_n = ops.where(f[:, None, None], events1, events)
        working_n = ops.where(f[:, None], working1, ops.where(nf[:, None], working2, working))
        p_n = ops.where(f[:, None], p1, ops.where(nf[:, None], p2, p))
        optimal_n = optimal | (f & (gap <= tol))
        done_n = done | (f & stop1)
        return events_n, working_n, p_n, done_n, optimal_n, it + 1.0

    def more(carry):
        return (carry[3].sum() < N) & (carry[5][0] < max_iter)

    events, working, p, done, optimal, _ = ops.while_loop(
        more, step, (events, working, p, done, optimal, it))
    # the exact backward pass: p once more from the KKT system of the final active set
    events = ops.stop_gradient(events)
    flat = theta.reshape((N, D))
    feats = stat(events)
    gram = ops.einsum("nkf,njf->nkj", feats, feats)
    c = ops.einsum("nkd,nd->nk", events, flat)
    p = _kkt_solve(ops, gram, c, working)
    p = ops.where(working & (p > 0), p, ops.full_like(p, 0.0))
    return (ops.moveaxis(events, 1, 0).reshape((K,) + batch + event),
            ops.moveaxis(p, 1, 0).reshape((K,) + batch),
            optimal.reshape(batch), ops.cast_like(working, th).sum(-1).reshape(batch))
