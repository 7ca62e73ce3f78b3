"""What the model-zoo suites share (tests/integration, tests/vision, tests/architectures): a short training run, and
the check that transformers' re-tying leaves a prepared model as it was."""

from __future__ import annotations

from collections.abc import Callable

import sqs_core as sqs
import torch


def train_with_schedule(
    model: torch.nn.Module, steps: int, loss_of: Callable, *, num_data: int, nonzero: float = 1.0
) -> list[float]:
    """``steps`` AdamW steps of Ω_apx, the cubic pruning schedule ramping to ``nonzero``, as the README trains;
    the losses, each asserted finite. The caller sets train or eval mode."""
    objective = sqs.Objective(model, num_data=num_data)
    optimizer = torch.optim.AdamW(sqs.param_groups(model, gate_lr=1e-4))  # the rate for pretrained networks
    pruning = sqs.PruningSchedule(model, target_nonzero=nonzero, total_steps=steps)
    losses = []
    for step in range(steps):
        pruning.step(step)
        loss = objective(loss_of(model))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert torch.isfinite(loss), f"step {step}: loss {loss.item()}"
        losses.append(loss.item())
    return losses


def assert_tying_again_changes_nothing(model: torch.nn.Module) -> None:
    """transformers' ``tie_weights()``, as a user calls it and as ``init_weights`` does (from the mapping gathered at
    construction), leaves every state entry of a prepared model the same tensor: the ties a posterior holds are
    retired from the model's declarations, the others re-tie what is tied already."""
    state = model.state_dict(keep_vars=True)
    model.tie_weights()
    model.tie_weights(recompute_mapping=False)
    after = model.state_dict(keep_vars=True)
    assert after.keys() == state.keys() and all(after[key] is tensor for key, tensor in state.items())
