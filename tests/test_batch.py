"""The batch type: select, split by rank, concatenate back, pickle."""

import pickle

import pytest
import torch

from rlx.batch import Batch


def make(n=5, prompt=3, response=4):
    ids = torch.arange(n * (prompt + response)).reshape(n, prompt + response)
    return Batch(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=ids.clone(),
                 action_mask=torch.ones(n, response), prompt_len=prompt, rewards=torch.arange(n).float(),
                 group_ids=torch.tensor([0, 0, 1, 1, 2][:n]), old_logp=-torch.rand(n, response),
                 policy_version=torch.arange(n), token_versions=torch.arange(n)[:, None] + torch.arange(response),
                 extra={"pixel_values": torch.randn(n, 2, 2)})


def test_split_then_concat_gives_the_batch_back():
    batch = make()
    parts = batch.split(2)
    assert [len(p) for p in parts] == [2, 3] or [len(p) for p in parts] == [3, 2]
    whole = Batch.concat(parts)
    for name in ("input_ids", "rewards", "group_ids", "old_logp", "policy_version", "token_versions"):
        assert torch.equal(getattr(whole, name), getattr(batch, name)), name
    assert torch.equal(whole.extra["pixel_values"], batch.extra["pixel_values"])
    assert whole.ref_logp is None and whole.prompt_len == 3


def test_select_takes_every_per_sample_field():
    batch = make()
    picked = batch.select([4, 0])
    assert picked.rewards.tolist() == [4.0, 0.0]
    assert torch.equal(picked.extra["pixel_values"][0], batch.extra["pixel_values"][4])
    assert torch.equal(picked.responses, batch.input_ids[[4, 0], 3:])
    # a partial rollout's tokens keep the versions that sampled them
    assert picked.token_versions.tolist() == [[4, 5, 6, 7], [0, 1, 2, 3]] and picked.policy_version.tolist() == [4, 0]


def test_bad_splits_and_concats_are_refused():
    batch = make()
    with pytest.raises(ValueError, match="cannot split 5 samples into 6"):
        batch.split(6)
    with pytest.raises(ValueError, match="padded widths"):
        Batch.concat([batch, make(response=2)])
    other = make()
    other.old_logp = None
    with pytest.raises(ValueError, match="old_logp"):
        Batch.concat([batch, other])


def test_it_pickles_as_tensors():
    batch = make()
    again = pickle.loads(pickle.dumps(batch))
    assert torch.equal(again.input_ids, batch.input_ids) and again.prompt_len == batch.prompt_len


def test_ragged_extras_follow_their_samples_through_select_split_and_concat():
    # a VLM's pixel_values: every patch of the batch in one 2-D tensor; sample b owns
    # prod(image_grid_thw) rows per image, and 0, 1 or 2 images
    grids = [[[1, 2, 2]], [], [[1, 2, 4], [1, 2, 2]], [[1, 4, 4]], [[1, 2, 2]]]
    patches = [torch.full((sum(t * h * w for t, h, w in g), 3), float(b)) for b, g in enumerate(grids)]
    batch = make()
    batch.extra = {"pixel_values": torch.cat(patches),
                   "image_grid_thw": torch.tensor([g for gs in grids for g in gs]).reshape(-1, 3)}
    batch.extra_rows = {"pixel_values": torch.tensor([len(p) for p in patches]),
                        "image_grid_thw": torch.tensor([len(g) for g in grids])}

    def owners(b):  # the sample each patch row came from, and each sample's grids
        return b.extra["pixel_values"][:, 0].tolist(), b.extra["image_grid_thw"].tolist()

    picked = batch.select([3, 0, 2, 1])
    rows, grid = owners(picked)
    assert rows == [3.0] * 16 + [0.0] * 4 + [2.0] * 12 and grid == [[1, 4, 4], [1, 2, 2], [1, 2, 4], [1, 2, 2]]
    assert picked.extra_rows["pixel_values"].tolist() == [16, 4, 12, 0]
    assert picked.extra_rows["image_grid_thw"].tolist() == [1, 1, 2, 0]
    # each share's patches match its grids; concatenated, the shares give the batch back
    for share in batch.split(3):
        rows, grid = owners(share)
        assert len(rows) == sum(t * h * w for t, h, w in grid)
    whole = Batch.concat(batch.split(3))
    assert torch.equal(whole.extra["pixel_values"], batch.extra["pixel_values"])
    assert torch.equal(whole.extra_rows["pixel_values"], batch.extra_rows["pixel_values"])
    assert owners(batch.select([1]))[0] == []  # a sample without images owns no rows
