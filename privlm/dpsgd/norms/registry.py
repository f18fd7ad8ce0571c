"""Registry of layer handlers, keyed by layer type.

A handler turns one call of a layer (its input and the gradient of the loss with respect to its
output) into per-sample gradient factors of the layer's trainable parameters. Handlers assume that
dimension 0 of the layer's input and output indexes samples, as in Hugging Face causal LMs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from torch import Tensor, nn

from privlm.dpsgd.norms.factors import Factor

FactorFn = Callable[[nn.Module, Tensor, Tensor], dict[str, Factor]]
CheckFn = Callable[[nn.Module], "str | None"]
M = TypeVar("M", bound=nn.Module)


@dataclass(frozen=True)
class LayerHandler:
    """``factors(module, input, grad_output)`` → {parameter name: factor}, for trainable parameters only;
    ``params``: the parameter names it covers; ``check(module)``: a reason it cannot, or None."""

    factors: FactorFn
    params: tuple[str, ...]
    check: CheckFn | None = None


HANDLERS: dict[type[nn.Module], LayerHandler] = {}


def _as_layer(layer_type: type[M], module: nn.Module) -> M:
    """``module`` as a ``layer_type``: what :func:`handler_for` guarantees (it dispatches on the MRO)."""
    if not isinstance(module, layer_type):
        raise TypeError(f"the {layer_type.__name__} handler was given a {type(module).__name__}")
    return module


def register(
    layer_type: type[M], params: tuple[str, ...], check: Callable[[M], str | None] | None = None
) -> Callable[[Callable[[M, Tensor, Tensor], dict[str, Factor]]], Callable[[M, Tensor, Tensor], dict[str, Factor]]]:
    """Decorator: register ``fn`` as the factor function of ``layer_type`` (``fn`` and ``check`` take a
    ``layer_type``; the registered handler checks that it is given one)."""

    def decorate(
        fn: Callable[[M, Tensor, Tensor], dict[str, Factor]],
    ) -> Callable[[M, Tensor, Tensor], dict[str, Factor]]:
        def factors(module: nn.Module, x: Tensor, grad: Tensor) -> dict[str, Factor]:
            return fn(_as_layer(layer_type, module), x, grad)

        def checked(module: nn.Module) -> str | None:
            return None if check is None else check(_as_layer(layer_type, module))

        HANDLERS[layer_type] = LayerHandler(factors, params, None if check is None else checked)
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
