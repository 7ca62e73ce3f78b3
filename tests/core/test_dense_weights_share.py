"""sqs_core._coverage: the dense share at exactly WARN_SHARE is a WARNING ("at least 5%"), and a type's weights
are summed over all its parameters (two matrices of one unknown type: both counted)."""

import logging

import torch
from sqs_core._coverage import WARN_SHARE, dense_weights, log_dense_weights
from torch import nn


class Two(nn.Module):
    """An unknown type holding two weight matrices."""

    def __init__(self, rows):
        super().__init__()
        self.a = nn.Parameter(torch.zeros(rows, 5))
        self.b = nn.Parameter(torch.zeros(1, 5))


def test_a_share_of_exactly_warn_share_warns_and_a_types_weights_are_summed(caplog):
    model = nn.Sequential(nn.Linear(19, 5), Two(0))  # 95 + 0 + 5 weights: 5 of 100 dense, exactly 5%
    total, dense = found = dense_weights(model)
    assert total == 100 and dense == {"Two": (["a", "b"], 5)}
    assert WARN_SHARE == 5 / 100
    with caplog.at_level(logging.INFO, logger="sqs_core"):
        log_dense_weights(found)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    wide = nn.Sequential(nn.Linear(10, 10), Two(3))  # 100 + 15 + 5: both of Two's matrices counted
    assert dense_weights(wide) == (120, {"Two": (["a", "b"], 20)})
