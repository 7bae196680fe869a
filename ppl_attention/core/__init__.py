"""What both backends need that is pure Python, written once below both: argument checks, the
declared traits and parameters of every alignment family, the inference-method specs, and the
schedules (learning rate, KL annealing, batch order). Nothing here imports torch, Pyro, JAX or
NumPyro."""

from .checks import check_choice, check_int, check_positive
from .family_specs import FAMILY_SPECS, FamilySpec, family_spec
from .method_specs import METHOD_SPECS, MethodSpec, method_spec
from .schedules import LR_SCHEDULES, batch_order, kl_annealing

__all__ = ["check_choice", "check_int", "check_positive", "FAMILY_SPECS", "FamilySpec",
           "family_spec", "METHOD_SPECS", "MethodSpec", "method_spec", "LR_SCHEDULES",
           "batch_order", "kl_annealing"]
