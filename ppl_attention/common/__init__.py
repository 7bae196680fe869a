"""What both backends build on, written once and free of torch and JAX at import: the model
contract and the model registry, run directories, the evaluation and decoding orchestrators,
metrics, importance-sampling checks, the ArviZ adapter, backend and device selection, and the
training-curve plots."""
