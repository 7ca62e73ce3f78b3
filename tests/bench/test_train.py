"""The shared training loop's data loss: cross-entropy, or cross-entropy mixed with distillation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from sqs_bench.train import Budget, data_loss, fit
from torch import nn

_logits = st.integers(0, 10_000).map(lambda s: torch.randn(6, 5, generator=torch.Generator().manual_seed(s)) * 3)


@settings(max_examples=30)
@given(student=_logits, teacher=_logits, alpha=st.floats(0.0, 1.0), temp=st.floats(0.5, 8.0))
def test_distillation_loss_is_the_hinton_mixture(student, teacher, alpha, temp):
    labels = torch.arange(6) % 5
    budget = Budget(distill_weight=alpha, distill_temperature=temp)
    got = data_loss(student, labels, teacher, budget)
    p_t = torch.softmax(teacher / temp, 1)
    kl = (p_t * (p_t.log() - torch.log_softmax(student / temp, 1))).sum(1).mean()  # per-example KL, averaged
    want = (1 - alpha) * F.cross_entropy(student, labels) + alpha * temp**2 * kl
    assert math.isclose(float(got), float(want), rel_tol=1e-5, abs_tol=1e-6)


def test_distillation_vanishes_when_student_equals_teacher_and_defaults_to_cross_entropy():
    logits, labels = torch.randn(4, 3), torch.tensor([0, 1, 2, 0])
    assert float(data_loss(logits, labels, logits, Budget(distill_weight=1.0))) == pytest.approx(0.0, abs=1e-6)
    ce = F.cross_entropy(logits, labels)
    assert torch.equal(data_loss(logits, labels, None, Budget()), ce)
    assert torch.equal(data_loss(logits, labels, logits * 2, Budget(distill_weight=0.0)), ce)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"distill_weight": 1.5}, "distill_weight"),
        ({"distill_weight": -0.1}, "distill_weight"),
        ({"distill_temperature": 0.0}, "distill_temperature"),
    ],
)
def test_budget_rejects_bad_distillation_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Budget(**kwargs)


def test_fit_needs_the_teacher_when_distilling():
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10))
    images, labels = torch.zeros(4, 3, 32, 32, dtype=torch.uint8), torch.zeros(4, dtype=torch.int64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="teacher"):
        fit(model, optimizer, images, labels, Budget(epochs=1, batch_size=2, distill_weight=0.5))
    record = fit(model, optimizer, images, labels, Budget(epochs=1, batch_size=2, distill_weight=0.5), teacher=model)
    assert record["steps"] == 2
