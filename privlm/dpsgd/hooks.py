"""Forward hooks that capture, for every layer owning trainable parameters, what its per-sample
gradient norm needs: the layer's input (activations) and output (whose gradient — the backprops —
the clipper asks autograd for). Frozen parameters are ignored, so LoRA adapters (peft's ``lora_A`` /
``lora_B`` are plain ``nn.Linear`` layers) work; a trainable parameter in a layer type without a
handler is refused by name, never skipped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd.graph import GradientEdge, get_gradient_edge

from privlm.dpsgd.norms import HANDLERS, Factor, LayerHandler, handler_for
from privlm.errors import UserError


@dataclass
class LayerCall:
    """One call of a hooked layer: its input (detached), the autograd edge of its output (what
    ``torch.autograd.grad`` needs, without keeping the output tensor alive) and the output's batch size."""

    module: nn.Module
    inputs: Tensor
    output_edge: GradientEdge
    output_batch: int


def trainable_layers(model: nn.Module) -> dict[nn.Module, LayerHandler]:
    """Every module owning a trainable parameter, with its handler.

    Raises :class:`UserError` naming the parameter when a trainable parameter sits in a layer the
    engine cannot handle (or in a configuration it cannot, e.g. an embedding with ``max_norm``)."""
    supported = ", ".join(sorted(t.__name__ for t in HANDLERS))
    layers: dict[nn.Module, LayerHandler] = {}
    for module_name, module in model.named_modules():
        own = [n for n, p in module.named_parameters(recurse=False) if p.requires_grad]
        if not own:
            continue
        where = f"{module_name}." if module_name else ""
        handler = handler_for(module)
        if handler is None:
            raise UserError(
                f"trainable parameter {where}{own[0]!s} is in a {type(module).__name__} layer, which the DP-SGD "
                f"engine cannot clip per sample; freeze it or use a supported layer ({supported})"
            )
        for name in own:
            if name not in handler.params:
                raise UserError(f"trainable parameter {where}{name} of {type(module).__name__} is not supported")
        reason = handler.check(module) if handler.check else None
        if reason:
            raise UserError(f"layer {module_name or type(module).__name__} cannot be clipped per sample: {reason}")
        layers[module] = handler
    return layers


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The distinct trainable parameters (a tied weight appears once)."""
    return [p for p in model.parameters() if p.requires_grad]


class LayerCapture:
    """Forward hooks on ``model``'s trainable layers; inside :meth:`recording`, every call whose output
    requires a gradient is kept."""

    def __init__(self, model: nn.Module) -> None:
        self.layers = trainable_layers(model)
        self._calls: list[LayerCall] = []
        self._recording = False
        self._handles = [m.register_forward_hook(self._hook) for m in self.layers]

    def _hook(self, module: nn.Module, args: tuple[Any, ...], output: Tensor) -> None:
        if self._recording and torch.is_grad_enabled():
            if not args or not isinstance(output, Tensor):
                raise UserError(f"{type(module).__name__} was called without a positional input tensor; cannot clip")
            if output.requires_grad:
                self._calls.append(LayerCall(module, args[0].detach(), get_gradient_edge(output), output.shape[0]))

    @contextlib.contextmanager
    def recording(self) -> Iterator[list[LayerCall]]:
        """Record the layer calls of the forward passes run inside the block (cleared on exit)."""
        self._calls = []
        self._recording = True
        try:
            yield self._calls
        finally:
            self._recording = False
            self._calls = []

    def factors(self, calls: list[LayerCall], grads: list[Tensor | None]) -> dict[nn.Parameter, list[Factor]]:
        """Per-sample gradient factors of every trainable parameter, one per use (tied weights: several)."""
        out: dict[nn.Parameter, list[Factor]] = {}
        for call, grad in zip(calls, grads):
            if grad is None:
                continue
            for name, factor in self.layers[call.module].factors(call.module, call.inputs, grad).items():
                out.setdefault(getattr(call.module, name), []).append(factor)
        return out

    def remove(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
