import random

import numpy as np
import pytest
import torch

from rlx.checkpoint import (COMPLETE, latest_checkpoint, load_checkpoint, rng_state, save_checkpoint,
                            set_rng_state)
from rlx.config import TrainingConfig
from rlx.engine import PlainEngine


def _engine(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    return PlainEngine(model, TrainingConfig(lr=1e-2, warmup_steps=2), total_steps=10)


def _step(engine, seed):
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(seed))
    engine.backward(engine.model(x).pow(2).mean())
    return engine.step()


def _draws():
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_rng_state_round_trip(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    torch.save(rng_state(), tmp_path / "rng.pt")
    first = _draws()
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert _draws() == first


def test_save_then_load_restores_everything(tmp_path):
    engine = _engine()
    _step(engine, 1)
    path = save_checkpoint(tmp_path, 1, engine, {"step": 1, "epoch": 0.5}, keep=2)
    assert path == tmp_path / "step_00000001" and (path / COMPLETE).is_file()
    assert latest_checkpoint(tmp_path) == path
    draws = _draws()
    want = _step(engine, 2)
    weights = [p.detach().clone() for p in engine.model.parameters()]

    resumed = _engine(seed=5)
    state = load_checkpoint(path, resumed)
    assert state == {"step": 1, "epoch": 0.5}
    assert _draws() == draws
    assert _step(resumed, 2) == want
    for a, b in zip(resumed.model.parameters(), weights):
        assert torch.equal(a, b)


def test_a_folder_without_complete_is_ignored(tmp_path):
    engine = _engine()
    good = save_checkpoint(tmp_path, 1, engine, {"step": 1}, keep=5)
    broken = tmp_path / "step_00000002"
    (broken / "engine").mkdir(parents=True)
    (broken / "trainer_state.json").write_text('{"step": 2}')
    assert latest_checkpoint(tmp_path) == good
    with pytest.raises(FileNotFoundError, match="COMPLETE"):
        load_checkpoint(broken, engine)


def test_a_killed_save_is_ignored_and_cleaned_up(tmp_path, monkeypatch):
    engine = _engine()
    good = save_checkpoint(tmp_path, 1, engine, {"step": 1}, keep=5)

    def killed(directory):
        directory.mkdir(parents=True)
        (directory / "engine.pt").write_bytes(b"half a fi")
        raise KeyboardInterrupt

    monkeypatch.setattr(engine, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 2, engine, {"step": 2}, keep=5)
    # a kill between the marker and the rename leaves a tmp folder that looks complete inside
    late = tmp_path / "step_00000003.tmp-999999"
    late.mkdir()
    (late / COMPLETE).write_text("3\n")
    assert len(list(tmp_path.glob("*.tmp-*"))) == 2
    assert latest_checkpoint(tmp_path) == good

    monkeypatch.undo()
    newer = save_checkpoint(tmp_path, 4, engine, {"step": 4}, keep=5)
    assert latest_checkpoint(tmp_path) == newer
    assert not list(tmp_path.glob("*.tmp-*"))


def test_keep_prunes_the_oldest(tmp_path):
    engine = _engine()
    for step in range(1, 5):
        _step(engine, step)
        save_checkpoint(tmp_path, step, engine, {"step": step}, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000003", "step_00000004"]
    save_checkpoint(tmp_path, 5, engine, {"step": 5}, keep=0)  # 0 keeps every checkpoint
    assert len(list(tmp_path.iterdir())) == 3


def test_saving_a_step_again_replaces_it(tmp_path):
    engine = _engine()
    save_checkpoint(tmp_path, 3, engine, {"step": 3, "note": "first"}, keep=2)
    path = save_checkpoint(tmp_path, 3, engine, {"step": 3, "note": "again"}, keep=2)
    assert load_checkpoint(path, engine)["note"] == "again"
    assert [p.name for p in tmp_path.iterdir()] == ["step_00000003"]


def test_named_checkpoints_sit_beside_step_ones(tmp_path):
    actor, critic = _engine(), _engine(seed=1)
    _step(critic, 1)
    path = save_checkpoint(tmp_path, 2, actor, {"step": 2}, keep=1)
    named = save_checkpoint(path, 0, critic, {"role": "critic"}, keep=1, name="critic")
    assert named == path / "critic" and (named / COMPLETE).is_file()
    assert latest_checkpoint(path) is None  # a named folder is no step checkpoint
    save_checkpoint(tmp_path, 2, actor, {"step": 2}, keep=1, name="best")
    save_checkpoint(tmp_path, 3, actor, {"step": 3}, keep=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best", "step_00000003"]  # pruning spares names
    path = tmp_path / "step_00000003"
    save_checkpoint(path, 0, critic, {"role": "critic"}, keep=1, name="critic")
    resumed = _engine(seed=5)
    assert load_checkpoint(path / "critic", resumed) == {"role": "critic"}
    for a, b in zip(resumed.model.parameters(), critic.model.parameters()):
        assert torch.equal(a, b)
