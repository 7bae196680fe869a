"""The semirings a structure's recursion runs over, in log space: ⊗ is + throughout; ⊕ is

- ``LOG``: logsumexp — the recursion's value is log Z, its gradient the marginals;
- ``MAX``: max — the value is the best score, its gradient the indicator of the best structure
  (Viterbi);
- ``SAMPLE``: logsumexp forward, and backward a one-hot draw from softmax of the summed terms —
  the gradient of the recursion's value is the indicator of an exact sample (forward filtering,
  backward sampling, for any dynamic program over a hypergraph; torch-struct's and SynJax's
  sampling semiring).

A semiring is a name the operation table maps to its ⊕ (``ops.plus(semiring, x, dim)``).
"""

LOG = "log"
MAX = "max"
SAMPLE = "sample"
SEMIRINGS = (LOG, MAX, SAMPLE)
