"""``get_backend``: a backend whose array library is missing is refused with what to install; a
module of the package that fails to import is a defect, raised as itself (not blamed on the
install)."""

import pytest

from ppl_attention.common import backends
from ppl_attention.core.errors import UserError


def test_a_missing_install_is_named_and_a_missing_module_of_the_package_is_not_masked(
        monkeypatch):
    monkeypatch.setitem(backends.BACKENDS, "pyro", "no_such_array_library_xyz.backend")
    with pytest.raises(UserError, match="--backend pyro needs torch and Pyro"):
        backends.get_backend("pyro")
    monkeypatch.setitem(backends.BACKENDS, "pyro", "ppl_attention.common.no_such_module")
    with pytest.raises(ModuleNotFoundError, match="ppl_attention.common.no_such_module"):
        backends.get_backend("pyro")
    with pytest.raises(UserError, match="unknown backend 'jaxx'"):
        backends.get_backend("jaxx")
