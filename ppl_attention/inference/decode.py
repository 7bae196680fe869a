"""Greedy and beam-search decoding of a trained model with the ``predictive`` capability
(:mod:`ppl_attention.models.base`): ``start_decoding`` / ``decoding_step`` /
``keep_hypotheses`` give p(y_t | x, y<t) — for ``Seq2SeqAlignment`` the exact predictive
Σ_j p(z_t = j | x, y<t) p(y_t | z_t = j, x, y<t) of a categorical alignment (the forward filter
of the Markov family; the mean context for the other families)."""

from __future__ import annotations

import math

import torch

from ..data.batching import collate
from ..errors import MissingCapability, UserError
from ..models.base import declared, require
from ..models.device import model_device

__all__ = ["beam_search", "check_ensemble", "decode_tokens", "prefix_accuracy"]


class _Stepper:
    """One model's side of a search: its decoding state, one row per live hypothesis."""

    def __init__(self, run, source: list[str]):
        self.model = run.model
        self.model.eval()
        b = collate([(source, [])], [0], run.src_vocab, run.tgt_vocab)
        b = b.to(model_device(self.model))
        self.state = self.model.start_decoding(b.src, b.src_mask)

    def log_probs(self, prev: torch.Tensor) -> torch.Tensor:
        """log p(y_t = · | x, y<t) ``[k, V]`` for the k live hypotheses whose last tokens are
        ``prev [k]``."""
        logp, self.state = self.model.decoding_step(self.state, prev)
        return logp

    def keep(self, rows: torch.Tensor, toks: torch.Tensor) -> None:
        """Hypothesis ``rows[i]`` continued by ``toks[i]`` becomes live hypothesis i."""
        self.state = self.model.keep_hypotheses(self.state, rows, toks)


def check_ensemble(runs) -> list:
    """``runs`` (one Run or several) as a list, after checking that they can decode together:
    models with the ``predictive`` capability and the same source and target vocabularies."""
    runs = list(runs) if isinstance(runs, (list, tuple)) else [runs]
    if not runs:
        raise UserError("no run to decode with")
    first = runs[0]
    for r in runs:
        if declared(r.model, "backend") != "pyro":
            raise MissingCapability(f"decoding runs a Pyro model's predictive; "
                                    f"{type(r.model).__name__} (a run of {r.method}) is a NumPyro "
                                    f"model, which decode does not serve in this version")
        require(r.model, "predictive", tool="decoding")
        for side in ("src_vocab", "tgt_vocab"):
            if getattr(r, side).itos != getattr(first, side).itos:
                raise UserError(f"runs in an ensemble need the same vocabularies: the "
                                 f"{side.split('_')[0]} vocabulary of run {r.method!r} differs "
                                 f"from the first run's (train them on the same data)")
    return runs


@torch.no_grad()
def beam_search(run, source: list[str], beam: int = 1, max_len: int | None = None
                ) -> tuple[list[str], float]:
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
    runs = check_ensemble(run)
    tv = runs[0].tgt_vocab
    steppers = [_Stepper(r, source) for r in runs]
    log_m = math.log(len(runs))
    max_len = max_len or 2 * len(source) + 10
    device = model_device(runs[0].model)  # an ensemble's models live together
    prev = torch.tensor([tv.bos], device=device)
    hyps: list[tuple[list[int], float]] = [([], 0.0)]
    finished: list[tuple[list[int], float]] = []
    for _ in range(max_len):
        logp = torch.stack([s.log_probs(prev) for s in steppers]).logsumexp(0) - log_m  # [k, V]
        for special in (tv.pad, tv.bos):
            logp[:, special] = -torch.inf
        total = torch.tensor([s for _, s in hyps], device=device).unsqueeze(1) + logp
        top = total.flatten().topk(min(beam, total.numel()))
        new_hyps, rows, toks = [], [], []
        for score, idx in zip(top.values.tolist(), top.indices.tolist()):
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
        prev = torch.tensor(toks, device=device)
        for s in steppers:
            s.keep(torch.tensor(rows, device=device), prev)
    pool = finished or hyps
    ids, score = max(pool, key=lambda x: x[1])
    return [tv.itos[i] for i in ids], score


def decode_tokens(run, sources: list[list[str]], beam: int = 1) -> list[list[str]]:
    return [beam_search(run, s, beam)[0] for s in sources]


def prefix_accuracy(run, pairs: list, progress: bool = False) -> dict:
    """Greedy decoding of each pair's source scored against its target: ``prefix_accuracy``,
    the share of target tokens right before the first error (Kim et al. 2017's "percentage of
    output tokens correct before the first error", pooled over tokens), ``sequence_accuracy``
    (the share of exact matches) and ``n_decoded``."""
    from ..core.progress import progress_bar

    correct = total = exact = 0
    for src, tgt in progress_bar(pairs, disable=not progress, desc="decode", leave=False):
        hyp, _ = beam_search(run, list(src), 1, max_len=2 * len(tgt) + 10)
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
                     progress: bool = False) -> dict:
    """Decode every word (its letters as the source) and score WER / PER against all its
    reference pronunciations; with stress digits in the references, also stress-stripped.
    ``run``: a Run, or a list of runs decoding as an ensemble (see :func:`beam_search`)."""
    from ..core.progress import progress_bar
    from ..metrics import wer_per

    run = check_ensemble(run)
    hyps = {w: beam_search(run, list(w), beam)[0]
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
