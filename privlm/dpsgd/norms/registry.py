"""Registry of layer handlers, keyed by layer type.

A handler turns one call of a layer (its input and the gradient of the loss with respect to its
output) into per-sample gradient factors of the layer's trainable parameters. Handlers assume that
dimension 0 of the layer's input and output indexes samples, as in Hugging Face causal LMs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import Tensor, nn

from privlm.dpsgd.norms.factors import Factor

FactorFn = Callable[[nn.Module, Tensor, Tensor], dict[str, Factor]]
CheckFn = Callable[[nn.Module], "str | None"]


@dataclass(frozen=True)
class LayerHandler:
    """``factors(module, input, grad_output)`` → {parameter name: factor}, for trainable parameters only;
    ``params``: the parameter names it covers; ``check(module)``: a reason it cannot, or None."""

    factors: FactorFn
    params: tuple[str, ...]
    check: CheckFn | None = None


HANDLERS: dict[type, LayerHandler] = {}


def register(layer_type: type, params: tuple[str, ...], check: CheckFn | None = None) -> Callable[[FactorFn], FactorFn]:
    """Decorator: register ``fn`` as the factor function of ``layer_type``."""

    def decorate(fn: FactorFn) -> FactorFn:
        HANDLERS[layer_type] = LayerHandler(fn, params, check)
        return fn

    return decorate


def handler_for(module: nn.Module) -> LayerHandler | None:
    """The handler of the closest registered class in ``type(module)``'s MRO, or None."""
    for cls in type(module).__mro__:
        if cls in HANDLERS:
            return HANDLERS[cls]
    return None


def trainable(module: nn.Module, name: str) -> bool:
    param = getattr(module, name, None)
    return isinstance(param, nn.Parameter) and param.requires_grad


def tokens(x: Tensor, width: int) -> Tensor:
    """``x`` reshaped to (B, T, width): every dimension between batch and features counts as tokens."""
    return x.reshape(x.shape[0], -1, width)
