"""What a run leaves in its output folder, and how it refuses to overwrite one."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import yaml

from e2e import config, metrics, one_thread, rlx, snapshot, train  # noqa: F401 (one_thread: autouse)

STEPS = 4


@pytest.fixture(scope="module")
def finished(tiny_model_dir, tmp_path_factory):
    """A short SFT run with TensorBoard on and a checkpoint every step (two kept)."""
    out = tmp_path_factory.mktemp("outputs") / "run"
    settings = {"model.path": tiny_model_dir, "training.max_steps": STEPS, "logging.tensorboard": True,
                "checkpoint.every": 1, "checkpoint.keep": 2}
    train("sft", out, **settings)
    return out, settings


def test_config_yaml_is_the_resolved_config(finished):
    from rlx.config import to_dict

    out, settings = finished
    written = yaml.safe_load((out / "config.yaml").read_text())
    resolved, _ = config("sft", output=str(out), **settings)
    assert written == to_dict(resolved)
    assert written["training"]["max_steps"] == STEPS and written["training"]["lr"] == 5e-4  # sft's default


def test_metrics_jsonl_has_one_row_per_step(finished):
    out, _ = finished
    lines = (out / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert len(lines) == STEPS and all(isinstance(r, dict) for r in rows)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for row in rows:
        for key in ("loss", "lr", "grad_norm", "tokens_per_s"):
            assert isinstance(row[key], float) and math.isfinite(row[key]), (key, row)
        assert row["loss"] > 0 and row["grad_norm"] > 0 and row["tokens_per_s"] > 0
    lrs = [r["lr"] for r in rows]
    assert lrs[0] == pytest.approx(5e-4) and lrs[-1] < lrs[0]  # the cosine schedule decays
    assert "eval/loss" in rows[-1]


def test_tensorboard_events_hold_the_same_scalars(finished):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, _ = finished
    events = list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert events
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    assert {"loss", "lr", "grad_norm", "tokens_per_s", "eval/loss"} <= set(acc.Tags()["scalars"])
    logged = [(e.step, e.value) for e in acc.Scalars("loss")]
    assert [s for s, _ in logged] == list(range(1, STEPS + 1))
    assert [v for _, v in logged] == pytest.approx([r["loss"] for r in metrics(out)], rel=1e-6)


def test_checkpoints_are_complete_and_pruned(finished):
    import torch

    from rlx.checkpoint import COMPLETE, latest_checkpoint

    out, _ = finished
    root = out / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == [f"step_{STEPS - 1:08d}", f"step_{STEPS:08d}"]
    for step in (STEPS - 1, STEPS):
        path = root / f"step_{step:08d}"
        assert (path / COMPLETE).read_text().strip() == str(step)
        assert json.loads((path / "trainer_state.json").read_text()) == {"step": step}
        assert (path / "engine" / "engine.pt").is_file() and (path / "rng" / "rank_0.pt").is_file()
    assert latest_checkpoint(root) == root / f"step_{STEPS:08d}"

    # the final model is the weights of the last checkpoint
    from transformers import AutoModelForCausalLM

    final = AutoModelForCausalLM.from_pretrained(out / "final")
    saved = torch.load(root / f"step_{STEPS:08d}" / "engine" / "engine.pt", weights_only=True)["params"]
    for name, param in final.named_parameters():
        assert torch.equal(param, saved[name]), name


def test_final_holds_a_loadable_tokenizer(finished, tiny_model_dir):
    from transformers import AutoTokenizer

    out, _ = finished
    final = out / "final"
    assert (final / "tokenizer.json").is_file() and (final / "tokenizer_config.json").is_file()
    ours, original = AutoTokenizer.from_pretrained(final), AutoTokenizer.from_pretrained(tiny_model_dir)
    text = "<|im_start|>user\n23+45=<|im_end|>\n"
    assert ours(text)["input_ids"] == original(text)["input_ids"]
    assert ours.eos_token == original.eos_token and ours.pad_token_id == original.pad_token_id
    assert ours.apply_chat_template([{"role": "user", "content": "1+1="}], tokenize=False) == \
        original.apply_chat_template([{"role": "user", "content": "1+1="}], tokenize=False)


def test_second_run_into_the_same_output_fails_and_touches_nothing(finished, tiny_model_dir):
    out, _ = finished
    before = snapshot(out)
    result = rlx("train", "--algo", "sft", "--model", tiny_model_dir, "--output", str(out), "--max-steps", "1",
                 "--set", "logging.progress=false")
    assert result.returncode != 0
    assert "already holds a run" in result.stderr and "--resume" in result.stderr, result.stderr
    assert str(out) in result.stderr
    assert "Traceback" not in result.stderr
    assert snapshot(out) == before


def test_resume_without_a_run_fails_clearly(tmp_path, tiny_model_dir):
    out = tmp_path / "nothing-here"
    result = rlx("train", "--algo", "sft", "--model", tiny_model_dir, "--output", str(out), "--resume")
    assert result.returncode != 0
    assert "--resume" in result.stderr and "no run to continue" in result.stderr and str(out) in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()


def test_resume_without_a_complete_checkpoint_fails_clearly(finished, tmp_path, tiny_model_dir):
    from rlx.run import RunError

    # a run killed before its first checkpoint finished: config and metrics, and only
    # a half-written checkpoint folder
    out = tmp_path / "killed"
    out.mkdir()
    shutil.copy(finished[0] / "config.yaml", out / "config.yaml")
    (out / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n')
    (out / "checkpoints" / "step_00000001").mkdir(parents=True)
    with pytest.raises(RunError, match="--resume: no complete checkpoint under .*checkpoints"):
        train("sft", out, resume=True, **{"model.path": tiny_model_dir, "training.max_steps": 2})
    assert not (out / "final").exists()
