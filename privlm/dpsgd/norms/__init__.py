"""Per-layer per-sample gradient factors (one file per layer type) and their norms in every mode."""

from privlm.dpsgd.norms import conv1d, embedding, layernorm, linear, rmsnorm  # noqa: F401  (registration)
from privlm.dpsgd.norms.factors import (
    DenseFactor,
    Factor,
    NormMode,
    OuterFactor,
    ParameterOperator,
    sq_norms,
    weighted_sum,
)
from privlm.dpsgd.norms.registry import HANDLERS, LayerHandler, handler_for, register
from privlm.norm_modes import NORM_MODES, RANDOMIZED_MODES

__all__ = [
    "HANDLERS",
    "NORM_MODES",
    "RANDOMIZED_MODES",
    "DenseFactor",
    "Factor",
    "LayerHandler",
    "NormMode",
    "OuterFactor",
    "ParameterOperator",
    "handler_for",
    "register",
    "sq_norms",
    "weighted_sum",
]
