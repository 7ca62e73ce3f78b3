"""decode_weights writes a bitmap-masked weight straight into a CPU, contiguous target (_batch_decode._place_bitmaps):
exactly the target's numel entries, none past it. A target that is a contiguous slice of a larger buffer (a row of
a stacked parameter) must leave the buffer's other entries alone, also when numel is not a multiple of 8 (the
mask's last byte holds padding bits, whose fields gather the +0 sentinel)."""

import pytest
import torch
from sqs_core._artifact_layout import decode_weight, encode
from sqs_core._batch_decode import decode_weights
from sqs_core._batch_plan import plan_record
from sqs_core.discrete import DiscretePosterior


def _posterior(n, seed):
    gen = torch.Generator().manual_seed(seed)
    return DiscretePosterior(
        shape=(n,),
        codebook=torch.randn(1, 4, generator=gen) + 3.0,  # no level is 0 or 7
        window_ids=torch.zeros(n, dtype=torch.uint8),
        greedy=torch.randint(0, 4, (n,), generator=gen, dtype=torch.uint8),
        keep=torch.rand(n, generator=gen) < 0.5,
        alt_index=torch.zeros(0, dtype=torch.long),
        alt_probs=torch.zeros(0, 4),
    )


@pytest.mark.parametrize("n", [13, 203, 1003, 4097])
def test_a_target_slice_gets_its_weights_and_nothing_past_them(n):
    records, blobs, buffers, into = [], {}, {}, {}
    for i, size in enumerate((n, n + 5)):  # two records: one batch (a lone record may take another route)
        record, blob = encode(_posterior(size, i), alternatives=False)
        name = f"layer{i}"
        records.append(record | {"layers": [name]})
        blobs[name] = blob
        assert plan_record(name, records[-1], blob).mask == "bitmap"
        buffers[name] = torch.full((size + 16,), 7.0)
        into[name] = buffers[name][:size]  # contiguous, so written directly
    got = decode_weights(records, blobs, into)
    for rec in records:
        name = rec["layers"][0]
        want = decode_weight(name, rec, blobs[name])
        assert got[name] is into[name]
        assert torch.equal(got[name], want)
        tail = buffers[name][want.numel() :]
        assert bool((tail == 7.0).all()), tail  # nothing written past the target
