"""The Pyro backend: the primitive (:mod:`.attend`), the alignment families, distributions,
closed-form KLs, score functions and structured alignments; the model contract and collection
(:mod:`.models`); inference — methods, the training loop, evaluation, posteriors, calibration,
importance weights, decoding (:mod:`.inference`). Its mirror, file by file, is
:mod:`ppl_attention.numpyro`; neither imports the other."""
