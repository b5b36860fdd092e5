"""Exact resume on CPU: an interrupted and resumed run ends where an uninterrupted one does."""

from __future__ import annotations

import pytest

from e2e import KillAfter, Killed, config, metrics, one_thread, train  # noqa: F401 (one_thread: autouse)

N = 3
# what must match row for row (timings and throughput naturally differ)
COMPARED = ("step", "loss", "grad_norm", "lr", "epoch", "eval/loss")


def _weights(path):
    from safetensors.torch import load_file

    return load_file(path / "final" / "model.safetensors")


def assert_same_run(resumed, reference):
    rows, want = metrics(resumed), metrics(reference)
    assert [r["step"] for r in rows] == [r["step"] for r in want] == list(range(1, 2 * N + 1))
    for got, expected in zip(rows, want):
        assert set(got) == set(expected)
        for key in COMPARED:
            if key in expected:
                assert got[key] == pytest.approx(expected[key], rel=1e-6, abs=1e-9), (got["step"], key)
    a, b = _weights(resumed), _weights(reference)
    assert set(a) == set(b)
    for name in a:
        assert (a[name] - b[name]).abs().max().item() <= 1e-6, name


@pytest.fixture(scope="module")
def settings(tiny_model_dir):
    return {"model.path": tiny_model_dir, "training.lr": 2e-3, "training.eval_every": N,
            "checkpoint.every": N, "data.builtin_size": 40}  # 5 steps an epoch: the resume crosses an epoch


@pytest.fixture(scope="module")
def reference(settings, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference") / "run"
    train("sft", out, **settings, **{"training.max_steps": 2 * N})
    return out


def test_kill_mid_run_then_resume_is_exact(settings, reference, tmp_path, capsys):
    """A 2N-step run killed after step N + 1 (its checkpoint at N written, step N + 1
    logged, and a save of step N + 1 cut short), then resumed with the same command."""
    from rlx.checkpoint import COMPLETE
    from rlx.plugins import build_host
    from rlx.run import run

    out = tmp_path / "run"
    cfg, _ = config("sft", output=str(out), **settings, **{"training.max_steps": 2 * N})
    host = build_host()
    host.pm.register(KillAfter(N + 1))
    with pytest.raises(Killed):
        run(cfg, host)
    assert [r["step"] for r in metrics(out)] == list(range(1, N + 2))
    checkpoints = out / "checkpoints"
    assert [p.name for p in checkpoints.iterdir()] == [f"step_{N:08d}"]
    # what a kill in the middle of saving leaves: a temporary folder, and a renamed one
    # whose COMPLETE marker never got written
    torn = checkpoints / f"step_{N + 1:08d}.tmp-4242"
    (torn / "engine").mkdir(parents=True)
    (torn / "engine" / "engine.pt").write_bytes(b"torn")
    (torn / COMPLETE).write_text(f"{N + 1}\n")
    incomplete = checkpoints / f"step_{N + 2:08d}"
    (incomplete / "engine").mkdir(parents=True)
    (incomplete / "engine" / "engine.pt").write_bytes(b"torn")
    (incomplete / "trainer_state.json").write_text(f'{{"step": {N + 2}}}')
    capsys.readouterr()

    train("sft", out, resume=True, **settings, **{"training.max_steps": 2 * N})
    assert f"resumed from {checkpoints / f'step_{N:08d}'} at step {N}" in capsys.readouterr().out
    assert_same_run(out, reference)
    assert not torn.exists()


def test_resume_with_more_steps_is_exact(tiny_model_dir, tmp_path):
    """N steps, then ``--resume`` with max_steps 2N. A constant schedule after a warmup
    longer than N: the rate depends on the step alone (a cosine decay depends on
    max_steps, so a first run with another max_steps cannot match), and a scheduler
    that was not restored would restart the warmup."""
    settings = {"model.path": tiny_model_dir, "training.lr": 2e-3, "training.eval_every": N,
                "checkpoint.every": N, "training.scheduler": "constant", "training.warmup_steps": N + 2}
    reference = tmp_path / "reference"
    train("sft", reference, **settings, **{"training.max_steps": 2 * N})
    lrs = [r["lr"] for r in metrics(reference)]
    assert lrs[N] == pytest.approx(2e-3 * (N + 1) / (N + 2))  # still warming up at step N + 1

    out = tmp_path / "run"
    train("sft", out, **settings, **{"training.max_steps": N})
    train("sft", out, resume=True, **settings, **{"training.max_steps": 2 * N})
    assert_same_run(out, reference)


def test_resume_with_more_steps_follows_the_longer_schedule(settings, reference, tmp_path):
    """A cosine decay depends on max_steps: after ``--resume`` with a larger one, every
    step (the first one included) takes the rate of the longer schedule."""
    out = tmp_path / "run"
    train("sft", out, **settings, **{"training.max_steps": N})
    first = [r["lr"] for r in metrics(out)]
    train("sft", out, resume=True, **settings, **{"training.max_steps": 2 * N})
    lrs, want = [r["lr"] for r in metrics(out)], [r["lr"] for r in metrics(reference)]
    assert lrs[:N] == first and first[-1] < want[N - 1]  # the short run had decayed further
    assert lrs[N:] == pytest.approx(want[N:], rel=1e-12)


@pytest.fixture
def own_process_group():
    """The DeepSpeed engine starts torch.distributed in this process: end it (DeepSpeed's
    way, which also drops its cached groups) and restore the environment afterwards."""
    pytest.importorskip("deepspeed")
    import os

    import torch.distributed

    env, was_initialized = dict(os.environ), torch.distributed.is_initialized()
    yield
    if torch.distributed.is_initialized() and not was_initialized:
        import deepspeed.comm

        deepspeed.comm.destroy_process_group()
    os.environ.clear()
    os.environ.update(env)


def test_deepspeed_zero2_resume_is_exact(tiny_model_dir, tmp_path, own_process_group):
    settings = {"model.path": tiny_model_dir, "training.lr": 2e-3, "training.eval_every": N,
                "checkpoint.every": N, "training.backend": "deepspeed", "training.zero_stage": 2,
                "training.scheduler": "constant", "training.warmup_steps": N + 2}
    reference = tmp_path / "reference"
    train("sft", reference, **settings, **{"training.max_steps": 2 * N})
    out = tmp_path / "run"
    train("sft", out, **settings, **{"training.max_steps": N})
    assert (out / "checkpoints" / f"step_{N:08d}" / "engine").is_dir()
    train("sft", out, resume=True, **settings, **{"training.max_steps": 2 * N})
    assert_same_run(out, reference)
