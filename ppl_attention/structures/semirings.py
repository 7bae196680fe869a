"""The semirings a structure's recursion runs over, in log space: ⊗ is + throughout; ⊕ is

- ``LOG``: logsumexp — the recursion's value is log Z, its gradient the marginals;
- ``MAX``: max — the value is the best score, its gradient the indicator of the best structure
  (Viterbi);
- ``SAMPLE``: logsumexp forward, and backward a one-hot draw from softmax of the summed terms —
  the gradient of the recursion's value is the indicator of an exact sample (forward filtering,
  backward sampling, for any dynamic program over a hypergraph; torch-struct's and SynJax's
  sampling semiring).

- ``kmax(k)``: the k-best semiring — a value is the k best scores, sorted, on a leading axis
  of size k; ⊕ keeps the k best of the union, ⊗ the k best pairwise sums (``ops.times``). The
  gradient of the i-th best score is the indicator of the i-th best structure.

- ``PROB``: the sum-product semiring in probability space (⊕ = +, ⊗ = ×) — for a recursion
  whose values are kept normalized at every step (a scaled forward pass, as the word aligners'
  HMM runs it), where exp and log per element would cost more than they save.

A semiring is a name the operation table maps to its ⊕ (``ops.plus(semiring, x, dim)``), its
⊗ of two semiring values (``ops.times``; + except for k-best) and its embedding of scores
(``ops.lift``; the identity except for k-best). A recursion writes ``value + θ`` where θ is a
potential (a score, broadcast over the k-best axis) and ``ops.times`` where both are values.
"""

LOG = "log"
MAX = "max"
SAMPLE = "sample"
PROB = "prob"
SEMIRINGS = (LOG, MAX, SAMPLE, PROB)
KMAX = "kmax"


def kmax(k: int) -> str:
    """The k-best semiring's name (k ≥ 1)."""
    return f"{KMAX}{int(k)}"


def k_of(semiring: str) -> int | None:
    """k of a k-best semiring (None for the others)."""
    return int(semiring[len(KMAX):]) if semiring.startswith(KMAX) else None


# --- normalizing a recursion's values (pure Python: both operation tables export these) ---

def divide(semiring: str, x, c):
    """``x`` over the normalizer ``c`` (broadcast): x − c in log space, x / c for PROB."""
    return x / c if semiring == PROB else x - c


def normalizer_ok(semiring: str, c):
    """Where a normalizer may divide: c > 0 for PROB (a step of probability 0 keeps its
    predecessor, as a scaled forward pass does); everywhere in log space."""
    return c > 0 if semiring == PROB else True


def one(semiring: str) -> float:
    """The semiring's ⊗-identity as a normalizer: 1 for PROB, 0 in log space."""
    return 1.0 if semiring == PROB else 0.0
