"""An ``nn.Embedding``'s ``padding_idx`` row, zero in the layer, stays exactly zero through prepare → train →
greedy / sampled / averaged inference and the artifact: prepare_ pins it pruned (SpikeGMMPosterior.pin_zero_rows_).
Before, it became the level nearest 0 unless the pruning schedule happened to remove it."""

import pytest
import sqs_core as sqs
import torch
import torch.nn.functional as F
from torch import nn

PAD, VOCAB, DIM = 2, 12, 6
TOKENS = torch.tensor([[0, 1, 2, 3], [2, 2, 5, 11], [7, 2, 9, 4]])
LABELS = torch.tensor([0, 1, 1])


class Bag(nn.Module):
    """Sum of token embeddings, then a linear head: a padding token contributes its row."""

    def __init__(self, padding_idx=PAD):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM, padding_idx=padding_idx)
        self.head = nn.Linear(DIM, 2)

    def forward(self, tokens):
        return self.head(self.embed(tokens).sum(1))


def model_with_levels_away_from_zero(padding_idx=PAD):
    """A Bag whose other embedding weights all have magnitudes in [0.5, 1.5], so (with K = 2) no level is near 0:
    the level nearest the zero padding row is far from it unless the row is pruned."""
    torch.manual_seed(0)
    model = Bag(padding_idx)
    with torch.no_grad():
        magnitude = torch.empty(VOCAB, DIM).uniform_(0.5, 1.5)
        model.embed.weight.copy_(torch.where(torch.rand(VOCAB, DIM) < 0.5, -magnitude, magnitude))
        if model.embed.padding_idx is not None:
            model.embed.weight[model.embed.padding_idx] = 0.0
    return model


def train(model, steps=6, target_nonzero=0.5):
    objective = sqs.Objective(model, num_data=3)
    optimizer = torch.optim.Adam(sqs.param_groups(model), lr=1e-2)
    schedule = sqs.PruningSchedule(model, target_nonzero=target_nonzero, total_steps=steps, end_fraction=0.5)
    masks = []
    for step in range(steps):
        schedule.step(step)
        masks.append(sqs.posteriors(model)["embed"].mask.clone())
        optimizer.zero_grad()
        objective(F.cross_entropy(model(TOKENS), LABELS)).backward()
        optimizer.step()
    return masks


def embed_weight(model):
    return sqs.sqs_layers(model)["embed"].weight.detach()


def test_prepare_pins_a_zero_padding_row():
    model = sqs.prepare_(model_with_levels_away_from_zero(), sqs.SQSConfig(num_components=2))
    posterior = sqs.posteriors(model)["embed"]
    assert posterior.pinned_zero_rows == (PAD,)
    assert not posterior.mask[PAD].any() and posterior.mask.sum() == (VOCAB - 1) * DIM
    assert torch.equal(embed_weight(model)[PAD], torch.zeros(DIM))  # θ^avg: λ̃ = 0 there
    assert sqs.posteriors(model)["head"].pinned_zero_rows == ()


def test_the_padding_row_stays_zero_through_training_and_every_inference(tmp_path):
    model = sqs.prepare_(model_with_levels_away_from_zero(), sqs.SQSConfig(num_components=2))
    for mask in train(model):
        assert not mask[PAD].any()
    nonzero_rows = [r for r in range(VOCAB) if r != PAD]
    sqs.greedy_(model, nonzero=1.0)  # keep every weight the scores allow: the pinned row still goes
    greedy = embed_weight(model)
    assert torch.equal(greedy[PAD], torch.zeros(DIM))
    assert bool((greedy[nonzero_rows] != 0).all())  # the others take levels away from 0
    sqs.sample_(model, nonzero=1.0, generator=torch.Generator().manual_seed(0))
    assert torch.equal(embed_weight(model)[PAD], torch.zeros(DIM))
    sqs.variational_(model)
    averaged = sqs.BayesianAverage(model, samples=3, nonzero=1.0, generator=torch.Generator().manual_seed(1))
    sqs.save(model, tmp_path / "bag.sqs", nonzero=1.0)
    for mode, generator in (("greedy", None), ("sample", torch.Generator().manual_seed(0))):
        loaded = sqs.load(tmp_path / "bag.sqs", Bag(), mode=mode, generator=generator)
        assert torch.equal(loaded.embed.weight.detach()[PAD], torch.zeros(DIM))
    # the padding token adds nothing: a batch with and without it gives the same averaged output
    with_pad, without_pad = torch.tensor([[1, PAD, 3]]), torch.tensor([[1, 3]])
    assert torch.allclose(averaged(with_pad), averaged(without_pad), atol=1e-6)


def test_the_schedule_keeps_its_exact_count_with_a_pinned_row():
    model = sqs.prepare_(model_with_levels_away_from_zero(), sqs.SQSConfig(num_components=2))
    schedule = sqs.PruningSchedule(model, target_nonzero=0.5, total_steps=4, end_fraction=0.0)
    schedule.step(3)
    total = sum(p.mask.numel() for p in sqs.posteriors(model).values())
    kept = sum(int(p.mask.sum()) for p in sqs.posteriors(model).values())
    assert kept == round(0.5 * total)
    assert not sqs.posteriors(model)["embed"].mask[PAD].any()
    schedule = sqs.PruningSchedule(model, target_nonzero=0.5, total_steps=4, start_fraction=1.0, end_fraction=1.0)
    schedule.step(0)  # before the ramp: every weight on, but the pinned row
    assert sqs.posteriors(model)["embed"].mask.sum() == (VOCAB - 1) * DIM


@pytest.mark.parametrize("padding_idx", [None, -1])
def test_only_a_zero_padding_row_is_pinned(padding_idx):
    model = model_with_levels_away_from_zero(padding_idx)
    if padding_idx is None:
        with torch.no_grad():
            model.embed.weight[PAD] = 0.0  # a zero row that is not the padding row: compressed as usual
    sqs.prepare_(model, sqs.SQSConfig(num_components=2))
    expected = () if padding_idx is None else (VOCAB - 1,)  # nn.Embedding stores −1 as VOCAB − 1
    assert sqs.posteriors(model)["embed"].pinned_zero_rows == expected


def test_a_non_zero_padding_row_is_compressed_like_the_others():
    model = model_with_levels_away_from_zero()
    with torch.no_grad():
        model.embed.weight[PAD] = 1.0
    sqs.prepare_(model, sqs.SQSConfig(num_components=2))
    assert sqs.posteriors(model)["embed"].pinned_zero_rows == ()
    sqs.greedy_(model, nonzero=1.0)
    assert bool((embed_weight(model)[PAD] != 0).all())


def test_a_tied_head_shares_the_pinned_row():
    class TiedLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, DIM, padding_idx=PAD)
            self.head = nn.Linear(DIM, VOCAB, bias=False)
            self.head.weight = self.embed.weight

        def forward(self, tokens):
            return self.head(self.embed(tokens))

    torch.manual_seed(0)
    model = sqs.prepare_(TiedLM(), sqs.SQSConfig(num_components=2))
    assert list(sqs.posteriors(model)) == ["embed"] and sqs.posteriors(model)["embed"].pinned_zero_rows == (PAD,)
    sqs.greedy_(model, nonzero=1.0)
    logits = model(torch.tensor([[1, 3]]))
    assert torch.equal(logits[..., PAD], torch.zeros(1, 2))  # the pad token's output row is the zero row


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([VOCAB], r"rows to pin must lie in \[0, 12\)"),
        ([-1], "row to pin must be an int >= 0"),
        ([1.0], "must be an int"),
    ],
)
def test_pinning_a_row_outside_the_tensor_is_refused(rows, message):
    model = sqs.prepare_(model_with_levels_away_from_zero(), sqs.SQSConfig(num_components=2))
    posterior = sqs.posteriors(model)["embed"]
    with pytest.raises(ValueError, match=message):
        posterior.pin_zero_rows_(rows)
    assert posterior.pinned_zero_rows == (PAD,) and posterior.mask.sum() == (VOCAB - 1) * DIM


def test_pinning_adds_rows_and_a_loaded_mask_gets_them_again():
    model = sqs.prepare_(model_with_levels_away_from_zero(), sqs.SQSConfig(num_components=2))
    posterior = sqs.posteriors(model)["embed"]
    posterior.pin_zero_rows_([5])
    assert posterior.pinned_zero_rows == (PAD, 5) and posterior.mask.sum() == (VOCAB - 2) * DIM
    state = model.state_dict()
    state["embed.posterior.mask"] = torch.ones(VOCAB, DIM, dtype=torch.bool)  # e.g. a checkpoint from before pins
    model.load_state_dict(state)
    assert not posterior.mask[[PAD, 5]].any() and posterior.mask.sum() == (VOCAB - 2) * DIM


def test_pins_survive_a_deepcopy_and_a_pickle():
    import copy
    import pickle

    model = sqs.prepare_(model_with_levels_away_from_zero(), sqs.SQSConfig(num_components=2))
    state = {**model.state_dict(), "embed.posterior.mask": torch.ones(VOCAB, DIM, dtype=torch.bool)}
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert sqs.posteriors(clone)["embed"].pinned_zero_rows == (PAD,)
        assert int(sqs.posteriors(clone)["embed"].mask.sum()) == (VOCAB - 1) * DIM
        with torch.no_grad():
            sqs.posteriors(model)["embed"].mask.fill_(True)  # the original's mask: the clone's hook must not touch it
        clone.load_state_dict(state)  # the clone's own load hook pins the clone's mask
        assert int(sqs.posteriors(clone)["embed"].mask.sum()) == (VOCAB - 1) * DIM
        assert bool(sqs.posteriors(model)["embed"].mask.all())


@pytest.mark.parametrize("pad_in_checkpoint", [True, False])
def test_a_model_prepared_from_another_init_takes_the_checkpoints_pins(pad_in_checkpoint):
    """The pinned rows travel in the state dict (the posterior's ``_extra_state``): a model prepared from another
    init, whose padding row is zero where the checkpoint's was not (or the reverse), takes the checkpoint's pins and
    then computes what the checkpoint's model computes. Before, it kept its own: the padding token got a non-zero
    embedding, or a row the checkpoint kept was pruned."""
    source = model_with_levels_away_from_zero()
    if not pad_in_checkpoint:
        with torch.no_grad():
            source.embed.weight[PAD] = 0.75
    target = model_with_levels_away_from_zero()
    if pad_in_checkpoint:
        with torch.no_grad():
            target.embed.weight[PAD] = 0.75
    config = sqs.SQSConfig(num_components=2)
    source, target = sqs.prepare_(source, config), sqs.prepare_(target, config)
    train(source)
    target.load_state_dict(source.state_dict())
    want = (PAD,) if pad_in_checkpoint else ()
    assert sqs.posteriors(target)["embed"].pinned_zero_rows == want
    for model in (source, target):
        sqs.greedy_(model, nonzero=1.0)
    assert torch.equal(target(TOKENS), source(TOKENS))
    assert bool((embed_weight(target)[PAD] == 0).all()) == pad_in_checkpoint


def test_a_checkpoint_without_pins_keeps_the_models_own_and_bad_pins_are_reported():
    model = sqs.prepare_(model_with_levels_away_from_zero(), sqs.SQSConfig(num_components=2))
    posterior = sqs.posteriors(model)["embed"]
    state = model.state_dict()
    assert torch.equal(state["embed.posterior._extra_state"], torch.tensor([PAD]))
    older = {k: v for k, v in state.items() if not k.endswith("_extra_state")}  # saved before pins were
    model.load_state_dict(older)
    assert posterior.pinned_zero_rows == (PAD,)
    for bad in (torch.tensor([VOCAB]), torch.tensor([-1]), torch.tensor([0.5]), torch.zeros(1, 1, dtype=torch.long)):
        with pytest.raises(RuntimeError, match=r"embed.posterior._extra_state.*rows in \[0, 12\)"):
            model.load_state_dict({**state, "embed.posterior._extra_state": bad})
        assert posterior.pinned_zero_rows == (PAD,)
