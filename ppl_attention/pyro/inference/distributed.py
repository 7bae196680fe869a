"""Pyro data-parallel SVI on ``torch.distributed``: launched by ``torchrun``, each process
(rank) trains the same model on its shard of every batch inside ``DistributedDataParallel``,
which all-reduces the gradients; rank 0 alone validates, logs and writes the run directory.

    torchrun --standalone --nproc_per_node 2 -m ppl_attention.cli train --task reorder ...

Gradients. The single-process step differentiates the batch's summed surrogate −ELBO,
g = Σ_b ∇ℓ_b. Rank r holds the rows S_r of the batch and DDP *averages* the ranks' gradients,
so each rank differentiates W · Σ_{b∈S_r} ℓ_b (W ranks): (1/W) Σ_r W · Σ_{b∈S_r} ∇ℓ_b = g, the
combined batch's gradient, whatever the shard sizes. Adam and gradient clipping then see the
same numbers on every rank and in one process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ...core.errors import UserError
from ...data.batching import Batch


def _env_int(name: str) -> int | None:
    v = os.environ.get(name)
    if v is None:
        return None
    try:
        return int(v)
    except ValueError:
        raise UserError(f"environment variable {name}={v!r} is not an integer") from None


@dataclass(frozen=True)
class Distributed:
    """This process's place in a ``torchrun`` launch: ``rank`` of ``world`` processes."""

    rank: int
    world: int

    @classmethod
    def from_env(cls) -> Distributed | None:
        """The launch ``torchrun`` describes in ``WORLD_SIZE`` / ``RANK``, or None for a plain
        one-process run (no process group is started here: :meth:`start` does that)."""
        world = _env_int("WORLD_SIZE")
        if world is None or world == 1:
            return None
        rank = _env_int("RANK")
        if world < 1 or rank is None or not 0 <= rank < world:
            raise UserError(f"WORLD_SIZE={world}, RANK={rank}: not a torchrun launch "
                             f"(launch with torchrun --nproc_per_node N)")
        return cls(rank, world)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def check_batches(self, batches: list[Batch]) -> None:
        """Every batch must be a batch of pairs (its rows are sharded) and give each rank at
        least one pair (checked before any work)."""
        if not all(isinstance(b, Batch) for b in batches):
            raise UserError(f"torchrun data parallelism shards batches of pairs by row; this "
                            f"model's batches are {type(batches[0]).__name__}")
        small = min(b.size for b in batches)
        if small < self.world:
            raise UserError(f"a training batch of {small} pair(s) cannot be split over "
                             f"{self.world} processes: use --batch-size ≥ {self.world} (the "
                             f"last, smaller bucket of a corpus counts too) or fewer processes")

    def start(self) -> None:
        """Join the process group (gloo: the Pyro models train on CPU tensors)."""
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo")

    def stop(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    def shard(self, batch: Batch) -> Batch:
        """This rank's rows of ``batch``: contiguous, sizes differing by at most one."""
        rows = torch.tensor_split(torch.arange(batch.size), self.world)[self.rank]
        lo, hi = int(rows[0]), int(rows[-1]) + 1

        def take(t):
            return None if t is None else t[lo:hi]

        return Batch(take(batch.src), take(batch.src_mask), take(batch.tgt_in),
                     take(batch.tgt_out), take(batch.tgt_mask), take(batch.index),
                     take(batch.gold), batch.n_unk, take(batch.features))

    def all_sum(self, *values: float) -> list[float]:
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t)
        return t.tolist()

    def wrap(self, model: torch.nn.Module, objective) -> torch.nn.Module:
        """``DistributedDataParallel`` around a module whose forward is the objective's
        (loss, surrogate) on a shard; parameters a method leaves unused (the inference network
        under ``exact``) are allowed."""
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(_SurrogateLoss(model, objective),
                                       find_unused_parameters=True)


class _SurrogateLoss(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, objective):
        super().__init__()
        self.model = model
        self.objective = objective

    def forward(self, batch: Batch, step: int):
        loss, surrogate = self.objective.differentiable_loss(self.model, batch, step)
        return surrogate, torch.tensor(loss)
