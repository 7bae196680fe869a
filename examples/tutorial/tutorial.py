"""The tutorial's model through the Python API: three methods, one table, the posterior in
ArviZ. From the repository root: python examples/tutorial/tutorial.py [--steps N]"""

import argparse
import sys
from pathlib import Path

import arviz as az
import matplotlib.pyplot as plt

import ppl_attention as pa

sys.path.insert(0, str(Path(__file__).parent))
from diagonal import DiagonalAlignment  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=300)
ap.add_argument("--out", default="diagonal_alignment.png")
args = ap.parse_args()

task = pa.data.make_task("reorder", n_train=5000)
sv = pa.data.Vocab.build(s for s, _ in task.train.pairs)
tv = pa.data.Vocab.build(t for _, t in task.train.pairs)
train = pa.data.make_batches(task.train.pairs, sv, tv, 64, shuffle=True)
test = pa.data.make_batches(task.test.pairs, sv, tv, 64, gold=task.test.gold)
runs = {}
for method in ("exact", "vae-enum", "soft"):
    model = DiagonalAlignment(len(sv), len(tv), family=pa.inference.get_method(method).family())
    runs[method] = pa.inference.fit(model, train, method, steps=args.steps, lr=0.05,
                                    src_vocab=sv, tgt_vocab=tv)
    r = pa.inference.evaluate(runs[method], test, gold=task.test.gold)
    print(f"{method:>9}: NLL/token {r['nll_per_token']:.3f} (exact: {r['exact']}), "
          f"AER {r['aer']:.3f}")

idata = pa.analysis.to_inference_data(runs["vae-enum"], task.test.pairs[:100], num_samples=200)
print(az.summary(idata.posterior["alignment"].sel(pair=0, target_pos=0), kind="stats"))
print(az.loo(idata))
az.plot_forest(idata, var_names=["alignment"], coords={"pair": 0, "target_pos": [0, 1]})
plt.savefig(args.out)
