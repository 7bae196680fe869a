"""Greedy and beam-search decoding, for both backends: the search is written here once, over
a backend's *stepper* — ``stepper.log_probs(prev) -> [k, V]`` (NumPy: log p(y_t = · | x, y<t)
of the k live hypotheses whose last tokens are ``prev``) and ``stepper.keep(rows, tokens)``
(hypothesis ``rows[i]`` continued by ``tokens[i]`` becomes live hypothesis i) — which each
backend builds from a model's ``predictive`` capability (``start_decoding`` /
``decoding_step`` / ``keep_hypotheses``): ``ppl_attention.pyro.inference.decode`` under Pyro,
``ppl_attention.numpyro.inference.decode`` under NumPyro."""

from __future__ import annotations

import math

import numpy as np

from ..core.errors import UserError
from .backends import get_backend
from .contract import declared, require

__all__ = ["beam_search", "check_ensemble", "decode_tokens", "prefix_accuracy",
           "word_error_rates", "steppers"]


def check_ensemble(runs, backend: str | None = None) -> list:
    """``runs`` (one Run or several) as a list, after checking that they can decode together:
    models with the ``predictive`` capability, one backend, the same vocabularies."""
    runs = list(runs) if isinstance(runs, (list, tuple)) else [runs]
    if not runs:
        raise UserError("no run to decode with")
    first = runs[0]
    for r in runs:
        require(r.model, "predictive", tool="decoding")
        for side in ("src_vocab", "tgt_vocab"):
            if getattr(r, side).itos != getattr(first, side).itos:
                raise UserError(f"runs in an ensemble need the same vocabularies: the "
                                 f"{side.split('_')[0]} vocabulary of run {r.method!r} differs "
                                 f"from the first run's (train them on the same data)")
    backends = {backend or declared(r.model, "backend") for r in runs}
    if len(backends) > 1:
        raise UserError("runs in an ensemble decode under one backend: give --backend")
    return runs


def steppers(runs, source: list[str], backend: str | None = None) -> list:
    """One stepper per run for ``source`` (each run's backend, or ``backend`` for all)."""
    return [get_backend(backend or declared(r.model, "backend")).stepper(r, source)
            for r in runs]


def beam_search(run, source: list[str], beam: int = 1, max_len: int | None = None,
                backend: str | None = None) -> tuple[list[str], float]:
    """The best target sequence for one source (a list of tokens) and its log-probability.
    ``beam=1`` is greedy decoding. Hypotheses end at ``<eos>``; the search stops when the best
    finished hypothesis scores at least as well as every live one (scores only fall).

    ``run`` may be a list of runs (an ensemble, same vocabularies): each step then scores with
    the mixture of their predictives, p(y_t | x, y<t) = (1/M) Σ_m p_m(y_t | x, y<t), every
    model conditioned on the same prefix (its own decoder state and alignment filter)."""
    if beam < 1:
        raise UserError(f"beam must be at least 1, got {beam}")
    if not source:
        raise UserError("empty source sequence")
    runs = check_ensemble(run, backend)
    tv = runs[0].tgt_vocab
    steps = steppers(runs, source, backend)
    log_m = math.log(len(runs))
    max_len = max_len or 2 * len(source) + 10
    prev = [tv.bos]
    hyps: list[tuple[list[int], float]] = [([], 0.0)]
    finished: list[tuple[list[int], float]] = []
    for _ in range(max_len):
        each = np.stack([np.asarray(s.log_probs(prev), dtype=np.float64) for s in steps])
        m = each.max(0)
        logp = m + np.log(np.exp(each - m).sum(0)) - log_m  # [k, V]
        for special in (tv.pad, tv.bos):
            logp[:, special] = -np.inf
        total = np.array([s for _, s in hyps])[:, None] + logp
        flat = total.ravel()
        n = min(beam, flat.size)
        top = np.argsort(-flat, kind="stable")[:n]
        new_hyps, rows, toks = [], [], []
        for idx in top.tolist():
            score = float(flat[idx])
            r, tok = divmod(idx, logp.shape[1])
            if tok == tv.eos:
                finished.append((hyps[r][0], score))
            else:
                new_hyps.append((hyps[r][0] + [tok], score))
                rows.append(r)
                toks.append(tok)
        best_done = max((s for _, s in finished), default=-float("inf"))
        if not new_hyps or best_done >= max(s for _, s in new_hyps):
            break
        hyps = new_hyps
        prev = toks
        for s in steps:
            s.keep(rows, toks)
    pool = finished or hyps
    ids, score = max(pool, key=lambda x: x[1])
    return [tv.itos[i] for i in ids], score


def decode_tokens(run, sources: list[list[str]], beam: int = 1,
                  backend: str | None = None) -> list[list[str]]:
    return [beam_search(run, s, beam, backend=backend)[0] for s in sources]


def prefix_accuracy(run, pairs: list, progress: bool = False,
                    backend: str | None = None) -> dict:
    """Greedy decoding of each pair's source scored against its target: ``prefix_accuracy``,
    the share of target tokens right before the first error (Kim et al. 2017's "percentage of
    output tokens correct before the first error", pooled over tokens), ``sequence_accuracy``
    (the share of exact matches) and ``n_decoded``."""
    from ..core.progress import progress_bar

    correct = total = exact = 0
    for src, tgt in progress_bar(pairs, disable=not progress, desc="decode", leave=False):
        hyp, _ = beam_search(run, list(src), 1, max_len=2 * len(tgt) + 10, backend=backend)
        n = 0
        for a, b in zip(hyp, tgt):
            if a != b:
                break
            n += 1
        correct += n
        total += len(tgt)
        exact += list(hyp) == list(tgt)
    return {"prefix_accuracy": correct / max(1, total),
            "sequence_accuracy": exact / max(1, len(pairs)), "n_decoded": len(pairs)}


def word_error_rates(run, references: dict[str, list[list[str]]], beam: int = 1,
                     progress: bool = False, backend: str | None = None) -> dict:
    """Decode every word (its letters as the source) and score WER / PER against all its
    reference pronunciations; with stress digits in the references, also stress-stripped.
    ``run``: a Run, or a list of runs decoding as an ensemble (see :func:`beam_search`)."""
    from ..core.progress import progress_bar
    from .metrics import wer_per

    run = check_ensemble(run, backend)
    hyps = {w: beam_search(run, list(w), beam, backend=backend)[0]
            for w in progress_bar(sorted(references), disable=not progress, desc="decode",
                                  leave=False)}
    wer, per = wer_per(hyps, references)
    out = {"wer": wer, "per": per, "beam": beam, "n_words": len(hyps)}
    if len(run) > 1:
        out["ensemble"] = len(run)
    if any(ch.isdigit() for refs in references.values() for r in refs for p in r for ch in p):
        def strip(seq):
            return [p.rstrip("012") for p in seq]

        wer_s, per_s = wer_per({w: strip(h) for w, h in hyps.items()},
                               {w: [strip(r) for r in refs] for w, refs in references.items()})
        out.update(wer_stress_stripped=wer_s, per_stress_stripped=per_s)
    return out
