"""Greedy and beam-search decoding of a trained Seq2SeqAlignment with the exact predictive
p(y_t | x, y<t) = Σ_j p(z_t = j | x, y<t) p(y_t | z_t = j, x, y<t) for categorical alignments
(soft attention for the other families; see ``Seq2SeqAlignment.predictive_log_probs``)."""

from __future__ import annotations

import torch

from ..data.batching import collate

__all__ = ["beam_search", "decode_tokens"]


@torch.no_grad()
def beam_search(run, source: list[str], beam: int = 1, max_len: int | None = None
                ) -> tuple[list[str], float]:
    """The best target sequence for one source (a list of tokens) and its log-probability.
    ``beam=1`` is greedy decoding. Hypotheses end at ``<eos>``; the search stops when the best
    finished hypothesis scores at least as well as every live one (scores only fall)."""
    if beam < 1:
        raise ValueError(f"beam must be at least 1, got {beam}")
    if not source:
        raise ValueError("empty source sequence")
    model, tv = run.model, run.tgt_vocab
    model.eval()
    b = collate([(source, [])], [0], run.src_vocab, tv)
    max_len = max_len or 2 * len(source) + 10
    H = model.encode(b.src, b.src_mask)
    state = model.initial_state(H)
    prev = torch.tensor([tv.bos])
    hyps: list[tuple[list[int], float]] = [([], 0.0)]
    finished: list[tuple[list[int], float]] = []
    log_filter = joint = None  # the Markov family's p(z_{t-1} | x, y<t) per hypothesis
    for _ in range(max_len):
        k = len(hyps)
        Hk, mk = H.expand(k, -1, -1), b.src_mask.expand(k, -1)
        state, e = model.decoder_step(Hk, mk, model.tgt_emb(prev), state)
        if model.markov:
            logp, joint = model.markov_predictive(Hk, mk, state, e, log_filter)
            logp = logp.clone()
        else:
            logp = model.predictive_log_probs(Hk, mk, state, e)  # [k, V]
        for special in (tv.pad, tv.bos):
            logp[:, special] = -torch.inf
        total = torch.tensor([s for _, s in hyps]).unsqueeze(1) + logp
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
        index = torch.tensor(rows)
        state = tuple(x[index] for x in state)
        prev = torch.tensor(toks)
        if joint is not None:
            picked = joint[index, :, prev]  # [k', S]
            log_filter = picked - picked.logsumexp(-1, keepdim=True)
    pool = finished or hyps
    ids, score = max(pool, key=lambda x: x[1])
    return [tv.itos[i] for i in ids], score


def decode_tokens(run, sources: list[list[str]], beam: int = 1) -> list[list[str]]:
    return [beam_search(run, s, beam)[0] for s in sources]


def word_error_rates(run, references: dict[str, list[list[str]]], beam: int = 1,
                     progress: bool = False) -> dict:
    """Decode every word (its letters as the source) and score WER / PER against all its
    reference pronunciations; with stress digits in the references, also stress-stripped."""
    from tqdm.auto import tqdm

    from ..metrics import wer_per

    hyps = {w: beam_search(run, list(w), beam)[0]
            for w in tqdm(sorted(references), disable=not progress, desc="decode", leave=False)}
    wer, per = wer_per(hyps, references)
    out = {"wer": wer, "per": per, "beam": beam, "n_words": len(hyps)}
    if any(ch.isdigit() for refs in references.values() for r in refs for p in r for ch in p):
        def strip(seq):
            return [p.rstrip("012") for p in seq]

        wer_s, per_s = wer_per({w: strip(h) for w, h in hyps.items()},
                               {w: [strip(r) for r in refs] for w, refs in references.items()})
        out.update(wer_stress_stripped=wer_s, per_stress_stripped=per_s)
    return out
