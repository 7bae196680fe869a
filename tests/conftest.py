import pyro
import pytest
import torch

from ppl_attention.data import make_task, write_pharaoh, write_tsv


@pytest.fixture(autouse=True)
def _fresh_pyro():
    """Each test starts with an empty param store and a fixed seed."""
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    torch.set_default_dtype(torch.float32)
    yield
    pyro.clear_param_store()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A small reorder corpus as a --data-dir: train/valid/test .tsv with gold .align."""
    d = tmp_path_factory.mktemp("corpus")
    task = make_task("reorder", n_train=40, n_eval=10, seed=1)
    for name, split in (("train", task.train), ("valid", task.valid), ("test", task.test)):
        write_tsv(d / f"{name}.tsv", split.pairs)
        write_pharaoh(d / f"{name}.align", split.gold)
    return d


def require_ray():
    """Ray, or a skip — except in CI (PPL_ATTENTION_CI set by .ci/run, which installs the ray
    extra), where a missing Ray fails the test instead of silently skipping every Ray test."""
    import os

    if os.environ.get("PPL_ATTENTION_CI"):
        import ray  # noqa: F401  (an ImportError here fails the test)

        return
    pytest.importorskip("ray")
