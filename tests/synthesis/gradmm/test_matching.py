"""Closed-form matching loss vs the autograd double-backward reference (float64, tiny models)."""

from __future__ import annotations

import pytest
import torch

from privlm.resources.tiny import build_tiny_model
from privlm.synthesis.gradmm.matching import autograd_matching_loss, matching_loss, per_example_matching_loss
from privlm.synthesis.gradmm.prompt import head_logits, head_weight, last_hidden_from_embeds


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
def test_closed_form_loss_and_embedding_gradient_equal_double_backward(name: str) -> None:
    model, _ = build_tiny_model(name, seed=1, dtype=torch.float64)
    model.requires_grad_(False)
    gen = torch.Generator().manual_seed(0)
    weight = head_weight(model)
    target = torch.randn(weight.shape, generator=gen, dtype=torch.float64)
    x0 = 0.5 * torch.randn(4, 7, weight.shape[1], generator=gen, dtype=torch.float64)
    label = 17

    def closed(x: torch.Tensor) -> torch.Tensor:
        hidden = last_hidden_from_embeds(model, x)
        return matching_loss(hidden, head_logits(model, hidden), label, target)

    def reference(x: torch.Tensor) -> torch.Tensor:
        return autograd_matching_loss(last_hidden_from_embeds(model, x), weight, label, target)

    values, grads = [], []
    for fn in (closed, reference):
        x = x0.clone().requires_grad_(True)
        loss = fn(x)
        (grad,) = torch.autograd.grad(loss, x)
        values.append(loss.detach())
        grads.append(grad)
    torch.testing.assert_close(values[0], values[1], rtol=1e-5, atol=0)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-12)
    assert grads[1].abs().max() > 1e-6  # the gradient being compared is not trivially zero


def test_reference_gradient_is_the_sum_of_per_sample_head_gradients() -> None:
    """autograd_matching_loss's G, rebuilt from a loop of per-sample CE gradients, gives the same loss."""
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(3, 6, generator=gen, dtype=torch.float64)
    weight = torch.randn(11, 6, generator=gen, dtype=torch.float64)
    target = torch.randn(11, 6, generator=gen, dtype=torch.float64)
    total = torch.zeros_like(weight)
    for h in hidden:
        w = weight.clone().requires_grad_(True)
        torch.nn.functional.cross_entropy((w @ h)[None], torch.tensor([4])).backward()
        total += w.grad
    expected = 1 - (total * target).sum() / (total.norm() * target.norm())
    torch.testing.assert_close(autograd_matching_loss(hidden, weight, 4, target), expected, rtol=1e-10, atol=0)
    torch.testing.assert_close(matching_loss(hidden, hidden @ weight.T, 4, target), expected, rtol=1e-10, atol=0)


def test_per_example_loss_is_the_batch_loss_of_each_example_alone() -> None:
    gen = torch.Generator().manual_seed(4)
    hidden = torch.randn(5, 6, generator=gen, dtype=torch.float64)
    logits = torch.randn(5, 9, generator=gen, dtype=torch.float64)
    target = torch.randn(9, 6, generator=gen, dtype=torch.float64)
    each = per_example_matching_loss(hidden, logits, 2, target)
    alone = torch.stack([matching_loss(hidden[j : j + 1], logits[j : j + 1], 2, target) for j in range(5)])
    torch.testing.assert_close(each, alone, rtol=1e-10, atol=0)
