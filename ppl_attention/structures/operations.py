"""The operations a structure's recursion may use, declared once: each backend's table
(:mod:`~ppl_attention.structures.torch_ops`, :mod:`~ppl_attention.structures.jax_ops`) defines
exactly these functions, with these parameters (``tests/structures/test_operations.py`` holds
both tables to this list). A recursion (``structure.py``'s ``value`` and the charts it calls)
reaches arrays only through them, so it is written once for both backends.

Shapes: ``[...]`` is any batch; ``semiring`` is a name of :mod:`.semirings`.
"""

from __future__ import annotations

__all__ = ["OPERATIONS"]

#: name → (its parameters, what it computes)
OPERATIONS: dict[str, tuple[tuple[str, ...], str]] = {
    # the semiring's operations
    "plus": (("semiring", "x", "dim", "key"), "⊕ of x over dim (key: the sampling semiring's "
             "draw)"),
    "plus_of": (("semiring", "xs", "key"), "⊕ of a few arrays of one shape, elementwise"),
    "times": (("semiring", "a", "b"), "⊗ of two semiring values (k-best: the k best pairwise "
              "sums)"),
    "lift": (("semiring", "x"), "scores as semiring values (k-best: [x, log 0, …] on a leading "
             "axis of k)"),
    "logmatmulexp": (("a", "b"), "(A ⊗ B)[i, j] = log Σ_k exp(A[i, k] + B[k, j])"),
    "maxmatmul": (("a", "b"), "(A ⊙ B)[i, j] = max_k A[i, k] + B[k, j]"),
    # loops
    "scan": (("step", "carry", "xs"), "carry = step(carry, x) over xs' leading axis; the last "
             "carry"),
    "scan_collect": (("step", "carry", "xs", "reverse"), "carry, y = step(carry, x) over xs' "
                     "leading axis; the last carry and the ys stacked"),
    "associative_scan": (("op", "elems", "axis"), "inclusive prefix scan by an associative op"),
    "while_loop": (("cond", "body", "carry"), "carry = body(carry) while cond(carry)"),
    "width_loop": (("step", "n", "charts"), "charts = step(k, charts) for k = 1 … n − 1"),
    "compiled": (("value",), "the recursion compiled where the backend compiles (JAX: jit)"),
    # building and reshaping arrays
    "where": (("cond", "a", "b"), "elementwise a where cond, else b"),
    "arange": (("n", "like"), "0 … n − 1 on like's device"),
    "full_like": (("x", "value"), "x's shape, dtype and device, filled with value"),
    "full_last": (("like", "k", "value"), "like's shape with k in the last axis, filled with "
                  "value"),
    "stack": (("xs", "dim"), "the arrays stacked on a new axis dim"),
    "concat": (("xs", "dim"), "the arrays joined along dim"),
    "moveaxis": (("x", "src", "dst"), "x with axis src moved to dst"),
    "broadcast_to": (("x", "shape"), "x broadcast to shape"),
    "expand": (("x", "shape"), "x expanded to shape (a view where the backend has views)"),
    "band_windows": (("x", "size", "width"), "x [..., size + width − 1] → [..., size, width], "
                     "[j, d] = x[j + width − 1 − d]"),
    "pad_last": (("x", "axis", "before", "after", "value"), "x padded with value along a "
                 "negative axis"),
    "take_last": (("x", "index"), "x [..., T, V] at index [..., S] → [..., T, S]"),
    "take_along_last": (("x", "index"), "x [..., V] at index [..., K] → [..., K], leading axes "
                        "broadcast"),
    "diag": (("x", "offset"), "x [..., n, n]'s entries (i, i + offset)"),
    "einsum": (("spec", "xs"), "Einstein summation"),
    # elementwise and reductions
    "log": (("x",), "log x"),
    "exp": (("x",), "exp x"),
    "log_softmax": (("x", "dim"), "log softmax over dim"),
    "cumsum": (("x", "dim"), "cumulative sum over dim"),
    "sort_desc": (("x",), "x sorted along its last axis, largest first (differentiable)"),
    "argmax": (("x", "dim"), "the index of the largest entry along dim"),
    "clip": (("x", "low", "high"), "x clipped to [low, high]"),
    "maximum": (("x", "value"), "elementwise max(x, value)"),
    "floor_at": (("x", "value"), "max(x, value)"),
    "solve": (("a", "b"), "x with a x = b, a [..., n, n], b [..., n] (a singular: the "
              "least-squares solution of least norm)"),
    # differentiation
    "grad": (("f", "x"), "∂ Σ f(x) / ∂x"),
    "stop_gradient": (("x",), "x, with no gradient through it"),
    "custom_backward": (("fwd", "bwd", "x", "aux"), "y = fwd(x, *aux) whose backward pass is "
                        "bwd(x, y, g, *aux)"),
    # randomness
    "gumbel": (("key", "like"), "standard Gumbel noise of like's shape, dtype and device"),
    "fold_in": (("key", "i"), "the key of step i (torch: unused)"),
    # dtypes, devices and host values
    "as_bool": (("x",), "x as booleans"),
    "to_index": (("x",), "x as an integer index array"),
    "cast_like": (("x", "like"), "x in like's dtype and device"),
    "from_numpy": (("array", "like"), "a NumPy array in like's dtype and device"),
    "from_numpy_int": (("array", "like"), "a NumPy integer array on like's device"),
    "from_numpy_bool": (("array", "like"), "a NumPy boolean array on like's device"),
    "concrete": (("x",), "x as NumPy (None where it holds no values: traced, or on the meta "
                 "device)"),
    "any_nan": (("x",), "whether x holds NaN or +inf"),
    "eps": (("like",), "the machine epsilon of like's dtype"),
    "on_accelerator": (("like",), "whether like lives on an accelerator"),
    "lengths_of": (("lengths", "batch_shape", "n", "like"), "lengths as integers of "
                   "batch_shape on like's device (None: n; None where they do not fit)"),
    # the charts of the span recursions (the constituency tree, Eisner's algorithm)
    "chart_new": (("first",), "a chart whose width-0 column is first [..., n]"),
    "chart_pairs": (("a_s", "b_e", "k", "total", "a_min", "b_min"), "the split pairs of the "
                    "spans of width k"),
    "chart_arc": (("theta", "k", "leftward"), "θ at the spans (s, s + k), rightward or "
                  "leftward"),
    "chart_set": (("chart", "col", "k", "by_end"), "the chart with width k's items set"),
}
