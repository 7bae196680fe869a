"""The tools above both backends: an experiment (one model, one method, trained and scored),
the sweep that runs many of them (``compare`` / ``sweep``), and Pyro-against-NumPyro parity."""
