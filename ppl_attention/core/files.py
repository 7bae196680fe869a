"""Files written the safe way (a temporary sibling, then one rename) start private — ``mkstemp``
makes them ``0600``, ``mkdtemp`` ``0700``; a result is given the permissions any new file or
directory gets (the umask's)."""

from __future__ import annotations

import os

__all__ = ["make_readable"]


def make_readable(path) -> None:
    """Give ``path`` the permissions ``open()`` (or ``mkdir()``, for a directory) would: ``0666``
    (``0777``) less the process umask."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, (0o777 if os.path.isdir(path) else 0o666) & ~umask)
