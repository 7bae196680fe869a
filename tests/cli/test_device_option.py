"""``--device``: a GPU asked for where none is seen is refused in one line with nothing written
(both backends, every command that computes); ``--device cpu`` is today's default, to the last
digit; a sweep spreads its jobs over the GPUs, one device per job; the NumPyro side computes on
whatever JAX device is made the default — shown on a second host device, as JAX offers several
CPU devices when asked (the NumPyro analogue of tests/pyro/test_meta_device.py's meta device: an
array a
program pinned to the first device would land there instead).

Planted fault, caught: ``jax_default_device`` yielding without entering ``jax.default_device``
— test_numpyro_training_follows_the_default_jax_device failed (the parameters on cpu:0).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ppl_attention.cli import main
from ppl_attention.common import devices

pytestmark = pytest.mark.torch  # every test here runs a Pyro model

ROOT = Path(__file__).resolve().parents[2]


def test_device_specs_are_checked_and_cuda_without_a_gpu_is_refused(monkeypatch):
    assert devices.check_spec("GPU") == "cuda" and devices.check_spec(None) == "cpu"
    with pytest.raises(ValueError, match="expected cpu, cuda, cuda:N or auto"):
        devices.check_spec("cuda:x")
    monkeypatch.setattr(devices, "device_count", lambda backend: 0)
    assert str(devices.torch_device("auto")) == "cpu"
    for backend in ("pyro", "numpyro"):
        with pytest.raises(ValueError, match="sees no CUDA GPU on this machine"):
            devices.describe("cuda", backend)
    monkeypatch.setattr(devices, "device_count", lambda backend: 2)
    with pytest.raises(ValueError, match=r"only 2 GPU\(s\) visible"):
        devices.describe("cuda:2", "pyro")
    # one device per job, round robin over the GPUs; a named device is every job's
    assert [devices.job_device("cuda", k, "pyro") for k in range(5)] == \
        ["cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:0"]
    assert devices.job_device("cuda:1", 3, "numpyro") == "cuda:1"
    monkeypatch.setattr(devices, "device_count", lambda backend: 0)
    assert devices.job_device("auto", 3, "pyro") == "cpu"


@pytest.mark.skipif(devices.device_count("pyro") > 0, reason="a GPU is present")
def test_every_command_refuses_cuda_where_none_is_seen(tmp_path, capsys, data_dir):
    out = tmp_path / "run"
    small = ["--data-dir", str(data_dir), "--steps", "2", "--batch-size", "16"]
    for cmd in (["train", *small, "--method", "exact", "--device", "cuda", "--out", str(out)],
                ["train", *small, "--method", "exact", "--backend", "numpyro", "--device",
                 "cuda:0", "--out", str(out)],
                ["compare", *small, "--methods", "exact,soft", "--device", "cuda", "--out",
                 str(out)]):
        assert main(cmd) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --device cuda") and len(err.strip().splitlines()) == 1
        assert not out.exists()
    assert main(["train", *small, "--method", "exact", "--out", str(out)]) == 0
    capsys.readouterr()
    for cmd in (["evaluate", str(out)], ["align", str(out), "--data", str(data_dir / "test.tsv")],
                ["analyze", str(out), "--out", str(tmp_path / "an")], ["diagnose", str(out)]):
        assert main([*cmd, "--device", "cuda"]) == 2
        assert "sees no CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "an").exists()


def test_device_cpu_gives_the_default_numbers(tmp_path, data_dir):
    small = ["train", "--data-dir", str(data_dir), "--method", "vae-sample", "--steps", "4",
             "--batch-size", "16", "--valid-every", "2"]
    assert main([*small, "--out", str(tmp_path / "default")]) == 0
    assert main([*small, "--device", "cpu", "--out", str(tmp_path / "cpu")]) == 0
    a, b = (json.loads((tmp_path / d / "metrics.json").read_text())["history"]
            for d in ("default", "cpu"))
    assert a == b
    cfg = json.loads((tmp_path / "cpu" / "config.json").read_text())
    assert cfg["train"]["device"] == "cpu"


FOLLOWS = r"""
import sys, jax
sys.path.insert(0, sys.argv[1])
from ppl_attention.common import devices
from ppl_attention.data import Vocab, make_batches, make_task
from ppl_attention.numpyro.inference import fit
from ppl_attention.numpyro.inference.methods import get_method
from diagonal_numpyro import DiagonalAlignment
assert len(jax.devices()) == 2
devices.jax_device = lambda spec: jax.devices("cpu")[1]  # the second host device as "the GPU"
task = make_task("reorder", n_train=40, n_eval=4, seed=2, min_len=3, max_len=5)
sv = Vocab.build(s for s, _ in task.train.pairs)
tv = Vocab.build(t for _, t in task.train.pairs)
batches = make_batches(task.train.pairs, sv, tv, 8)
for method in ("bam-weibull",):  # a family whose own parameters attend registers
    with devices.jax_default_device("cuda"):
        m = DiagonalAlignment(len(sv), len(tv), family=get_method(method).family(), dim=8)
        run = fit(m, batches[:1], method, 2, progress=False)
    print(method, run.extra["jax_devices"])
"""


@pytest.mark.integration  # a second host device: --xla_force_host_platform_device_count
def test_numpyro_training_follows_the_default_jax_device(tmp_path):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
               JAX_PLATFORMS="cpu", PPL_ATTENTION_JAX_CACHE="off")
    res = subprocess.run([sys.executable, "-c", FOLLOWS, str(ROOT / "examples" / "tutorial")],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = [line for line in res.stdout.splitlines() if line.startswith("bam-weibull")]
    assert lines == ["bam-weibull ['cpu:1']"], res.stdout


def test_the_gpu_rule_of_auto_comes_from_the_measurement_once_it_exists(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu

    from ppl_attention.structures import chain_paths

    cells = [{"n": 128, "S": 128, "banded": [5.0, 1], "parallel": [9.0, 1]},
             {"n": 512, "S": 128, "banded": [20.0, 1], "parallel": [8.0, 1]},
             {"n": 512, "S": 512, "banded": [40.0, 1], "parallel": "not run: 9 GB"},
             {"n": 2048, "S": 256, "banded": [90.0, 1], "parallel": [30.0, 1]}]
    assert gpu.gpu_rule(cells) == {"min_T": 512, "max_S": 256}
    assert gpu.gpu_rule(cells[:1]) is None
    rule = tmp_path / "gpu_rule.json"
    monkeypatch.setattr(chain_paths, "RULE_FILE", rule)
    chain_paths.gpu_rule.cache_clear()
    try:
        assert chain_paths.gpu_rule()["measured_on"] is None  # unmeasured: the default guess
        assert chain_paths.choose_path(64, 100, accelerator=True) == "parallel"
        rule.write_text(json.dumps({"min_T": 512, "max_S": 256, "measured_on": "a GPU"}))
        chain_paths.gpu_rule.cache_clear()
        assert chain_paths.choose_path(256, 100, accelerator=True) == "sequential"
        assert chain_paths.choose_path(1024, 200, accelerator=True) == "parallel"
        assert chain_paths.choose_path(1024, 200, accelerator=False) == "sequential"
    finally:
        chain_paths.gpu_rule.cache_clear()
