"""The NumPyro mirror exports what the Pyro side does, by the same names
(``ppl_attention.__all__`` against ``ppl_attention.numpyro.__all__``; the mirror also names its
submodules), and each exported family is the registry's class of that name."""

import ppl_attention as pa
import ppl_attention.numpyro as pn

SUBMODULES = {"distributions", "families", "kl", "scores"}


def test_the_mirror_exports_the_same_names():
    assert set(pn.__all__) - SUBMODULES == set(pa.__all__)
    for name in pn.__all__:
        assert getattr(pn, name) is not None, name
    for name, cls in pn.FAMILIES.items():
        assert getattr(pn, cls.__name__) is cls, name
