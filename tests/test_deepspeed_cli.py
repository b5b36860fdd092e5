"""DeepSpeed ZeRO-3 through the CLI, one process (no launcher), on CPU."""

from __future__ import annotations

import pytest

from e2e import cli_args, metrics, one_thread, rlx, train  # noqa: F401 (one_thread: autouse)

pytest.importorskip("deepspeed")

STEPS = 2


def test_zero3_single_process_trains_and_saves_a_full_model(tiny_model_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    out = tmp_path / "zero3"
    settings = {"training.lr": 2e-3}
    result = rlx("train", "--algo", "sft", "--model", tiny_model_dir, "--max-steps", str(STEPS), "--output", str(out),
                 "--set", "training.backend=deepspeed", "--set", "training.zero_stage=3", *cli_args(**settings))
    assert result.returncode == 0, result.stderr[-3000:]
    rows = metrics(out)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(r["grad_norm"] is not None and r["grad_norm"] > 0 for r in rows)
    assert (out / "checkpoints" / f"step_{STEPS:08d}" / "engine").is_dir()

    final = AutoModelForCausalLM.from_pretrained(out / "final")
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    # gathered, not partitioned: every weight has its full shape
    for name, param in base.named_parameters():
        assert final.get_parameter(name).shape == param.shape, name

    # the same run on the plain backend ends at the same weights (float32, same seed and data)
    plain = tmp_path / "plain"
    train("sft", plain, **{"model.path": tiny_model_dir, "training.max_steps": STEPS, **settings})
    assert [r["loss"] for r in rows] == pytest.approx([r["loss"] for r in metrics(plain)], rel=1e-5)
    reference = AutoModelForCausalLM.from_pretrained(plain / "final")
    moved = 0
    for name, param in reference.named_parameters():
        torch.testing.assert_close(final.get_parameter(name), param, atol=1e-5, rtol=1e-4, msg=name)
        moved += not torch.equal(param, base.get_parameter(name))
    assert moved > 0
    with torch.no_grad():
        assert torch.isfinite(final(input_ids=torch.tensor([[1, 2, 3]])).logits).all()
