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
                 extra={"pixel_values": torch.randn(n, 2, 2)})


def test_split_then_concat_gives_the_batch_back():
    batch = make()
    parts = batch.split(2)
    assert [len(p) for p in parts] == [2, 3] or [len(p) for p in parts] == [3, 2]
    whole = Batch.concat(parts)
    for name in ("input_ids", "rewards", "group_ids", "old_logp"):
        assert torch.equal(getattr(whole, name), getattr(batch, name)), name
    assert torch.equal(whole.extra["pixel_values"], batch.extra["pixel_values"])
    assert whole.ref_logp is None and whole.prompt_len == 3


def test_select_takes_every_per_sample_field():
    batch = make()
    picked = batch.select([4, 0])
    assert picked.rewards.tolist() == [4.0, 0.0]
    assert torch.equal(picked.extra["pixel_values"][0], batch.extra["pixel_values"][4])
    assert torch.equal(picked.responses, batch.input_ids[[4, 0], 3:])


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
