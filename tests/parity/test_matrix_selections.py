"""The verification matrix's rows for the methods of the segment and span families
(``segments-*``, ``spans-*``): the tests of tests/parity/test_matrix.py, run on those methods
in a module of their own — pytest-xdist keeps a module on one worker (``--dist loadscope``), and
the matrix in one module was the default tier's longest stretch on one core.

The tests are test_matrix.py's own, executed here with ``MATRIX_HALF`` set: one definition of
each property, two halves of its cells.
"""

from pathlib import Path

# test_matrix.py's imports that need torch and Pyro, named here too: the NumPyro-only leg's
# conftest decides from a module's own imports whether to collect it, and the exec below
# would otherwise fail at collection there instead of leaving the module out, counted.
import pyro  # noqa: F401
import torch  # noqa: F401

MATRIX_HALF = "segments-and-spans"
_SOURCE = Path(__file__).with_name("test_matrix.py")
exec(compile(_SOURCE.read_text(), str(_SOURCE), "exec"))
