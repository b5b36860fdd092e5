"""The core's processor for VLMs no plugin handles (transformers' ``AutoProcessor``), shown
on a tiny random LLaVA: its rows check, encode and train with GRPO, the rollout's
log-probs equal the update's, and prompts without an image mix with those with one."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlx import multimodal
from rlx.config import resolve, set_dotted
from rlx.plugins import get_host
from rlx.run import run
from rlx.testing import QUIET, one_thread  # noqa: F401


@pytest.fixture(scope="module")
def tiny_llava(tmp_path_factory):
    """A random LLaVA (a one-layer CLIP tower over 28x28 images, 5 image tokens with CLS,
    a one-layer Qwen2 text model) with its processor, saved as transformers would."""
    from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor, Qwen2Config
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    from rlx.tiny import make_tokenizer

    out = tmp_path_factory.mktemp("tiny-llava")
    tokenizer = make_tokenizer(out, extra_special=["<image>"])
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                       image_size=28, patch_size=14),
        text_config=Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                num_attention_heads=2, num_key_value_heads=1, eos_token_id=tokenizer.eos_token_id,
                                pad_token_id=tokenizer.pad_token_id),
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"), vision_feature_layer=-1,
        vision_feature_select_strategy="full")
    torch.manual_seed(0)
    LlavaForConditionalGeneration(config).save_pretrained(out)
    images = CLIPImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=14, vision_feature_select_strategy="full",
                   image_token="<image>", num_additional_image_tokens=1).save_pretrained(out)
    return str(out)


def test_collate_gives_samples_without_a_tensor_no_rows():
    with_image = multimodal.ModelInputs({"pixel_values": torch.ones(2, 3)})
    extra, rows = multimodal.collate([with_image, multimodal.ModelInputs({}), with_image])
    assert extra["pixel_values"].shape == (4, 3) and rows["pixel_values"].tolist() == [2, 0, 2]
    assert multimodal.present(multimodal.collate([multimodal.ModelInputs({"pixel_values": torch.ones(0, 3)})])[0]) == {}


def test_a_vlm_without_a_plugin_trains_through_auto_processor(tiny_llava, tmp_path):
    from PIL import Image

    colours = {"red": (220, 40, 40), "blue": (40, 80, 220)}
    rows = []
    for i in range(8):
        name = sorted(colours)[i % 2]
        Image.new("RGB", (40, 40), colours[name]).save(tmp_path / f"{i}.png")
        rows.append({"prompt": "<image>Colour?", "images": [f"{i}.png"], "label": name})
    rows.append({"prompt": "Colour of the sky?", "label": "blue"})  # no image at all
    (tmp_path / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")

    host = get_host()
    tree: dict = {}
    settings = {**QUIET, "model.path": tiny_llava, "data.path": str(tmp_path / "rows.jsonl"),
                "output": str(tmp_path / "run"), "data.chat_template": "none", "training.max_steps": 2,
                "training.batch_size": 16, "training.micro_batch_size": 8, "training.threads": 1,
                "rollout.max_new_tokens": 4, "algorithm.rollout_batch_size": 4, "algorithm.n_samples": 4,
                "data.eval_size": 0}
    for key, value in settings.items():
        set_dotted(tree, key, value)
    config = resolve(host.algorithms.get("grpo"), tree)
    assert isinstance(multimodal.processor_for(config, host), multimodal.AutoProcessorVLM)
    metrics = run(config, host)
    assert all(math.isfinite(v) for v in metrics.values() if isinstance(v, float))
    assert metrics["rollout/logp_diff_max"] < 1e-4  # the update's log-probs are the rollout's
    assert (tmp_path / "run" / "final" / "processor_config.json").is_file()  # the processor travels with the model
