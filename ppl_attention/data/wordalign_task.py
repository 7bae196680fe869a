"""``--task wordalign``: a synthetic parallel corpus with gold word alignments that has what
real sentence pairs have, for aligners at scale (1k–100k pairs):

- **Zipfian vocabularies**: source words drawn with p(rank r) ∝ r^−``zipf``;
- **ambiguous translations**: a share ``ambiguity`` of the source words has a second
  translation (a third of the time), half of those another word's own translation (two source
  words sharing a target word);
- **NULL-aligned words**: the most frequent source words are function words, dropped from the
  translation with probability ``drop`` (unaligned, as NULL-generated English articles would
  be in the other direction); target function words are inserted with probability ``insert``
  per source word (aligned to nothing; a *possible* link to the word after them);
- **one-to-many**: a share ``fertility`` of the source words translate to two target words
  (both linked, sure);
- **reordering**: local — a modifier word (a fifth of the vocabulary) swapped with the word
  after it with probability ``swap``; long — with probability ``long`` the sentence's last
  third moved to its front (verb-final against verb-initial).

Gold: a *sure* link from each translated source word to each of its target words, *possible*
links for the inserted ones (``Split.gold`` sure, ``Split.possible`` the possible set ⊇ sure).
The language (dictionary, classes) is fixed by ``seed``; each split has its own stream.
"""

from __future__ import annotations

import random

import numpy as np

from ..core.errors import UserError
from .splits import Split, Task

__all__ = ["wordalign_task", "WORDALIGN_DEFAULTS"]

WORDALIGN_DEFAULTS = dict(vocab=2000, min_len=5, max_len=30, zipf=1.1, ambiguity=0.3,
                          drop=0.3, insert=0.05, fertility=0.05, swap=0.5, long=0.2,
                          function_words=20)


def _language(seed: int, vocab: int, ambiguity: float, fertility: float, function_words: int):
    rng = random.Random(f"wordalign-language/{seed}")
    perm = list(range(vocab))
    rng.shuffle(perm)
    primary = [f"t{perm[e]}" for e in range(vocab)]
    translations = []
    for e in range(vocab):
        options = [(primary[e], 1.0)]
        if e >= function_words and rng.random() < ambiguity:
            other = primary[rng.randrange(vocab)] if rng.random() < 0.5 else f"u{e}"
            options = [(primary[e], 2.0), (other, 1.0)]
        translations.append(options)
    compound = {e for e in range(function_words, vocab) if rng.random() < fertility}
    modifier = {e for e in range(function_words, vocab) if rng.random() < 0.2}
    return translations, compound, modifier


def wordalign_task(n_train: int = 10_000, n_eval: int = 500, seed: int = 0,
                   **options) -> Task:
    """The corpus of the module docstring: ``n_train`` training pairs, ``n_eval`` validation
    and test pairs; ``options`` override :data:`WORDALIGN_DEFAULTS`."""
    unknown = set(options) - set(WORDALIGN_DEFAULTS)
    if unknown:
        raise UserError(f"--task wordalign: unknown option(s) {', '.join(sorted(unknown))} "
                        f"(valid: {', '.join(WORDALIGN_DEFAULTS)})")
    o = {**WORDALIGN_DEFAULTS, **options}
    if not 2 <= o["min_len"] <= o["max_len"]:
        raise UserError(f"--task wordalign: need 2 ≤ min_len ≤ max_len, got {o['min_len']}, "
                        f"{o['max_len']}")
    V, F = int(o["vocab"]), int(o["function_words"])
    if V <= F:
        raise UserError(f"--task wordalign: vocab ({V}) must exceed function_words ({F})")
    translations, compound, modifier = _language(seed, V, o["ambiguity"], o["fertility"], F)
    ranks = np.arange(1, V + 1, dtype=np.float64) ** -float(o["zipf"])
    cum = np.cumsum(ranks / ranks.sum())
    inserted = [f"f{k}" for k in range(10)]

    def sentence(rng: random.Random):
        L = rng.randint(o["min_len"], o["max_len"])
        src = [int(min(np.searchsorted(cum, rng.random()), V - 1)) for _ in range(L)]
        order = list(range(L))
        i = 0
        while i < L - 1:  # local reordering: a modifier after the word it precedes
            if src[order[i]] in modifier and rng.random() < o["swap"]:
                order[i], order[i + 1] = order[i + 1], order[i]
                i += 2
            else:
                i += 1
        if L >= 6 and rng.random() < o["long"]:  # long: the last third to the front
            cut = L - L // 3
            order = order[cut:] + order[:cut]
        tgt, sure, possible_next = [], set(), []
        for i in order:
            e = src[i]
            if rng.random() < o["insert"]:
                possible_next.append(len(tgt))
                tgt.append(inserted[rng.randrange(len(inserted))])
            if e < F and rng.random() < o["drop"]:
                continue  # a function word left untranslated: aligned to NULL
            words, weights = zip(*translations[e])
            word = rng.choices(words, weights)[0]
            pieces = [word, f"{word}_b"] if e in compound else [word]
            for w in pieces:
                sure.add((i, len(tgt)))
                tgt.append(w)
        if not tgt:  # every word dropped: keep the first one translated
            sure.add((0, 0))
            tgt.append(translations[src[0]][0][0])
        possible = set(sure)
        for j in possible_next:
            after = [i for i, jj in sure if jj == j + 1]
            possible |= {(i, j) for i in after}
        return [f"s{e}" for e in src], tgt, sure, possible

    def split(n: int, part: str) -> Split:
        rng = random.Random(f"wordalign/{seed}/{part}")
        pairs, sure, possible = [], [], []
        for _ in range(n):
            s, t, a, p = sentence(rng)
            pairs.append((s, t))
            sure.append(a)
            possible.append(p)
        return Split(pairs, sure, possible=possible)

    return Task("wordalign", split(n_train, "train"), split(n_eval, "valid"),
                split(n_eval, "test"), {**o, "seed": seed})
