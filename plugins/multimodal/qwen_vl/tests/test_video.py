"""Videos in rows: the torchvision-free video tensors lay out each frame as transformers'
PIL image processor does, M-RoPE positions of image + video prompts equal transformers'
``get_rope_index``, bad rows name the line, the video and the frame, a batch regroups
video patches per sample, and ``rlx train --algo grpo`` runs on the shapes task's videos."""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys

import pytest
import torch
from PIL import Image

from rlx import data, models, multimodal
from rlx.config import resolve
from rlx.plugins import get_host
from rlx.testing import one_thread  # noqa: F401
from rlx_qwen_vl.shapes import moving_square
from rlx_qwen_vl.video import VideoSettings, process_videos

VIDEO_QUESTION = "<video>Which way does the square move?"


def vision_of(model_path: str, folder, **keys):
    host = get_host()
    config = resolve(host.algorithms.get("grpo"), {"model": {"path": model_path},
                                                    "data": {"path": str(folder), "chat_template": "none", **keys}})
    return multimodal.vision_data(config, host, models.load_tokenizer(model_path)).reading(str(folder))


def png(size=(56, 56)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(out, format="PNG")
    return out.getvalue()


def frames(direction="right", count=4, size=56, seed=0) -> list:
    return moving_square(direction, "red", random.Random(seed), count, size)


def save(frames_, folder, stem) -> list[str]:
    names = []
    for k, frame in enumerate(frames_):
        names.append(f"{stem}_{k}.png")
        frame.save(folder / names[-1])
    return names


def test_video_patches_hold_each_frame_as_the_pil_image_processor_lays_out_an_image(tiny_vl):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    images = Qwen2VLImageProcessorPil.from_pretrained(tiny_vl)
    settings = VideoSettings.of_folder(tiny_vl)
    assert (settings.min_pixels, settings.max_pixels) == (56 * 56, 112 * 112)
    # 5 frames of 110x80: smart-resized to 112x84 (within the bounds), padded to 6 frames
    video = [f.crop((0, 0, 110, 80)) for f in frames("down", 5, size=112)]
    out = process_videos([video], settings, images)
    assert out["video_grid_thw"].tolist() == [[3, 6, 8]]
    assert out["pixel_values_videos"].shape == (3 * 6 * 8, 3 * 2 * 14 * 14)
    # each frame's patches, as the image processor makes them of that frame alone (it
    # repeats an image over the 2 time slots of a patch)
    per_frame = [images(images=[f], return_tensors="pt")["pixel_values"].reshape(48, 3, 2, 14, 14)[:, :, 0]
                 for f in video + video[-1:]]
    patches = out["pixel_values_videos"].reshape(3, 48, 3, 2, 14, 14)
    for k, expected in enumerate(per_frame):
        assert torch.equal(patches[k // 2, :, :, k % 2], expected), k

    # frames of other sizes take the first frame's size; the video bounds set the tokens
    mixed = [video[0], video[1].resize((40, 30))]
    assert process_videos([mixed], settings, images)["video_grid_thw"].tolist() == [[1, 6, 8]]
    small = VideoSettings.of_folder(tiny_vl, max_pixels=56 * 56)
    assert process_videos([video], small, images)["video_grid_thw"].tolist() == [[3, 2, 4]]  # 56x112 pixels


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen2_vl"])
def test_image_and_video_prompts_encode_with_transformers_rope_index(arch, request, tmp_path):
    from transformers import AutoModelForImageTextToText

    model_path = request.getfixturevalue({"qwen2_5_vl": "tiny_vl", "qwen2_vl": "tiny_qwen2_vl"}[arch])
    (tmp_path / "a.png").write_bytes(png(size=(112, 84)))
    left = save(frames("left", 3), tmp_path, "left")
    # a video of 8 frames at 1 fps: 4 time steps 2 s apart, which run past the text after it
    row = {"prompt": [{"role": "user", "content": [
        {"type": "video"}, {"type": "text", "text": "then"}, {"type": "image"},
        {"type": "video", "video": save(frames("up", 8), tmp_path, "up")}, {"type": "text", "text": "Which moved?"}]}],
        "images": ["a.png"], "videos": [left]}
    vision = vision_of(model_path, tmp_path, chat_template="auto", video_fps=1.0)
    encoded = vision.encode_prompt(row)
    inputs = encoded["inputs"]
    tensors = inputs.tensors
    assert tensors["video_grid_thw"].tolist() == [[2, 4, 4], [4, 4, 4]]
    tokenizer = models.load_tokenizer(model_path)
    ids = torch.tensor([encoded["prompt_ids"]])
    video_id, image_id = (tokenizer.convert_tokens_to_ids(t) for t in ("<|video_pad|>", "<|image_pad|>"))
    assert (ids == video_id).sum() == (2 * 4 * 4 + 4 * 4 * 4) // 4 and (ids == image_id).sum() == 12
    assert encoded["prompt_text"].count("<|video_pad|>") == 2  # readable: one pad per video
    if arch == "qwen2_5_vl":
        assert tensors["second_per_grid_ts"].tolist() == [2.0, 2.0]
    else:
        assert "second_per_grid_ts" not in tensors  # Qwen2-VL's forward takes none

    model = AutoModelForImageTextToText.from_pretrained(model_path)
    kinds = (ids == image_id).int() + 2 * (ids == video_id).int()
    positions, _ = model.model.get_rope_index(ids, kinds, tensors["image_grid_thw"], tensors["video_grid_thw"],
                                              second_per_grid_ts=tensors.get("second_per_grid_ts"))
    assert torch.equal(inputs.positions, positions[:, 0])
    # the second video's 4 time steps of 4 tokens: 4 positions apart on Qwen2.5-VL
    # (tokens_per_second 2 x 2 s), 1 on Qwen2-VL
    start = encoded["prompt_ids"].index(video_id, encoded["prompt_ids"].index(image_id))
    step = 4 if arch == "qwen2_5_vl" else 1
    assert inputs.positions[0, start:start + 16:4].diff().tolist() == [step] * 3


def test_bad_videos_and_counts_name_the_line_the_video_and_the_frame(tiny_vl, tmp_path, each_bad_row_fails):
    ok = save(frames(), tmp_path, "ok")
    (tmp_path / "notes.png").write_text("not a picture")
    (tmp_path / "clip.mp4").write_bytes(b"\x00" * 64)
    rows = [
        {"prompt": VIDEO_QUESTION, "videos": [ok]},
        {"prompt": VIDEO_QUESTION, "videos": [[ok[0], "gone.png", ok[2]]]},
        {"prompt": "<video> or <video>?", "videos": [ok, [ok[0], "notes.png"]]},
        {"prompt": "<video><video>Same way?", "videos": [ok]},
        {"prompt": VIDEO_QUESTION, "videos": ok},
        {"prompt": VIDEO_QUESTION, "video": [ok]},
        {"prompt": VIDEO_QUESTION, "videos": [[]]},
        {"prompt": VIDEO_QUESTION, "videos": "missing.mp4"},
        {"prompt": VIDEO_QUESTION, "videos": "clip.mp4"},  # no qwen-vl-utils here, or not a video it decodes
        {"prompt": [{"role": "user", "content": [{"type": "video", "video": [ok[0], 7]}]}]},
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    vision = vision_of(tiny_vl, tmp_path)
    source = data.load_rows(str(path), vision.cfg, split="train", task_format="prompts", tasks={})
    schema = vision.schema(data.required_keys(vision.cfg, "prompts"))
    expected = [
        r"line 2: video 1 of 1: frame 2 of 3: image file 'gone.png' does not exist \(looked for .*gone.png",
        r"line 3: video 2 of 2: frame 2 of 2: image '.*notes.png' is not an image file",
        r"line 4: the prompt has 2 video placeholders \(<video> or video items\) but key 'videos' holds 1 video;",
        r"line 5: the prompt has 1 video placeholder .* but key 'videos' holds 4 videos; give one video per "
        r"placeholder \(a video given as frames is a list inside the list",
        r"line 6: the prompt has 1 video placeholder .* but there is no key 'videos' \(columns: prompt, video\)",
        r"line 7: video 1 of 1: the video has no frames",
        r"line 8: video 1 of 1: video file 'missing.mp4' does not exist \(looked for .*missing.mp4",
        r"line 9: video 1 of 1: video file '.*clip.mp4' could not be read: ",
        r"line 10: video 1 of 1: frame 2 of 2: an image should be a path, bytes or base64 text, got int",
    ]
    each_bad_row_fails(source, schema, path, expected)


def test_video_files_without_qwen_vl_utils_say_what_to_install(tiny_vl, tmp_path):
    try:
        import qwen_vl_utils  # noqa: F401
        pytest.skip("qwen-vl-utils imports here")
    except Exception:
        pass
    (tmp_path / "clip.mp4").write_bytes(b"\x00" * 64)
    vision = vision_of(tiny_vl, tmp_path)
    with pytest.raises(ValueError, match=r"video 1 of 1: video file '.*clip.mp4' could not be read: ValueError: "
                                         r"video files need qwen-vl-utils \(pip install 'rlx-qwen-vl\[utils\]'\)"):
        vision.encode_prompt({"prompt": VIDEO_QUESTION, "videos": "clip.mp4"})


def test_a_batch_regroups_video_patches_per_sample(tiny_vl, tmp_path):
    from rlx.online import batch_of_completions
    from rlx.rollout import Completion

    (tmp_path / "a.png").write_bytes(png())
    vision = vision_of(tiny_vl, tmp_path)
    rows = [{"prompt": VIDEO_QUESTION, "videos": [save(frames("up", 4), tmp_path, "a")]},
            {"prompt": "<image>" + VIDEO_QUESTION, "images": ["a.png"],
             "videos": [save(frames("left", 6, size=84), tmp_path, "b")]},
            {"prompt": "What colour is grass?"},
            {"prompt": "<video> <video>", "videos": [save(frames("down", 2), tmp_path, "c"),
                                                     save(frames("right", 3), tmp_path, "d")]}]
    prompts = [vision.encode_prompt(r) for r in rows]
    completions = [Completion(i, [5, 6], [-1.0, -1.0], "", "length") for i in range(len(rows))]
    batch = batch_of_completions([p["prompt_ids"] for p in prompts], completions, 0, [0.0] * 4, list(range(4)), "cpu",
                                 [p["inputs"] for p in prompts])
    assert batch.extra_rows["video_grid_thw"].tolist() == [1, 1, 0, 2]
    assert batch.extra_rows["second_per_grid_ts"].tolist() == [1, 1, 0, 2]
    assert batch.extra_rows["pixel_values_videos"].tolist() == [32, 3 * 36, 0, 16 + 32]

    def owned(b, i):
        return {k: b.select([i]).extra[k] for k in ("pixel_values_videos", "video_grid_thw", "pixel_values")}

    for i, prompt in enumerate(prompts):
        mine = prompt["inputs"].tensors
        for key, value in owned(batch, i).items():
            assert torch.equal(value, mine.get(key, value[:0])), (i, key)
    shuffled = batch.select([3, 0, 2, 1])
    whole = type(batch).concat(shuffled.split(3))
    for new, old in enumerate([3, 0, 2, 1]):
        assert all(torch.equal(a, b) for a, b in zip(owned(whole, new).values(), owned(batch, old).values()))


def test_rlx_train_grpo_runs_on_the_shapes_videos(tiny_vl, tmp_path):
    def cli(*args):
        result = subprocess.run([sys.executable, "-m", "rlx_cli", *map(str, args)], capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
        return result

    cli("qwen-vl", "shapes", tmp_path / "moves", "--rows", "8", "--video")
    row = json.loads((tmp_path / "moves" / "prompts.jsonl").read_text().splitlines()[0])
    assert row["prompt"] == VIDEO_QUESTION and len(row["videos"][0]) == 4
    assert row["label"] in ("left", "right", "up", "down")
    # partial credit, so that the random model's samples differ in reward and the update has a gradient
    (tmp_path / "rewards.py").write_text(
        "def letters(prompts, completions, labels, **columns):\n"
        "    assert all(p.count('<|video_pad|>') == 1 for p in prompts), prompts  # one pad per video\n"
        "    return [len(set(c) & set(label)) / len(label) for c, label in zip(completions, labels)]\n")
    cli("train", "--algo", "grpo", "--model", tiny_vl, "--data", tmp_path / "moves" / "prompts.jsonl",
        "-o", tmp_path / "run", "--max-steps", 2, "-s", "data.chat_template=none", "-s", "data.eval_size=0",
        "-s", "training.batch_size=8", "-s", "training.micro_batch_size=8", "-s", "algorithm.rollout_batch_size=4",
        "-s", "algorithm.n_samples=2", "-s", "rollout.max_new_tokens=3", "-s", "training.threads=1",
        "-s", "algorithm.kl_coef=0.01", "-s", "checkpoint.save_final=false", "-s", "logging.progress=false",
        "-s", "logging.tensorboard=false", "-s", f"reward.functions=[{tmp_path / 'rewards.py'}:letters]")
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in steps if "rollout/logp_diff_max" in m]
    assert len(steps) == 2
    assert all(m["rollout/logp_diff_max"] < 1e-4 and m["grad_norm"] > 0 for m in steps)


def test_videos_with_vllm_fail_before_a_model_loads(tiny_vl, tmp_path, monkeypatch):
    from rlx.config import set_dotted
    from rlx.engines import vllm
    from rlx.errors import RunError
    from rlx.run import run
    from rlx_qwen_vl.shapes import write_video_dataset

    files = write_video_dataset(tmp_path / "moves", 2)
    monkeypatch.setattr(vllm, "why_not_vision", lambda path: None)  # as where vLLM loads Qwen-VL
    monkeypatch.setattr(models, "load_causal_lm", lambda *a, **k: pytest.fail("a model loaded"))
    tree: dict = {}
    for key, value in {"model.path": tiny_vl, "data.path": str(files["prompts"]), "output": str(tmp_path / "x"),
                       "rollout.engine": "vllm", "data.chat_template": "none", "logging.progress": False}.items():
        set_dotted(tree, key, value)
    host = get_host()
    with pytest.raises(RunError, match="rollout.engine=vllm takes prompts with images but not with videos yet"):
        run(resolve(host.algorithms.get("grpo"), tree), host)
