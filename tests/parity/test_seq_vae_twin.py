"""The sequence VAE's twins: the Pyro ``AttentionSeqVAE`` (``seq-vae``) declares the NumPyro one
as its ``numpyro_twin``, and ``check-twin`` finds the same loss and gradients on the same
weights and the same draw of z (the Pyro guide's, replayed; the NumPyro guide draws it from the
same standard noise, so the reparameterized path is compared too) for every method both train:
soft, exact (the alignment enumerated in the model) and hard-enum (enumerated in the guide). The
mirror refuses what it cannot honour (a continuous alignment family, word dropout in training).

Planted faults, each caught by test_check_twin_passes_for_every_method_both_train (check-twin
exited 1, every method beyond tolerance), then reverted:
- the free-bits term of the NumPyro guide with its sign flipped (``numpyro.factor("free_bits",
  … beta * gap …)`` → ``-beta * gap``: the KL floor rewarding a dimension below λ instead of
  penalizing it): loss rel. ≈ 0.10 for soft, exact and hard-enum;
- z dropped from the NumPyro decoder's output layer (``output_logits``: ``W_s s + W_z z`` →
  ``W_s s``): loss rel. ≈ 3e-2, gradient rel. ≈ 0.37 (largest at ``W_o.weight``).
"""

import json

import pytest

from ppl_attention.cli import main
from ppl_attention.core.errors import UserError
from ppl_attention.numpyro.models.seq_vae import AttentionSeqVAE as NumPyroVAE
from ppl_attention.pyro.models.seq_vae import AttentionSeqVAE as PyroVAE

NUMPYRO_SPEC = "ppl_attention.numpyro.models.seq_vae:AttentionSeqVAE"
BOTH_TRAIN = ["soft", "exact", "hard-enum"]


@pytest.fixture(autouse=True)
def _jax_cache(tmp_path_factory, monkeypatch):
    """Compiled steps cached for the session in a temporary directory, not the user's."""
    monkeypatch.setenv("PPL_ATTENTION_JAX_CACHE", str(tmp_path_factory.getbasetemp() / "jax"))


@pytest.mark.integration
def test_check_twin_passes_for_every_method_both_train(capsys):
    """Free bits on (λ = 0.5 nats), so the guide's correction to the KL is compared too."""
    capsys.readouterr()
    assert main(["check-twin", "seq-vae", NUMPYRO_SPEC, "--task", "reorder", "--batch-size",
                 "4", "--option", "hidden=8", "--option", "latent=2", "--option",
                 "free_bits=0.5", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["method"] for r in rows] == BOTH_TRAIN
    assert all(r["ok"] and r["sampled"] for r in rows), rows  # sampled: the same z
    assert max(max(r["loss_rel"], r["grad_rel"]) for r in rows) <= 1e-4


def test_the_twin_is_declared_and_built_from_a_torch_model():
    from ppl_attention.numpyro.inference.twins import twin_class, twin_of

    assert twin_class(PyroVAE) is NumPyroVAE
    torch_model = PyroVAE(20, hidden=8, latent=2, family="categorical", word_dropout=0.2)
    twin, params = twin_of(torch_model)  # evaluation: without the word dropout
    assert twin.config["word_dropout"] == 0.0 and twin.family.name == "categorical"
    assert set(params["seq_vae"]) == set(torch_model.state_dict())
    with pytest.raises(UserError, match="word dropout"):
        twin_of(torch_model, training=True)


@pytest.mark.parametrize("kw, message", [
    ({"family": "weibull"}, "soft and categorical alignments, not 'weibull'"),
    ({"word_dropout": 0.1}, "trains without word dropout"),
    ({"family": "categorical", "attention": "none"}, "needs attention"),
    ({"kl_anneal": "cosine"}, "kl_anneal must be one of"),
])
def test_the_mirror_refuses_what_it_cannot_honour(kw, message):
    with pytest.raises(UserError, match=message):
        NumPyroVAE(20, hidden=8, latent=2, **kw)
