"""A user's model with a CTC alignment as its latent structure, written from the docs.

The ``durations`` task renders each source symbol as a run of noisy frames. Read backwards it is
a speech-like problem: from the frames, recognise the symbols. A small network gives each frame
a distribution over the symbols and the blank, and the alignment of frames to symbols is a CTC
path, summed out exactly: log p(symbols | frames) = ``pa.CTC(...).log_partition`` (the negative
CTC loss). After training, the MAP path (``argmax``) labels every frame with a symbol of the
sequence or the blank; the generator's gold says which symbol each frame renders, so the frame
accuracy of the alignment can be checked.

    cd examples/structures && python ctc_frames.py
"""

import pyro
import torch
from torch import nn

import ppl_attention as pa
from ppl_attention.data import make_task

torch.manual_seed(0)
pyro.set_rng_seed(0)
VOCAB = 12  # symbols s0 … s11 rendered as frames f0 … f11; label k + 1 is symbol k, 0 the blank
task = make_task("durations", n_train=2000, n_eval=100, min_len=8, max_len=24)


def feasible(x, y):
    """CTC needs a frame per symbol and a blank between two equal neighbours."""
    return len(y) >= len(x) + sum(a == b for a, b in zip(x, x[1:]))


def tensors(split):
    """frames [B, T], symbols + 1 [B, L], their lengths, the gold symbol position of each frame
    — of the pairs CTC can align (:func:`feasible`)."""
    keep = [k for k, (x, y) in enumerate(split.pairs) if feasible(x, y)]
    print(f"{len(keep)} of {len(split.pairs)} pairs have frames enough for CTC")
    split = type(split)([split.pairs[k] for k in keep], [split.gold[k] for k in keep])
    frames = [[int(f[1:]) for f in y] for _, y in split.pairs]
    labels = [[int(s[1:]) + 1 for s in x] for x, _ in split.pairs]
    T, L = max(map(len, frames)), max(map(len, labels))
    F = torch.zeros(len(frames), T, dtype=torch.long)
    Y = torch.ones(len(frames), L, dtype=torch.long)  # padding: any non-blank label
    gold = torch.full((len(frames), T), -1)
    for b, (f, y, links) in enumerate(zip(frames, labels, split.gold)):
        F[b, :len(f)], Y[b, :len(y)] = torch.tensor(f), torch.tensor(y)
        for j, t in links:
            gold[b, t] = j
    return F, Y, torch.tensor(list(map(len, frames))), torch.tensor(list(map(len, labels))), gold


class FrameScorer(nn.Module):
    """Each frame's logits over the blank and the symbols, from a BiLSTM over the frames."""

    def __init__(self, hidden=32):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, hidden)
        self.rnn = nn.LSTM(hidden, hidden, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * hidden, VOCAB + 1)

    def forward(self, frames):
        return self.out(self.rnn(self.emb(frames))[0])  # [B, T, V + 1]


net = FrameScorer()


def model(frames, symbols, n_frames, n_symbols):
    pyro.module("net", net)
    alignment = pa.CTC(net(frames), symbols, label_lengths=n_symbols, input_lengths=n_frames)
    with pyro.plate("batch", frames.shape[0]):
        pyro.factor("symbols", alignment.log_partition)  # exact: the CTC paths summed out


def guide(*args):  # nothing to infer: the alignment is summed out in the model
    pass


def frame_labels(frames, symbols, n_frames, n_symbols):
    """Each frame's MAP label: the symbol position it is aligned to (-1: the blank)."""
    with torch.no_grad():
        alignment = pa.CTC(net(frames), symbols, label_lengths=n_symbols, input_lengths=n_frames)
        states = alignment.argmax().argmax(-2)  # [B, T]: the extended-label state of each frame
    position = torch.where(states % 2 == 1, (states - 1) // 2, torch.full_like(states, -1))
    return position


train, test = tensors(task.train), tensors(task.test)
svi = pyro.infer.SVI(model, guide, pyro.optim.Adam({"lr": 0.01}), pyro.infer.Trace_ELBO())
for _ in range(300):
    idx = torch.randint(0, len(train[0]), (32,))
    svi.step(*(t[idx] for t in train[:4]))
F, Y, nf, ny, gold = test
with torch.no_grad():
    log_p = pa.CTC(net(F), Y, label_lengths=ny, input_lengths=nf).log_partition
pred = frame_labels(F, Y, nf, ny)
real = gold >= 0
print(f"log p(symbols | frames) per symbol: {float(log_p.sum() / ny.sum()):.3f}")
print(f"frame accuracy: {float((pred == gold)[real].float().mean()):.3f} "
      f"(blank frames {float((pred == -1)[real].float().mean()):.3f}; "
      f"on the non-blank frames {float((pred == gold)[real & (pred >= 0)].float().mean()):.3f})")
print("test pair 0, each frame's symbol position (-1 the blank):",
      " ".join(str(int(p)) for p in pred[0, :int(nf[0])]))
print("                               gold:", " ".join(str(int(g)) for g in gold[0, :int(nf[0])]))
