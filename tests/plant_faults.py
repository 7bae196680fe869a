"""Plant one fault per property of the verification matrix, run the cells that should catch
it, report, and restore the file: ``python tests/plant_faults.py [a b …]``. What it printed is
in the docstring of tests/test_matrix.py."""
import subprocess
import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])
FAULTS = [
 ("a", "ppl_attention/numpyro/batching.py",
  "    src_mask[B:, 0] = True  # a padded row still needs one position to attend to\n", "",
  "test_a_loss_finite and exact-numpyro"),
 ("b", "ppl_attention/numpyro/families.py",
  "/ math.exp(math.lgamma(1 + 1 / self.k))", "",
  "test_b_parity and bam-weibull"),
 ("c", "ppl_attention/distributions.py",
  "        return gammas / gammas.sum(-1, keepdim=True)\n",
  "        return (gammas / gammas.sum(-1, keepdim=True)).detach()\n",
  "test_c_unbiased and dirichlet-pyro"),
 ("d", "ppl_attention/kl.py", "@register_kl(Weibull, Gamma)\n", "",
  "test_d_closed_form_kl and bam-weibull-pyro"),
 ("e", "ppl_attention/inference/evaluate.py",
  "        weights.append(_per_pair(mt, B) - _per_pair(g, B))",
  "        weights.append(_per_pair(mt, B))",
  "test_e_iwae_order and vae-sample-pyro"),
 ("f", "ppl_attention/inference/fit.py",
  '        torch.set_rng_state(resume.rng_state["torch"])',
  "        pyro.set_rng_seed(seed)",
  "test_f_resume and vae-sample-pyro"),
 ("g", "ppl_attention/families.py",
  "    return torch.where(mask, scores, torch.full_like(scores, -torch.inf)).softmax(-1)\n",
  "    return scores.softmax(-1)\n",
  "test_g_padding and soft-pyro"),
]
only = sys.argv[1:]
for prop, path, old, new, sel in FAULTS:
    if only and prop not in only:
        continue
    full = f"{ROOT}/{path}"
    text = open(full).read()
    assert text.count(old) == 1, (prop, old)
    open(full, "w").write(text.replace(old, new))
    try:
        res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p",
                              "no:warnings", "tests/test_matrix.py", "-k", sel, "--tb=line"],
                             cwd=ROOT, capture_output=True, text=True)
        tail = [l for l in res.stdout.splitlines() if "passed" in l or "failed" in l][-1:]
        print(prop, path, "→", "CAUGHT" if res.returncode else "NOT CAUGHT", tail, flush=True)
        for l in res.stdout.splitlines():
            if l.startswith("FAILED") or l.startswith("/"):
                print("   ", l[:200])
    finally:
        open(full, "w").write(text)
subprocess.run(["git", "-C", ROOT, "diff", "--stat"])
