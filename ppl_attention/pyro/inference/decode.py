"""Decoding under Pyro: the stepper of a Pyro model with the ``predictive`` capability
(:mod:`ppl_attention.pyro.models.base`) — ``start_decoding`` / ``decoding_step`` /
``keep_hypotheses`` give p(y_t | x, y<t), for ``Seq2SeqAlignment`` the exact predictive
Σ_j p(z_t = j | x, y<t) p(y_t | z_t = j, x, y<t) of a categorical alignment (the forward filter
of the Markov family; the mean context for the other families) — that the search of
:mod:`ppl_attention.common.decoding` drives. ``beam_search`` & co. are re-exported from there."""

from __future__ import annotations

import torch

from ...common.decoding import (
    beam_search,
    check_ensemble,
    decode_tokens,
    prefix_accuracy,
    word_error_rates,
)
from ...data.batching import collate
from ..models.device import model_device

__all__ = ["TorchStepper", "stepper", "beam_search", "check_ensemble", "decode_tokens",
           "prefix_accuracy", "word_error_rates"]


class TorchStepper:
    """One Pyro model's side of a search: its decoding state, one row per live hypothesis."""

    def __init__(self, run, source: list[str]):
        self.model = run.model
        self.model.eval()
        self.device = model_device(self.model)
        b = collate([(source, [])], [0], run.src_vocab, run.tgt_vocab).to(self.device)
        self.state = self.model.start_decoding(b.src, b.src_mask)

    @torch.no_grad()
    def log_probs(self, prev) -> torch.Tensor:
        logp, self.state = self.model.decoding_step(
            self.state, torch.tensor(list(prev), device=self.device))
        return logp.cpu().numpy()

    @torch.no_grad()
    def keep(self, rows, tokens) -> None:
        self.state = self.model.keep_hypotheses(
            self.state, torch.tensor(list(rows), device=self.device),
            torch.tensor(list(tokens), device=self.device))


def stepper(run, source: list[str]) -> TorchStepper:
    return TorchStepper(run, source)
