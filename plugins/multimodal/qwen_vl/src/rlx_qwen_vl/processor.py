"""The Qwen2-VL / Qwen2.5-VL processor: prompts with images and videos to token ids,
vision tensors and M-RoPE positions.

It needs only the model folder's tokenizer and transformers' PIL image processor:
``AutoProcessor`` would also build the video processor, which needs torchvision (videos
go through ``rlx_qwen_vl.video`` instead). Each ``<image>`` placeholder becomes
``<|vision_start|><|image_pad|><|vision_end|>`` before the chat template runs, each
``<video>`` the same with ``<|video_pad|>``; after it, each pad token is repeated once per
merged patch (grid t·h·w / merge²). Positions follow the model's M-RoPE as transformers'
``get_rope_index`` computes them: text advances all three axes together; a vision
input's tokens take (t, h, w) grid positions from where the text stands, a video's time
axis stepping ``tokens_per_second · second_per_grid_ts`` per grid step on Qwen2.5-VL
(1 on Qwen2-VL), and the text after it goes on from there plus the larger of its merged
height and width.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rlx.data import render_prompt, resolve_template
from rlx.errors import ModelError
from rlx.models import load_tokenizer
from rlx.multimodal import PLACEHOLDER, VIDEO_PLACEHOLDER, ModelInputs, Video, VisionPrompt
from rlx_qwen_vl.video import VideoSettings, process_videos


class QwenVLProcessor:
    """``encode(prompt, images, videos)`` for a Qwen2-VL / Qwen2.5-VL model folder.

    ``data.min_pixels`` / ``data.max_pixels`` (when set) bound each image's size after
    resizing, which sets its number of tokens; otherwise the folder's
    ``preprocessor_config.json`` does. ``data.video_min_pixels`` / ``data.video_max_pixels``
    bound each video frame's the same way, else the folder's video processor settings.
    """

    takes_videos = True

    def __init__(self, path: str, *, config):
        from transformers import AutoConfig
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        self.cfg = config.data
        self.tokenizer = load_tokenizer(path)
        model = AutoConfig.from_pretrained(path)
        bounds = {k: v for k, v in (("min_pixels", self.cfg.min_pixels), ("max_pixels", self.cfg.max_pixels)) if v}
        if (Path(path) / "preprocessor_config.json").is_file():
            self.images = Qwen2VLImageProcessorPil.from_pretrained(path, **bounds)
        else:
            self.images = Qwen2VLImageProcessorPil(**bounds)
        self.merge = model.vision_config.spatial_merge_size
        self.video = VideoSettings.of_folder(path, min_pixels=self.cfg.video_min_pixels,
                                             max_pixels=self.cfg.video_max_pixels)
        for name, merge in (("image", self.images.merge_size), ("video", self.video.merge_size)):
            if merge != self.merge:
                raise ModelError(f"{path}: the {name} processor merges {merge}x{merge} patches, "
                                 f"the model {self.merge}x{self.merge}")
        # Qwen2.5-VL spaces a video's time steps by its seconds; Qwen2-VL by one position
        self.tokens_per_second = getattr(model.vision_config, "tokens_per_second", None)
        self.image_id, self.video_id = model.image_token_id, model.video_token_id
        ids = [model.vision_start_token_id, model.image_token_id, model.video_token_id, model.vision_end_token_id]
        tokens = self.tokenizer.convert_ids_to_tokens(ids)
        if None in tokens or self.tokenizer.convert_tokens_to_ids(tokens) != ids:
            raise ModelError(f"{path}: the tokenizer has no tokens for the model's vision ids")
        self.start, self.pad, self.video_pad, self.end = tokens

    def encode(self, prompt: str | list[dict], images: list, videos: list[Video] = ()) -> VisionPrompt:
        marks = {PLACEHOLDER: self.start + self.pad + self.end, VIDEO_PLACEHOLDER: self.start + self.video_pad + self.end}

        def placed(text: str) -> str:
            for mark, vision in marks.items():
                text = text.replace(mark, vision)
            return text

        prompt = placed(prompt) if isinstance(prompt, str) else [{**m, "content": placed(m["content"])} for m in prompt]
        text = render_prompt(prompt, self.tokenizer, self.cfg.chat_template)
        for pad, given, kind in ((self.pad, images, "images"), (self.video_pad, videos, "videos")):
            if text.count(pad) != len(given):
                raise ValueError(f"the rendered prompt holds {text.count(pad)} {pad} tokens for {len(given)} "
                                 f"{kind} (the prompt or chat template writes vision tokens of its own)")
        tensors = dict(self.images(images=images, return_tensors="pt")) if images else {}
        if videos:
            tensors.update(process_videos([v.frames for v in videos], self.video, self.images))
            if self.tokens_per_second is not None:
                tensors["second_per_grid_ts"] = torch.tensor([self.video.temporal_patch_size / v.fps for v in videos])
        image_grids = tensors.get("image_grid_thw", torch.zeros(0, 3, dtype=torch.long))
        video_grids = tensors.get("video_grid_thw", torch.zeros(0, 3, dtype=torch.long))
        expanded = text
        for pad, grids in ((self.pad, image_grids), (self.video_pad, video_grids)):
            parts = expanded.split(pad)
            counts = (grids.prod(-1) // self.merge ** 2).tolist()
            expanded = parts[0] + "".join(pad * n + part for n, part in zip(counts, parts[1:]))
        templated = resolve_template(self.tokenizer, self.cfg.chat_template) is not None
        ids = self.tokenizer(expanded, add_special_tokens=not templated)["input_ids"]
        for token, grids, kind in ((self.image_id, image_grids, "image"), (self.video_id, video_grids, "video")):
            need = int(grids.prod(-1).sum()) // self.merge ** 2
            if ids.count(token) != need:
                raise ValueError(f"the prompt's text tokenizes to {ids.count(token)} {kind} tokens where its "
                                 f"{kind}s need {need}")
        steps = [1.0] * len(videos)
        if "second_per_grid_ts" in tensors:
            steps = self.tokens_per_second * tensors["second_per_grid_ts"]
        vision = {self.image_id: [(g, 1) for g in image_grids.tolist()],
                  self.video_id: list(zip(video_grids.tolist(), steps))}
        positions = mrope_positions(ids, vision, self.merge)
        placeholder_ids = self.tokenizer(text, add_special_tokens=not templated)["input_ids"]
        return VisionPrompt(text, ids, ModelInputs(tensors, positions), placeholder_ids)

    def fetch_image(self, url: str):
        """An image from a URL, through qwen-vl-utils (``pip install rlx-qwen-vl[utils]``)."""
        try:
            from qwen_vl_utils import fetch_image
        except Exception as e:  # it imports torchvision, which may be missing or not match torch
            raise ValueError(f"images from URLs need qwen-vl-utils (pip install 'rlx-qwen-vl[utils]'), which "
                             f"failed to import: {type(e).__name__}: {e}") from e
        return fetch_image({"image": url})

    def fetch_video(self, source: str, fps: float) -> Video:
        """A video file (path or URL) decoded and sampled at ``fps`` through qwen-vl-utils
        (``pip install rlx-qwen-vl[utils]``), its frames resized by qwen-vl-utils' own
        bounds; ``encode`` resizes them again within the video bounds."""
        try:
            from qwen_vl_utils import fetch_video
        except Exception as e:  # it imports torchvision, which may be missing or not match torch
            raise ValueError(f"video files need qwen-vl-utils (pip install 'rlx-qwen-vl[utils]'), which failed to "
                             f"import: {type(e).__name__}: {e}; or give the video as a list of frames") from e
        # fps samples a file; sample_fps is what a list of frames stands for
        frames, sampled = fetch_video({"video": source, "fps": fps, "sample_fps": fps}, return_video_sample_fps=True)
        return Video(frames_of(frames), float(sampled))


def frames_of(video) -> list:
    """RGB PIL frames of what qwen-vl-utils' ``fetch_video`` gives: a [T, C, H, W] tensor,
    or a list of PIL images for a video given as image files."""
    from PIL import Image

    if isinstance(video, torch.Tensor):
        pixels = video.clamp(0, 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
        return [Image.fromarray(frame) for frame in pixels]
    return [frame.convert("RGB") for frame in video]


def mrope_positions(ids: list[int], vision: dict[int, list], merge: int) -> torch.Tensor:
    """[3, len(ids)] M-RoPE positions (temporal, height, width) of one prompt.

    ``vision`` maps each vision token id (image, video) to its inputs in prompt order, each
    a grid (t, h, w) and the step of its time axis; an input's tokens are a run of
    t·h·w / merge² of its id. A time position is ``int(k · step)`` past the start, with
    ``step`` a float32 as transformers computes it, so the same floor applies."""
    columns, position, i = [], 0, 0
    inputs = {token: iter(items) for token, items in vision.items()}
    while i < len(ids):
        if ids[i] not in inputs:
            columns.append(torch.full((3, 1), position))
            position, i = position + 1, i + 1
            continue
        (t, h, w), step = next(inputs[ids[i]])
        h, w = h // merge, w // merge
        times = (torch.arange(t) * torch.as_tensor(step, dtype=torch.float32)).long()
        grid = torch.stack(torch.meshgrid(times, torch.arange(h), torch.arange(w), indexing="ij"))
        columns.append(grid.reshape(3, -1) + position)
        position, i = position + max(h, w), i + t * h * w
    return torch.cat(columns, dim=1)
