"""Dependency trees as head sequences, for both backends (pure Python and NumPy): what a tree is,
which trees exist, the MAP tree of a non-projective distribution, and the attachment score.

A tree over the first L of N positions is ``heads [N]`` (integers): ``heads[m] = h`` when word h
heads word m, ``heads[m] = m`` when m hangs from the root; positions m ≥ L (padding) hold their
own index. Arc scores follow the same convention: ``scores[h, m]`` is the arc h → m and the
diagonal ``scores[m, m]`` the arc root → m (torch-struct's ``DependencyCRF`` convention).

- a tree is *single-rooted* when exactly one word hangs from the root;
- it is *projective* when the yield of every word is a contiguous interval — equivalently, for
  every arc h → m each word strictly between h and m descends from h (arcs drawn above the
  sentence do not cross, the root sitting left of the first word).

:func:`chu_liu_edmonds` finds the highest-scoring tree among all (non-projective) trees
(Chu & Liu 1965; Edmonds 1967), the single-root constraint by the root-penalty construction: a
constant larger than the range of any two trees' scores is subtracted from every root arc, so
the best tree has exactly one root arc and, among those, the highest score.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

from .errors import UserError

__all__ = ["tree_problem", "check_trees", "is_projective", "enumerate_trees", "chu_liu_edmonds",
           "attachment_score", "conll_heads", "parse_conll_heads"]


def _children(heads, L: int) -> list[list[int]]:
    kids: list[list[int]] = [[] for _ in range(L)]
    for m in range(L):
        h = int(heads[m])
        if h != m:
            kids[h].append(m)
    return kids


def _descendants_ok(heads, L: int) -> bool:
    """Does every word reach the root without a cycle?"""
    state = [0] * L  # 0 unseen, 1 on the current path, 2 reaches the root
    for start in range(L):
        path, m = [], start
        while state[m] == 0:
            state[m] = 1
            path.append(m)
            h = int(heads[m])
            if h == m:
                break
            m = h
        else:
            if state[m] == 1:
                return False
        for v in path:
            state[v] = 2
    return True


def is_projective(heads, L: int | None = None) -> bool:
    """Is the tree ``heads`` (over its first L words) projective?"""
    L = len(heads) if L is None else L
    kids = _children(heads, L)
    lo, hi = list(range(L)), list(range(L))  # the yield of each word, bottom-up

    def span(m):
        for c in kids[m]:
            span(c)
            lo[m], hi[m] = min(lo[m], lo[c]), max(hi[m], hi[c])

    size = [1] * L

    def count(m):
        for c in kids[m]:
            count(c)
            size[m] += size[c]

    for r in range(L):
        if int(heads[r]) == r:
            span(r)
            count(r)
    return all(hi[m] - lo[m] + 1 == size[m] for m in range(L))


def tree_problem(heads, L: int, *, projective: bool, single_root: bool) -> str | None:
    """What is wrong with ``heads`` as a tree of its first ``L`` words (None: nothing)."""
    for m in range(L):
        h = int(heads[m])
        if not 0 <= h < L:
            return f"the head {h} of word {m} is outside the sentence of length {L}"
    for m in range(L, len(heads)):
        if int(heads[m]) != m:
            return f"padded position {m} (length {L}) must hold its own index, holds {heads[m]}"
    roots = sum(int(heads[m]) == m for m in range(L))
    if roots == 0 or not _descendants_ok(heads, L):
        return "the heads contain a cycle"
    if single_root and roots > 1:
        return f"{roots} words hang from the root; single_root allows one"
    if projective and not is_projective(heads, L):
        return "the tree is not projective (arcs cross), given to a projective distribution"
    return None


def check_trees(heads: np.ndarray, lengths: np.ndarray, *, projective: bool, single_root: bool,
                what: str = "heads") -> None:
    """Refuse, naming the first bad row, ``heads [..., N]`` that are not trees of ``lengths``."""
    heads = np.asarray(heads)
    flat, lens = heads.reshape(-1, heads.shape[-1]), np.broadcast_to(
        np.asarray(lengths), heads.shape[:-1]).reshape(-1)
    for r, (row, L) in enumerate(zip(flat, lens)):
        problem = tree_problem(row, int(L), projective=projective, single_root=single_root)
        if problem is not None:
            index = list(np.unravel_index(r, heads.shape[:-1])) if heads.ndim > 1 else []
            raise UserError(f"{what}{[int(i) for i in index]} is not a tree: {problem}")


@functools.lru_cache(maxsize=64)
def _trees(L: int, projective: bool, single_root: bool) -> np.ndarray:
    rows = [seq for seq in itertools.product(range(L), repeat=L)
            if tree_problem(seq, L, projective=projective, single_root=single_root) is None]
    return np.asarray(rows, dtype=np.int64).reshape(-1, L)


def enumerate_trees(L: int, N: int | None = None, *, projective: bool = True,
                    single_root: bool = True) -> np.ndarray:
    """Every tree of ``L`` words as heads ``[n_trees, N]`` (padding N − L positions with their own
    index); brute force, for L ≤ 7."""
    if L > 7:
        raise UserError(f"enumerating every tree is for sentences of at most 7 words, got {L}")
    N = L if N is None else N
    trees = _trees(L, projective, single_root)
    pad = np.broadcast_to(np.arange(L, N), (trees.shape[0], N - L))
    return np.concatenate([trees, pad], 1)


def _best_arborescence(w: np.ndarray) -> np.ndarray:
    """Max spanning arborescence of node 0 (the root) in the dense graph ``w[h, m]`` (h → m);
    returns the head of every node (−1 for the root). Recursive cycle contraction."""
    n = w.shape[0]
    w = w.copy()
    np.fill_diagonal(w, -np.inf)
    w[:, 0] = -np.inf
    heads = w.argmax(0)
    heads[0] = -1
    cycle = _find_cycle(heads)
    if cycle is None:
        return heads
    in_cycle = np.zeros(n, bool)
    in_cycle[cycle] = True
    rest = np.flatnonzero(~in_cycle)  # the root is never in a cycle
    c = len(rest)
    cyc = np.asarray(cycle)
    gain = w[:, cyc] - w[heads[cyc], cyc][None, :]  # entering the cycle at v replaces v's arc
    nw = np.full((c + 1, c + 1), -np.inf)
    nw[:c, :c] = w[np.ix_(rest, rest)]
    enter = cyc[gain[rest].argmax(1)]  # for each outside u, the cycle node it enters
    nw[:c, c] = gain[rest].max(1)
    leave = cyc[w[np.ix_(cyc, rest)].argmax(0)]  # for each outside u, its best head in the cycle
    nw[c, :c] = w[np.ix_(cyc, rest)].max(0)
    sub = _best_arborescence(nw)
    out = heads.copy()
    for i, u in enumerate(rest):
        if u == 0:
            continue
        out[u] = leave[i] if sub[i] == c else rest[sub[i]]
    h = sub[c]  # the arc entering the contracted cycle
    out[enter[h]] = rest[h]
    return out


def _find_cycle(heads: np.ndarray) -> list[int] | None:
    n = len(heads)
    color = np.zeros(n, np.int8)
    for start in range(1, n):
        path, v = [], start
        while v > 0 and color[v] == 0:
            color[v] = 1
            path.append(v)
            v = heads[v]
        if v > 0 and color[v] == 1:
            return path[path.index(v):]
        for u in path:
            color[u] = 2
    return None


def chu_liu_edmonds(scores: np.ndarray, L: int, *, single_root: bool = True) -> np.ndarray:
    """The highest-scoring (non-projective) tree of the first ``L`` words of ``scores [N, N]``
    (diagonal: root arcs), as heads ``[N]``."""
    scores = np.asarray(scores, dtype=np.float64)
    N = scores.shape[-1]
    w = np.full((L + 1, L + 1), -np.inf)
    sub = scores[:L, :L]
    w[1:, 1:] = sub
    w[0, 1:] = np.diagonal(sub)
    if single_root and L > 1:
        finite = sub[np.isfinite(sub)]
        penalty = 1.0 + L * (float(finite.max() - finite.min()) if finite.size else 0.0)
        w[0, 1:] -= penalty
    heads = _best_arborescence(w)[1:] - 1
    out = np.arange(N)
    out[:L] = np.where(heads < 0, np.arange(L), heads)
    return out


def attachment_score(predicted: list, gold: list) -> float:
    """Unlabelled attachment score: the share of words whose predicted head is the gold one,
    over every word of every sentence (``predicted``/``gold``: head sequences of equal
    lengths, the convention of this module)."""
    if len(predicted) != len(gold):
        raise UserError(f"{len(predicted)} predicted trees but {len(gold)} gold ones")
    hit = n = 0
    for i, (p, g) in enumerate(zip(predicted, gold)):
        if len(p) != len(g):
            raise UserError(f"tree {i}: {len(p)} predicted heads for {len(g)} gold ones")
        hit += sum(int(a) == int(b) for a, b in zip(p, g))
        n += len(g)
    return hit / max(1, n)


def conll_heads(heads, L: int) -> list[int]:
    """CoNLL-U's HEAD column of a tree: 1-based heads, 0 for the root."""
    return [0 if int(heads[m]) == m else int(heads[m]) + 1 for m in range(L)]


def parse_conll_heads(column: list[int]) -> list[int]:
    """The inverse of :func:`conll_heads`."""
    return [m if h == 0 else h - 1 for m, h in enumerate(column)]
