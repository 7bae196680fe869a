"""The NumPyro side stands on its own: importing it, and a whole NumPyro-only ``train`` →
``evaluate`` → ``compare`` → ``analyze`` → ``calibrate`` (a model written in NumPyro alone,
``tests/models/content_numpyro.py``), never load torch or Pyro — each in a fresh interpreter,
``sys.modules`` read at the end; and decoding under NumPyro gives the Pyro decode on twin
weights (greedy output identical, beam scores within 1e-5).

Planted faults, each caught once: an ``import torch`` at the top of
``ppl_attention/numpyro/nn.py`` fails
``test_importing_the_numpyro_side_loads_neither_torch_nor_pyro`` (and lint-imports' forbidden
contract); the CLI building every command's parser with its model
(the Pyro seq2seq imported for ``compare``'s options during a NumPyro ``train``) fails
``test_a_numpyro_only_run_never_imports_torch_or_pyro``; the NumPyro stepper not advancing its
decoder state (``logp, _ = self._step(…)``) fails both decode tests.
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTENT = f"{ROOT / 'tests' / 'models' / 'content_numpyro.py'}:ContentAlignment"


def _fresh(code: str, tmp_path=None) -> dict:
    """Run ``code`` in a new interpreter; it prints a JSON line last, returned parsed."""
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, cwd=tmp_path or ROOT, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


LOADED = """
import json, sys
print(json.dumps({"torch": "torch" in sys.modules, "pyro": "pyro" in sys.modules,
                  "rc": rc}))
"""


def test_importing_the_numpyro_side_loads_neither_torch_nor_pyro():
    out = _fresh("import ppl_attention, ppl_attention.numpyro as pn\n"
                 "pn.models, pn.inference, pn.make_family\nrc = 0\n" + LOADED)
    assert out == {"torch": False, "pyro": False, "rc": 0}


@pytest.mark.integration
def test_a_numpyro_only_run_never_imports_torch_or_pyro(tmp_path):
    from ppl_attention.data import make_task

    run, cmp, held = tmp_path / "run", tmp_path / "cmp", tmp_path / "held.tsv"
    pairs = make_task("reorder", n_train=60, n_eval=12, seed=0).test.pairs[:12]
    held.write_text("".join(f"{' '.join(s)}\t{' '.join(t)}\n" for s, t in pairs))
    common = ["--task", "reorder", "--n-train", "60", "--steps", "3", "--valid-every", "1000"]
    commands = [
        ["train", "--model", CONTENT, "--method", "vae-enum", "--out", str(run), *common],
        ["evaluate", str(run), "--data", str(held)],
        ["compare", "--model", CONTENT, "--methods", "vae-enum,soft", "--out", str(cmp),
         *common],
        ["analyze", str(run), "--data", str(held), "--out", str(tmp_path / "an"),
         "--num-samples", "10"],
        ["calibrate", str(run), "--data", str(held), "--out", str(tmp_path / "cal"),
         "--num-sims", "10", "--draws", "9"],
    ]
    code = ("from ppl_attention.cli import main\nimport contextlib, io\nrc = 0\n"
            f"for argv in {commands!r}:\n"
            "    with contextlib.redirect_stdout(io.StringIO()):\n"
            "        rc = rc or main(argv)\n"
            "    assert not rc, argv\n") + LOADED
    out = _fresh(code, tmp_path)
    assert out == {"torch": False, "pyro": False, "rc": 0}
    assert (run / "COMPLETE").exists() and (cmp / "results.md").exists()
    assert (tmp_path / "cal" / "calibration.json").exists()


@pytest.fixture(scope="module")
def seq2seq_run():
    import torch

    import ppl_attention as pa
    from ppl_attention.data import Vocab, make_batches, make_task

    task = make_task("reorder", n_train=300, n_eval=12, seed=3)
    sv, tv = (Vocab.build(p[k] for p in task.train.pairs) for k in (0, 1))
    torch.manual_seed(0)
    model = pa.models.Seq2SeqAlignment(len(sv), len(tv), hidden=16,
                                       family=pa.inference.get_method("exact").family())
    train = make_batches(task.train.pairs, sv, tv, 32, shuffle=True)
    run = pa.inference.fit(model, train, "exact", steps=60, lr=0.02, src_vocab=sv,
                           tgt_vocab=tv, progress=False)
    return run, [s for s, _ in task.test.pairs]


@pytest.mark.torch
@pytest.mark.parametrize("beam", [1, 4])
def test_numpyro_decode_equals_the_pyro_decode_on_twin_weights(seq2seq_run, beam):
    from ppl_attention.common.decoding import beam_search

    run, sources = seq2seq_run
    for src in sources:
        hyp_p, score_p = beam_search(run, src, beam=beam, backend="pyro")
        hyp_j, score_j = beam_search(run, src, beam=beam, backend="numpyro")
        assert hyp_j == hyp_p, src
        assert abs(score_j - score_p) <= 1e-5 * max(1.0, abs(score_p)), (src, score_p, score_j)
    assert np.isfinite(score_p)
