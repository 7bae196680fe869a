"""Each backend's family registry derives from core/family_specs.py's table
(``family_registry``): the same names in the same order on both sides, each name's class
declaring that spec; a backend that lacks a family, or a class without a spec of the table, is
refused at import."""

import pytest

from ppl_attention.core.family_specs import FAMILY_SPECS, FamilySpec, family_registry


def _backends():
    out = {}
    pytest.importorskip("numpyro")
    from ppl_attention.numpyro.families import FAMILIES as jax_families

    out["numpyro"] = jax_families
    try:
        from ppl_attention.pyro.families import FAMILIES as torch_families
    except ImportError:  # the NumPyro-only leg
        return out
    out["pyro"] = torch_families
    return out


def test_both_registries_are_the_table():
    for backend, families in _backends().items():
        assert list(families) == list(FAMILY_SPECS), backend
        for name, cls in families.items():
            assert cls.__dict__["spec"] is FAMILY_SPECS[name] and cls.name == name, (backend, name)


def test_a_missing_family_or_an_unknown_spec_is_refused():
    class Base:
        pass

    classes = [type(f"F{i}", (Base,), {"spec": spec, "__module__": "fake"})
               for i, spec in enumerate(FAMILY_SPECS.values())]
    assert list(family_registry(Base, "fake")) == list(FAMILY_SPECS)
    del classes[0].spec  # planted: one family gone from the backend
    with pytest.raises(RuntimeError, match=f"no class: \\['{next(iter(FAMILY_SPECS))}'\\]"):
        family_registry(Base, "fake")
    type("Extra", (Base,), {"spec": FamilySpec("not-in-the-table"), "__module__": "fake"})
    with pytest.raises(RuntimeError, match="no spec: \\['not-in-the-table'\\]"):
        family_registry(Base, "fake")
