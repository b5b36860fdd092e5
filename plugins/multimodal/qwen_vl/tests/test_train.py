"""Training on images end to end, as ``rlx train`` runs it: a brief SFT on the shapes task,
then GRPO raises the reward; REINFORCE++ and RLOO run unchanged; DPO learns image
preference pairs; a frozen vision tower stays as it was; what is not supported yet says
so before any model loads."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
import torch

from rlx.config import resolve, set_dotted
from rlx.errors import ConfigError, RunError
from rlx.plugins import get_host
from rlx.run import run
from rlx.testing import QUIET, one_thread  # noqa: F401

VLLM_WITHOUT_TORCHVISION = importlib.util.find_spec("vllm") and not importlib.util.find_spec("torchvision")
COMMON = {**QUIET, "data.chat_template": "none", "training.threads": 1, "training.scheduler": "constant"}


def train(algo: str, **settings):
    host = get_host()
    tree: dict = {}
    for key, value in {**COMMON, **settings}.items():
        set_dotted(tree, key, value)
    return run(resolve(host.algorithms.get(algo), tree), host)


def rewards(out) -> list[float]:
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [m["reward/mean"] for m in lines if "reward/mean" in m]


def online(model, shapes, out, algo="grpo", steps=40, **settings):
    train_rows, test_rows = shapes
    return train(algo, **{"model.path": str(model), "data.path": str(train_rows["prompts"]),
                          "data.eval_path": str(test_rows["prompts"]), "output": str(out), "training.max_steps": steps,
                          "training.batch_size": 32, "training.micro_batch_size": 32, "training.lr": 3e-4,
                          "rollout.max_new_tokens": 3, "algorithm.rollout_batch_size": 8, "algorithm.n_samples": 8,
                          "algorithm.eval_size": 32, **settings})


@pytest.fixture(scope="module")
def sft_policy(tiny_vl, shapes, tmp_path_factory):
    """The tiny VLM after 35 SFT steps: it names the colour greedily, but samples it about
    half the time."""
    out = tmp_path_factory.mktemp("sft")
    train("sft", **{"model.path": tiny_vl, "data.path": str(shapes[0]["sft"]), "output": str(out / "run"),
                    "training.max_steps": 35, "training.batch_size": 16, "training.micro_batch_size": 16,
                    "training.lr": 1e-3, "data.eval_size": 0})
    return out / "run" / "final"


def test_grpo_on_images_raises_the_reward_after_a_brief_sft(sft_policy, shapes, tmp_path):
    online(sft_policy, shapes, tmp_path / "grpo")
    seen = rewards(tmp_path / "grpo")
    first, last = sum(seen[:5]) / 5, sum(seen[-5:]) / 5
    print("GRPO reward/mean by step:", [round(r, 3) for r in seen])
    assert last > first + 0.15, seen
    # the saved policy loads with its image processor, as a Qwen2.5-VL
    final = tmp_path / "grpo" / "final"
    assert (final / "preprocessor_config.json").is_file()
    assert json.loads((final / "config.json").read_text())["model_type"] == "qwen2_5_vl"


@pytest.mark.parametrize("algo", ["reinforce_pp", "reinforce_pp_baseline", "rloo"])
def test_other_online_algorithms_run_on_images(algo, sft_policy, shapes, tmp_path):
    # with a KL term: the reference scores the images too
    metrics = online(sft_policy, shapes, tmp_path / algo, algo=algo, steps=2,
                     **{"checkpoint.save_final": False, "algorithm.kl_coef": 0.01})
    assert all(math.isfinite(v) for v in metrics.values() if isinstance(v, float))
    assert metrics["rollout/logp_diff_max"] < 1e-4 and metrics["grad_norm"] > 0
    assert metrics["kl"] != 0  # the second step's policy has moved from the reference


def test_dpo_learns_image_preference_pairs_and_a_frozen_tower_stays(tiny_vl, shapes, tmp_path):
    from safetensors.torch import load_file

    train_rows, test_rows = shapes
    metrics = train("dpo", **{"model.path": tiny_vl, "data.path": str(train_rows["pairs"]),
                              "data.eval_path": str(test_rows["pairs"]), "output": str(tmp_path / "dpo"),
                              "training.max_steps": 12, "training.batch_size": 16, "training.micro_batch_size": 16,
                              "training.lr": 1e-3, "model.freeze_vision": True, "data.eval_size": 32})
    losses = [json.loads(line)["loss"] for line in (tmp_path / "dpo" / "metrics.jsonl").read_text().splitlines()]
    assert losses[-1] < losses[0] - 0.1, losses  # from log 2 = 0.69
    print("DPO loss by step:", [round(x, 3) for x in losses], "eval accuracy", metrics["eval/accuracy"])
    assert metrics["eval/accuracy"] > 0.7  # held-out pairs: the right colour over a wrong one
    before = load_file(f"{tiny_vl}/model.safetensors")
    after = load_file(tmp_path / "dpo" / "final" / "model.safetensors")
    visual = [k for k in before if k.startswith("visual.")]
    assert visual and all(torch.equal(before[k], after[k]) for k in visual)
    assert not torch.equal(before["model.layers.0.mlp.up_proj.weight"], after["model.layers.0.mlp.up_proj.weight"])


@pytest.mark.parametrize("algo, settings, message", [
    ("ppo", {}, "ppo trains a critic"),
    ("grpo", {"training.packing": True}, "training.packing does not pack image inputs"),
    # vLLM's Qwen2.5-VL module imports transformers' torchvision image processor
    pytest.param("grpo", {"rollout.engine": "vllm"},
                 r"rollout.engine=vllm: vLLM \S+ cannot load Qwen2_5_VLForConditionalGeneration here: importing "
                 r"vllm.model_executor.models.qwen2_5_vl fails with .*torchvision.* \(import chain: .*"
                 r"transformers/models/qwen2_vl/image_processing_qwen2_vl.py\)",
                 marks=pytest.mark.skipif(not VLLM_WITHOUT_TORCHVISION, reason="needs vLLM without torchvision")),
    ("kto", {}, "kto .* takes no images yet"),
])
def test_what_images_cannot_do_yet_fails_before_a_model_loads(algo, settings, message, tiny_vl, shapes, tmp_path,
                                                              monkeypatch):
    from rlx import models

    monkeypatch.setattr(models, "load_causal_lm", lambda *a, **k: pytest.fail("a model loaded"))
    with pytest.raises((ConfigError, RunError), match=message):
        train(algo, **{"model.path": tiny_vl, "data.path": str(shapes[0]["prompts"]), "output": str(tmp_path / "x"),
                       **settings})


def test_a_frozen_vision_tower_does_not_train_and_is_not_sent_to_engines(tiny_vl):
    from rlx import models
    from rlx.config import ModelConfig

    model = models.load_causal_lm(ModelConfig(path=tiny_vl, freeze_vision=True), torch.device("cpu"))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and not any(n.startswith("model.visual.") for n in trainable)
    sent = models.engine_weights(model, model.state_dict())
    assert not any(".visual." in k for k in sent) and "model.language_model.layers.0.mlp.up_proj.weight" in sent


def test_a_vllm_engine_gets_the_checkpoint_names_of_the_in_memory_weights(tiny_vl):
    from rlx import models
    from rlx.config import ModelConfig
    from rlx.engines.vllm import _checkpoint_renames, _checkpoint_shapes

    model = models.load_causal_lm(ModelConfig(path=tiny_vl, freeze_vision=True), torch.device("cpu"))
    sent = _checkpoint_renames(tiny_vl)(models.engine_weights(model, model.state_dict()))
    saved = _checkpoint_shapes(tiny_vl)
    assert "model.layers.0.mlp.up_proj.weight" in sent and not any(k.startswith("visual.") for k in sent)
    assert set(sent) - set(saved) == {"lm_head.weight"}  # tied: vLLM's check lets it pass
    assert all(tuple(v.shape) == saved[k] for k, v in sent.items() if k in saved)


def test_a_multi_turn_environment_with_images_fails_before_a_model_loads(tiny_vl, shapes, tmp_path, monkeypatch):
    from rlx import models

    plugin = tmp_path / "echo_env.py"  # an environment of the run's own, registered by a local plugin
    plugin.write_text("from rlx import hookimpl\n\n\n@hookimpl\ndef register_environments(register):\n"
                      "    register('echo', lambda **options: None)\n")
    monkeypatch.setattr(models, "load_causal_lm", lambda *a, **k: pytest.fail("a model loaded"))
    host = get_host([str(plugin)])
    tree: dict = {}
    for key, value in {**COMMON, "model.path": tiny_vl, "data.path": str(shapes[0]["prompts"]),
                       "output": str(tmp_path / "x"), "environment.name": "echo", "plugins": [str(plugin)]}.items():
        set_dotted(tree, key, value)
    with pytest.raises((ConfigError, RunError), match="environment 'echo': multi-turn episodes take no images"):
        run(resolve(host.algorithms.get("grpo"), tree), host)
