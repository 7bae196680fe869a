"""The corpus the tree taggers of the tests read (``head_tagger.py``, ``tests/user_models/
tree_tagger.py``): formulas of the built-in ``trees`` task whose target labels each word with
its head's token (``root`` for the root's child), as a user's ``--data-dir`` with gold trees
beside it as ``{split}.conllu``."""

from pathlib import Path

from ppl_attention.data import make_task, write_tsv
from ppl_attention.data.conllu import format_conllu


def write_tagged_trees(d: Path, n_train: int, n_eval: int) -> Path:
    """``train`` / ``valid`` / ``test`` ``.tsv`` and ``.conllu`` under ``d``; returns ``d``."""
    task = make_task("trees", n_train=n_train, n_eval=n_eval, depth=2)
    for name in ("train", "valid", "test"):
        split = getattr(task, name)
        pairs = [(s, [s[h] if h != m else "root" for m, h in enumerate(heads)])
                 for (s, _), heads in zip(split.pairs, split.trees)]
        write_tsv(d / f"{name}.tsv", pairs)
        (d / f"{name}.conllu").write_text("".join(
            format_conllu(s, t, i + 1) for i, ((s, _), t) in enumerate(zip(pairs, split.trees))))
    return d
