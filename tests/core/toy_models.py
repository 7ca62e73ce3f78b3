"""Small models for the prepare → train → infer matrix (no dependency beyond torch)."""

from __future__ import annotations

import torch
from torch import nn


class Conv1D(nn.Module):
    """Same contract as transformers.pytorch_utils.Conv1D: weight (in, out), y = x W + b."""

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.1)
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).reshape(*x.shape[:-1], self.nf)


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(12, 12)
        self.b = nn.Linear(12, 12)
        self.b.weight = self.a.weight  # tied
        self.head = nn.Linear(12, 5)

    def forward(self, x):
        return self.head(torch.relu(self.b(torch.relu(self.a(x)))))


class Nested(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(12, 12), nn.ReLU()) for _ in range(2)])
        self.shared = nn.Linear(12, 12)
        self.head = nn.Sequential(nn.Sequential(nn.Linear(12, 5)))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(self.shared(self.shared(x)))  # one module used twice


class GPTish(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 12)
        self.c_fc = Conv1D(24, 12)
        self.c_proj = Conv1D(5, 24)

    def forward(self, x):
        idx = (x.abs() * 7).long().clamp_max(19)[:, :3]
        h = self.emb(idx).mean(1)
        return self.c_proj(torch.relu(self.c_fc(h)))


def mlp():
    return nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 5))


def cnn():
    return nn.Sequential(
        nn.Unflatten(1, (3, 2, 2)), nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Flatten(), nn.Linear(32, 5),
    )  # fmt: skip


def conv1d():
    return nn.Sequential(
        nn.Unflatten(1, (3, 4)), nn.Conv1d(3, 6, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(24, 5)
    )


def deconv():
    """A decoder-like net: a transposed convolution upsamples 2×2 to 4×4."""
    return nn.Sequential(
        nn.Unflatten(1, (3, 2, 2)), nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1), nn.ReLU(),
        nn.Flatten(), nn.Linear(64, 5),
    )  # fmt: skip


def attention():
    """A transformer block (nn.MultiheadAttention's in_proj and out_proj, two Linears) over 3 tokens of width 4."""
    block = nn.TransformerEncoderLayer(4, 2, 8, dropout=0.0, batch_first=True)
    return nn.Sequential(nn.Unflatten(1, (3, 4)), block, nn.Flatten(), nn.Linear(12, 5))


class Recurrent(nn.Module):
    """An LSTM over 3 steps of width 4 (four compressed weight matrices, nested SQS layers) and a Linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(4, 6, batch_first=True, bidirectional=True)
        self.head = nn.Linear(36, 5)

    def forward(self, x):
        return self.head(self.lstm(x.reshape(-1, 3, 4))[0].flatten(1))


MODELS = {
    "mlp": mlp,
    "cnn": cnn,
    "conv1d": conv1d,
    "deconv": deconv,
    "nested": Nested,
    "tied": Tied,
    "gptish": GPTish,
    "attention": attention,
    "recurrent": Recurrent,
}


class FusedExperts(nn.Module):
    """As transformers' ``@use_experts_implementation`` experts: stacked weights ``gate_up_proj`` (experts,
    2·inner, width) and ``down_proj`` (experts, width, inner), the decorator's four flags (``flags=False``: a type it
    does not mark, Llama-4's), a gpt-oss 2-D per-expert bias with ``with_bias``; top-1 routing, given or (``expert``
    None) a fixed one from the input's first entries."""

    def __init__(self, width: int, inner: int, experts: int, *, with_bias: bool = False, flags: bool = True) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.randn(experts, 2 * inner, width) / width**0.5)
        self.down_proj = nn.Parameter(torch.randn(experts, width, inner) / inner**0.5)
        if with_bias:
            self.gate_up_proj_bias = nn.Parameter(torch.randn(experts, 2 * inner) / 10)
        if flags:
            self.has_gate, self.has_bias, self.is_transposed, self.is_concatenated = True, with_bias, False, True
            self._is_expert_parallel = False
        self.with_bias = with_bias

    def forward(self, h, expert=None):  # h: (rows, width); expert: (rows,) the one expert each row goes to
        if expert is None:
            expert = h[:, : self.gate_up_proj.shape[0]].argmax(-1)
        up = torch.einsum("nh,noh->no", h, self.gate_up_proj[expert])
        if self.with_bias:
            up = up + self.gate_up_proj_bias[expert]
        gate, up = up.chunk(2, dim=-1)
        return torch.einsum("ni,nhi->nh", torch.nn.functional.silu(gate) * up, self.down_proj[expert])
