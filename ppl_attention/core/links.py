"""Alignment links from MAP positions, for both backends (pure Python over batch arrays)."""

from __future__ import annotations

__all__ = ["links_from_positions"]


def links_from_positions(run, batches: list, map_fn) -> dict[int, set[tuple[int, int]]]:
    """Corpus index → MAP links {(source i, target j)} over real target tokens (not <eos>);
    ``map_fn(run, batch) -> [B, T]`` gives each target token's MAP source position (torch or
    NumPy; anything indexable), or ``[B, T, S]`` bool every position it links to (a selection
    of segments; none at all is possible)."""
    out = {}
    for b in batches:
        a = map_fn(run, b)
        lengths = (b.tgt_mask.sum(-1) - 1).tolist()  # drop <eos>
        for r, idx in enumerate(b.index.tolist()):
            if a.ndim == 3:  # a selection of positions per token
                out[idx] = {(int(i), j) for j in range(int(lengths[r]))
                            for i in range(a.shape[2]) if bool(a[r, j, i])}
            else:
                out[idx] = {(int(a[r, j]), j) for j in range(int(lengths[r]))}
    return out
