"""``sqs.load`` hands the skeleton's ``load_state_dict`` the state versions (``_metadata``) a ``state_dict()``
carries: a module that reads its version on load (torchvision's MNASNet raises "version should be set to 1 or 2
instead of None" without it) loads a file like its own state dict."""

import sqs_core as sqs
import torch
from torch import nn


class Versioned(nn.Module):
    """A network whose loader needs its state version, as torchvision's MNASNet's does."""

    _version = 2

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
        self.loaded_version = None

    def forward(self, x):
        return self.body(x)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args, **kwargs):
        self.loaded_version = local_metadata.get("version", None)
        if self.loaded_version not in (1, 2):
            raise ValueError(f"version should be set to 1 or 2 instead of {self.loaded_version}")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args, **kwargs)


def test_load_passes_the_skeletons_state_versions(tmp_path):
    torch.manual_seed(0)
    model = sqs.prepare_(Versioned(), sqs.SQSConfig(num_components=4))
    sqs.save(model, tmp_path / "m.sqs", nonzero=0.5)
    skeleton = Versioned()
    sqs.load(tmp_path / "m.sqs", skeleton)
    assert skeleton.loaded_version == 2
    sqs.greedy_(model, nonzero=0.5)
    x = torch.randn(4, 6)
    assert torch.equal(skeleton(x), model(x))
    average = sqs.load_bayesian_average(tmp_path / "m.sqs", Versioned(), samples=2)
    assert average(x).shape == (4, 3)
