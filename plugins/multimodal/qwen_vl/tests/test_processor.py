"""The Qwen-VL processor: what it makes of a row equals transformers' own image processor,
tokenizer and M-RoPE index; images come from paths, bytes or base64; bad rows are named."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from rlx import data, models
from rlx.config import resolve
from rlx.plugins import get_host
from rlx.testing import one_thread  # noqa: F401

QUESTION = "<image>What colour is the square?"


def vision_of(model_path: str, folder: Path, **keys):
    from rlx import multimodal

    host = get_host()
    config = resolve(host.algorithms.get("grpo"), {"model": {"path": model_path},
                                                    "data": {"path": str(folder), "chat_template": "none", **keys}})
    return multimodal.vision_data(config, host, models.load_tokenizer(model_path)).reading(str(folder))


def png(colour=(200, 30, 30), size=(56, 56)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, format="PNG")
    return out.getvalue()


def test_a_prompt_encodes_as_transformers_image_processor_tokenizer_and_rope_index_do(tiny_vl, tmp_path):
    from transformers import AutoModelForImageTextToText
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    (tmp_path / "a.png").write_bytes(png(size=(112, 84)))
    second = png((20, 200, 40))
    vision = vision_of(tiny_vl, tmp_path, chat_template="auto")
    # two images: one from the column (a path beside the data), one carried by its chat item (base64)
    row = {"prompt": [{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": "Which is red?"},
        {"type": "image", "image": base64.b64encode(second).decode()}]}], "images": "a.png"}
    encoded = vision.encode_prompt(row)

    pil = [Image.open(tmp_path / "a.png").convert("RGB"), Image.open(io.BytesIO(second)).convert("RGB")]
    hf = Qwen2VLImageProcessorPil.from_pretrained(tiny_vl)(images=pil, return_tensors="pt")
    inputs = encoded["inputs"]
    assert torch.equal(inputs.tensors["pixel_values"], hf["pixel_values"])
    assert torch.equal(inputs.tensors["image_grid_thw"], hf["image_grid_thw"])
    assert hf["image_grid_thw"].tolist() == [[1, 6, 8], [1, 4, 4]]  # 12 and 4 image tokens
    tokenizer = models.load_tokenizer(tiny_vl)
    n = (hf["image_grid_thw"].prod(-1) // 4).tolist()
    vision_text = [f"<|vision_start|>{'<|image_pad|>' * k}<|vision_end|>" for k in n]
    content = f"{vision_text[0]}Which is red?{vision_text[1]}"
    text = tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                         add_generation_prompt=True)
    assert encoded["prompt_ids"] == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert encoded["prompt_text"].count("<|image_pad|>") == 2  # readable: one pad per image
    # what vLLM takes and expands itself: the same text with one pad per image
    assert inputs.placeholder_ids == tokenizer(encoded["prompt_text"], add_special_tokens=False)["input_ids"]
    assert inputs.placeholder_ids.count(tokenizer.convert_tokens_to_ids("<|image_pad|>")) == 2

    model = AutoModelForImageTextToText.from_pretrained(tiny_vl)
    ids = torch.tensor([encoded["prompt_ids"]])
    positions, _ = model.model.get_rope_index(ids, (ids == model.config.image_token_id).int(), hf["image_grid_thw"])
    assert torch.equal(inputs.positions, positions[:, 0])


def test_images_from_paths_bytes_base64_and_records_are_the_same_pixels(tiny_vl, tmp_path):
    raw = png()
    (tmp_path / "red.png").write_bytes(raw)
    vision = vision_of(tiny_vl, tmp_path)
    b64 = base64.b64encode(raw).decode()
    sources = ["red.png", str(tmp_path / "red.png"), raw, b64, base64.encodebytes(raw).decode(),
               f"data:image/png;base64,{b64}", {"bytes": raw}, {"path": "red.png"}]
    pixels = [vision.encode_prompt({"prompt": QUESTION, "images": [s]})["inputs"].tensors["pixel_values"]
              for s in sources]
    assert all(torch.equal(p, pixels[0]) for p in pixels)

    # a prompt holds its image's file, not its patches; it travels (to a Ray worker) as that
    import pickle

    inputs = vision.encode_prompt({"prompt": QUESTION, "images": ["red.png"]})["inputs"]
    assert inputs.files == [raw] and not any(isinstance(v, torch.Tensor) for v in (inputs.prompt, *inputs.files))
    assert torch.equal(pickle.loads(pickle.dumps(inputs)).tensors["pixel_values"], pixels[0])


def test_pixel_bounds_set_the_number_of_image_tokens(tiny_vl, tmp_path):
    (tmp_path / "big.png").write_bytes(png(size=(112, 112)))
    row = {"prompt": QUESTION, "images": ["big.png"]}
    tokens = [vision_of(tiny_vl, tmp_path, **keys).encode_prompt(row)["prompt_ids"].count(
        models.load_tokenizer(tiny_vl).convert_tokens_to_ids("<|image_pad|>")) for keys in
        ({}, {"max_pixels": 56 * 56}, {"min_pixels": 140 * 140, "max_pixels": 140 * 140})]
    assert tokens == [16, 4, 25]


def test_bad_images_and_counts_name_the_line_and_the_file(tiny_vl, tmp_path, each_bad_row_fails):
    raw = png()
    (tmp_path / "ok.png").write_bytes(raw)
    (tmp_path / "notes.png").write_text("not a picture")
    (tmp_path / "cut.png").write_bytes(raw[:len(raw) // 2])
    rows = [
        {"prompt": QUESTION, "images": ["ok.png"]},
        {"prompt": QUESTION, "images": ["missing.png"]},
        {"prompt": QUESTION, "images": ["notes.png"]},
        {"prompt": QUESTION, "images": ["cut.png"]},
        {"prompt": QUESTION, "image": ["ok.png"]},
        {"prompt": "<image><image>Same colour?", "images": ["ok.png"]},
        {"prompt": QUESTION, "images": ["ok.png", "ok.png"]},
        {"prompt": QUESTION, "images": [12]},
        {"prompt": QUESTION, "images": ["http://127.0.0.1:9/red.png"]},  # no qwen-vl-utils here, or no server
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    vision = vision_of(tiny_vl, tmp_path)
    source = data.load_rows(str(path), vision.cfg, split="train", task_format="prompts", tasks={})
    schema = vision.schema(data.required_keys(vision.cfg, "prompts"))
    expected = [
        r"line 2: image 1 of 1: image file 'missing.png' does not exist \(looked for .*missing.png",
        r"line 3: image 1 of 1: image '.*notes.png' is not an image file",
        r"line 4: image 1 of 1: image '.*cut.png' is damaged or truncated",
        r"line 5: the prompt has 1 image placeholder .* but there is no key 'images' \(columns: prompt, image\)",
        r"line 6: the prompt has 2 image placeholders .* but key 'images' holds 1 image;",
        r"line 7: the prompt has 1 image placeholder .* but key 'images' holds 2 images;",
        r"line 8: image 1 of 1: an image should be a path, bytes or base64 text, got int",
        r"line 9: image 1 of 1: image 'http://127.0.0.1:9/red.png' could not be fetched",
    ]
    _, _, errors = each_bad_row_fails(source, schema, path, expected)
    assert len(errors) == 5


def test_a_bad_image_stops_a_run_before_any_model_loads(tiny_vl, tmp_path, monkeypatch):
    from rlx import models as loaders
    from rlx.run import run

    (tmp_path / "rows.jsonl").write_text(json.dumps({"prompt": QUESTION, "images": ["gone.png"], "label": "red"}))
    monkeypatch.setattr(loaders, "load_causal_lm", lambda *a, **k: pytest.fail("a model loaded"))
    host = get_host()
    config = resolve(host.algorithms.get("grpo"), {
        "model": {"path": tiny_vl}, "data": {"path": str(tmp_path / "rows.jsonl")}, "output": str(tmp_path / "run"),
        "logging": {"progress": False, "tensorboard": False}})
    with pytest.raises(Exception, match=r"rows.jsonl line 1: image 1 of 1: image file 'gone.png' does not exist"):
        run(config, host)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_rlx_qwen_vl_shapes_writes_the_task(tmp_path):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "rlx_cli", "qwen-vl", "shapes", str(tmp_path / "s"), "--rows", "3"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in (tmp_path / "s" / "pairs.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all((tmp_path / "s" / r["images"][0]).is_file() and r["chosen"] != r["rejected"]
                                  for r in rows)
    assert f"prompts: {tmp_path / 's' / 'prompts.jsonl'}" in result.stdout
