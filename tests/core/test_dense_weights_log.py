"""prepare_ says which weights stay dense because no adapter knows their module's type (sqs_core._coverage): a
WARNING from 5% of the model's weights (parameters of 2+ dimensions), INFO below; layers the config leaves dense
are the user's choice and not reported; a tie to such a module names the type in its error."""

import logging

import pytest
import sqs_core as sqs
import torch
from torch import nn


class PositionalNet(nn.Module):
    """A ViT's shape: a learned positional table held by the model itself, beside its Linear layers."""

    def __init__(self, width=32, depth=8):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(1, 4, width))
        self.scale = nn.Parameter(torch.ones(width))  # 1-D: not a weight matrix, never reported
        self.body = nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)])

    def forward(self, x):
        return self.body(x + self.pos) * self.scale


def _dense_lines(caplog):
    return [r for r in caplog.records if "stay dense" in r.getMessage()]


@pytest.mark.parametrize(("depth", "level"), [(8, logging.INFO), (1, logging.WARNING)])
def test_the_dense_share_is_logged_at_the_level_its_size_calls_for(caplog, depth, level):
    with caplog.at_level(logging.INFO, logger="sqs_core"):
        sqs.prepare_(PositionalNet(depth=depth), sqs.SQSConfig(num_components=4))
    (line,) = _dense_lines(caplog)
    assert line.levelno == level
    total = 4 * 32 + depth * 32 * 32
    assert f"(128 of {total}," in line.getMessage() and "PositionalNet (pos:" in line.getMessage()


def test_layers_left_dense_by_the_config_are_not_reported(caplog):
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    with caplog.at_level(logging.INFO, logger="sqs_core"):
        sqs.prepare_(model, sqs.SQSConfig(num_components=4, exclude=("^2$",)))
    assert not _dense_lines(caplog)


class TableLM(nn.Module):
    """A head tied to a lookup table of a type sqs-core does not know (IBERT's QuantEmbedding)."""

    class Table(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(10, 4))

        def forward(self, i):
            return self.weight[i]

    def __init__(self):
        super().__init__()
        self.table = self.Table()
        self.mix = nn.Linear(4, 4)
        self.head = nn.Linear(4, 10)
        self.head.weight = self.table.weight

    def forward(self, i):
        return self.head(self.mix(self.table(i)))


def test_a_tie_to_a_module_of_an_unknown_type_names_the_type_and_the_way_out():
    model = TableLM()
    with pytest.raises(ValueError, match=r"'head' is tied to 'table.weight'.*a Table, a module sqs-core does not "):
        sqs.prepare_(model)
    assert not sqs.is_prepared(model)
    sqs.prepare_(model, sqs.SQSConfig(num_components=4, exclude=("head",)))  # the way the message gives
    assert model.head.weight is model.table.weight
