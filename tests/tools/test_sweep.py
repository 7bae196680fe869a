"""Sweeps (`ppl-attention sweep` / `compare`): Ray jobs give the in-process numbers, a failed
job is isolated and a rerun runs only it, --set settings, bad input refused before any work."""

import csv
import json
import shutil
import socket
import subprocess
import sys

import pytest
from conftest import require_ray

from ppl_attention.cli import main

pytestmark = pytest.mark.torch  # every test here runs a Pyro model

SMALL = ["--steps", "6", "--hidden", "8", "--batch-size", "8", "--valid-every", "3"]


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _numbers(path):
    """(job, status, the deterministic numbers) per row; ms_per_step is wall time."""
    keys = ["nll_per_token", "elbo_per_token", "aer"]
    return [((r["method"], r["seed"]), r["status"], [float(r[k]) for k in keys if r[k]])
            for r in _rows(path)]


def _sweep(data_dir, out, *extra):
    return main(["sweep", "--data-dir", str(data_dir), "--methods", "exact,soft", "--seeds", "2",
                 *SMALL, "--out", str(out), *extra])


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def _ray_cluster():
    """One local Ray cluster for this module's `--ray local` sweeps, started as the command
    starts one (``sweep.start_ray``): its worker processes, torch imported once, serve them all."""
    require_ray()
    from ppl_attention.tools import sweep

    ray = sweep.start_ray("local")
    yield ray
    ray.shutdown()


@pytest.fixture
def ray_local(_ray_cluster, monkeypatch):
    """`--ray local` joins the module's cluster: the command's ``start_ray`` (after its checks)
    hands it over and its ``shutdown`` leaves it running; ``execute`` joins a cluster already
    up. Starting and stopping a cluster of its own is test_contract's Ray test."""
    import types

    from ppl_attention.tools import sweep

    def join(address, quiet=True):
        sweep.check_ray(address)
        assert address == "local"
        return types.SimpleNamespace(cluster_resources=_ray_cluster.cluster_resources,
                                     shutdown=lambda: None)

    monkeypatch.setattr(sweep, "start_ray", join)


@pytest.mark.integration
def test_ray_local_sweep_gives_the_in_process_numbers(data_dir, tmp_path, ray_local):
    assert _sweep(data_dir, tmp_path / "inline") == 0
    assert _sweep(data_dir, tmp_path / "ray", "--ray", "local") == 0
    one, two = _numbers(tmp_path / "inline" / "results.csv"), _numbers(tmp_path / "ray" /
                                                                       "results.csv")
    assert [r[:2] for r in one] == [r[:2] for r in two] == [
        ((m, str(s)), "ok") for m in ("exact", "soft") for s in (0, 1)]
    for a, b in zip(one, two):
        assert a[2] == pytest.approx(b[2], rel=1e-5)
    # the Ray jobs' run directories came back whole, recording the corpus as given here
    for name in ("exact-seed0", "exact-seed1", "soft-seed0", "soft-seed1"):
        run = tmp_path / "ray" / "runs" / name
        assert (run / "COMPLETE").exists() and (run / "checkpoint.pt").stat().st_size > 0
        cfg = json.loads((run / "config.json").read_text())
        assert cfg["train"]["data"]["data_dir"] == str(data_dir.resolve())
    assert main(["evaluate", str(tmp_path / "ray" / "runs" / "soft-seed1"), "--json"]) == 0


@pytest.mark.parametrize("where", ["in-process",
                                   pytest.param("ray", marks=pytest.mark.integration)])
def test_a_failed_job_is_isolated_and_the_rerun_runs_only_it(data_dir, tmp_path, capsys, where,
                                                             request):
    extra = ["--ray", "local"] if where == "ray" else []
    if where == "ray":
        request.getfixturevalue("ray_local")
    out = tmp_path / "sweep"
    blocker = out / "runs" / "soft-seed1"
    blocker.mkdir(parents=True)
    (blocker / "notes.txt").write_text("not a run directory: must not be overwritten\n")
    assert _sweep(data_dir, out, *extra) == 1
    err = capsys.readouterr().err
    assert "FAILED soft seed 1" in err and "refusing to overwrite" in err
    rows = _numbers(out / "results.csv")
    assert [r[1] for r in rows] == ["ok", "ok", "ok", "failed"]
    assert "soft-seed1" in (out / "results.md").read_text()
    assert "refusing to overwrite" in (out / "errors" / "soft-seed1.txt").read_text()
    assert (blocker / "notes.txt").exists()  # nothing already written was lost
    done = {n: (out / "runs" / n / "checkpoint.pt").stat().st_mtime_ns
            for n in ("exact-seed0", "exact-seed1", "soft-seed0")}

    shutil.move(blocker, tmp_path / "moved-away")
    assert _sweep(data_dir, out, *extra) == 0
    assert "3 of 4 jobs already complete" in capsys.readouterr().err
    assert {n: (out / "runs" / n / "checkpoint.pt").stat().st_mtime_ns for n in done} == done
    rerun = _numbers(out / "results.csv")
    assert [r[1] for r in rerun] == ["ok"] * 4
    assert not (out / "errors" / "soft-seed1.txt").exists()
    assert [r[2] for r in rerun[:3]] == [r[2] for r in rows[:3]]  # read back, not retrained


def test_set_sweeps_settings_into_named_runs(data_dir, tmp_path, capsys):
    out = tmp_path / "grid"
    assert main(["sweep", "--data-dir", str(data_dir), "--methods", "exact", "--seeds", "1",
                 *SMALL, "--set", "hidden=8,12", "q-prior=true,false", "--out",
                 str(out)]) == 0
    rows = _rows(out / "results.csv")
    assert [(r["hidden"], r["q_prior"]) for r in rows] == [
        ("8", "True"), ("8", "False"), ("12", "True"), ("12", "False")]
    cfg = json.loads((out / "runs" / "exact-hidden=12-q_prior=False-seed0" / "config.json")
                     .read_text())
    assert cfg["model"]["hidden"] == 12 and cfg["model"]["q_prior"] is False
    table = (out / "results.md").read_text()
    assert "| exact hidden=12 q_prior=False |" in table
    # the same directory with other fixed options is refused before any work
    assert main(["sweep", "--data-dir", str(data_dir), "--methods", "exact", "--seeds", "1",
                 *SMALL[:-2], "--valid-every", "2", "--set", "hidden=8,12", "--out",
                 str(out)]) == 2
    assert "valid_every=3" in capsys.readouterr().err


@pytest.mark.parametrize("bad, message", [
    (["--set", "colour=red"], "'colour' cannot be swept"),
    (["--set", "hidden=8,abc"], "hidden=abc: not a valid int"),
    (["--set", "lr-schedule=cosine,wavy"], "valid values: constant, cosine"),
    (["--set", "hidden"], "expected KEY=V1,V2"),
    (["--set", "hidden=8", "--set", "hidden=12"], "given twice"),
    (["--methods", "exact,nope"], "unknown method 'nope'"),
    (["--ray", "local", "--jobs", "2"], "--jobs runs worker processes"),
    (["--methods", "vae-rws", "--set", "backend=pyro,numpyro"], "has no NumPyro counterpart"),
    (["--set", "devices=1,2"], "use --backend numpyro"),
])
def test_bad_sweep_options_are_refused_before_any_work(data_dir, tmp_path, capsys, bad, message):
    out = tmp_path / "never"
    args = ["sweep", "--data-dir", str(data_dir), "--methods", "exact", *SMALL, "--out", str(out)]
    if "--methods" in bad:
        args = [a for a in args if a != "--methods" and a != "exact"]
    assert main([*args, *bad]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.integration
def test_more_cpus_per_job_than_the_cluster_has_is_refused(data_dir, tmp_path, capsys,
                                                            ray_local):
    out = tmp_path / "never"
    assert main(["sweep", "--data-dir", str(data_dir), "--methods", "exact", *SMALL,
                 "--ray", "local", "--cpus-per-job", "999", "--out", str(out)]) == 2
    assert "--cpus-per-job 999: the Ray cluster at local has" in capsys.readouterr().err
    assert not out.exists()


def test_ray_address_without_a_cluster_is_a_clear_error(data_dir, tmp_path, capsys):
    require_ray()
    out = tmp_path / "never"
    address = f"127.0.0.1:{_free_port()}"
    assert main(["sweep", "--data-dir", str(data_dir), "--methods", "exact", *SMALL,
                 "--ray", address, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--ray {address}: no Ray cluster there" in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.integration
def test_sweep_on_a_running_ray_cluster(data_dir, tmp_path):
    """`--ray HOST:PORT` joins a cluster started with `ray start --head` (the package's code
    travels with the jobs)."""
    require_ray()
    port = _free_port()
    ray_cli = [sys.executable, "-c", "from ray.scripts.scripts import main; main()"]
    subprocess.run([*ray_cli, "start", "--head", f"--port={port}", "--num-cpus=2",
                    "--include-dashboard=false", "--disable-usage-stats"],
                   check=True, capture_output=True, timeout=120)
    try:
        out = tmp_path / "cluster"
        # as a user runs it: the command line's module is __main__ there
        r = subprocess.run([sys.executable, "-m", "ppl_attention.cli", "sweep", "--data-dir",
                            str(data_dir), "--methods", "soft", *SMALL, "--ray",
                            f"127.0.0.1:{port}", "--out", str(out)],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        assert _numbers(out / "results.csv")[0][1] == "ok"
        assert (out / "runs" / "soft-seed0" / "COMPLETE").exists()
    finally:
        subprocess.run([*ray_cli, "stop", "--force"], capture_output=True, timeout=120)
