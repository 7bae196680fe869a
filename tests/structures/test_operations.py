"""The two operation tables define exactly the declared operations
(``ppl_attention.structures.operations.OPERATIONS``) with the declared parameters; a planted
fault — an operation missing from one table — is caught."""

import inspect
import types

import pytest

from ppl_attention.structures.operations import OPERATIONS


def _table(module) -> dict:
    """The public functions a table defines itself (not the ones it imports)."""
    return {n: f for n, f in vars(module).items() if callable(f) and not n.startswith("_")
            and getattr(f, "__module__", None) == module.__name__}


def _check(module) -> None:
    table = _table(module)
    assert set(table) == set(OPERATIONS), (
        f"{module.__name__}: missing {sorted(set(OPERATIONS) - set(table))}, undeclared "
        f"{sorted(set(table) - set(OPERATIONS))}")
    for name, (params, _) in OPERATIONS.items():
        got = tuple(inspect.signature(table[name]).parameters)
        assert got == params, f"{module.__name__}.{name}{got}: declared {params}"


@pytest.mark.parametrize("backend", ["torch_ops", "jax_ops"])
def test_each_table_defines_the_declared_operations(backend):
    if backend == "torch_ops":
        pytest.importorskip("torch")
    else:
        pytest.importorskip("jax")
    import importlib

    _check(importlib.import_module(f"ppl_attention.structures.{backend}"))


def test_an_operation_missing_from_a_table_is_caught():
    jax_ops = pytest.importorskip("ppl_attention.structures.jax_ops")
    planted = types.ModuleType(jax_ops.__name__)
    planted.__dict__.update({k: v for k, v in vars(jax_ops).items() if k != "diag"})
    with pytest.raises(AssertionError, match=r"missing \['diag'\]"):
        _check(planted)
