"""The exceptions a user sees, kept apart from bugs.

Everything the package raises for *bad input* — a malformed file, an unknown name, an option that
does not apply, a model that lacks what a tool needs — is a :class:`UserError` (a ``ValueError``,
so ``except ValueError`` keeps working). The command line prints a ``UserError`` as one
``error: …`` line and exits 2; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

__all__ = ["UserError", "DataError", "MissingCapability", "UnsafeCheckpoint", "NonFiniteScores"]


class UserError(ValueError):
    """Bad input; the message says what and where (file, line, field, option)."""


class DataError(UserError):
    """Bad input data; the message names the file, the line and what was wrong."""


class MissingCapability(UserError):
    """A tool asked a model for something it does not provide (the message names the
    capability and the member that would provide it)."""


class UnsafeCheckpoint(UserError):
    """A checkpoint holds something other than plain data (tensors, numbers, strings, lists,
    dicts): it is refused without running it."""


class NonFiniteScores(UserError):
    """Attention or arc scores that are not finite. Before training it is bad input (a model
    masking with −inf); once training has changed the weights, the training loops report it as
    divergence (:mod:`ppl_attention.core.divergence`)."""
