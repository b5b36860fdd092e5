"""The Qwen2-VL / Qwen2.5-VL processor: prompts with images to token ids, image tensors
and M-RoPE positions.

It needs only the model folder's tokenizer and transformers' PIL image processor:
``AutoProcessor`` would also build the video processor, which needs torchvision. Each
``<image>`` placeholder becomes ``<|vision_start|><|image_pad|><|vision_end|>`` before
the chat template runs; after it, each image's pad token is repeated once per merged
patch (grid t·h·w / merge²). Positions follow the model's M-RoPE: text advances all three
axes together; an image's tokens take (t, h, w) grid positions from where the text
stands, and the text after it goes on from the largest of those plus one.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rlx.data import render_prompt, resolve_template
from rlx.errors import ModelError
from rlx.models import load_tokenizer
from rlx.multimodal import PLACEHOLDER, ModelInputs, VisionPrompt


class QwenVLProcessor:
    """``encode(prompt, images)`` for a Qwen2-VL / Qwen2.5-VL model folder.

    ``data.min_pixels`` / ``data.max_pixels`` (when set) bound each image's size after
    resizing, which sets its number of tokens; otherwise the folder's
    ``preprocessor_config.json`` does.
    """

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
        if self.images.merge_size != self.merge:
            raise ModelError(f"{path}: the image processor merges {self.images.merge_size}x{self.images.merge_size} "
                             f"patches, the model {self.merge}x{self.merge}")
        self.image_id = model.image_token_id
        tokens = self.tokenizer.convert_ids_to_tokens([model.vision_start_token_id, model.image_token_id,
                                                       model.vision_end_token_id])
        if None in tokens or self.tokenizer.convert_tokens_to_ids(tokens) != [
                model.vision_start_token_id, model.image_token_id, model.vision_end_token_id]:
            raise ModelError(f"{path}: the tokenizer has no tokens for the model's vision ids")
        self.start, self.pad, self.end = tokens

    def encode(self, prompt: str | list[dict], images: list) -> VisionPrompt:
        vision = self.start + self.pad + self.end
        if isinstance(prompt, str):
            prompt = prompt.replace(PLACEHOLDER, vision)
        else:
            prompt = [{**m, "content": m["content"].replace(PLACEHOLDER, vision)} for m in prompt]
        text = render_prompt(prompt, self.tokenizer, self.cfg.chat_template)
        if text.count(self.pad) != len(images):
            raise ValueError(f"the rendered prompt holds {text.count(self.pad)} {self.pad} tokens for {len(images)} "
                             f"images (the prompt or chat template writes vision tokens of its own)")
        tensors = dict(self.images(images=images, return_tensors="pt")) if images else {}
        grids = tensors.get("image_grid_thw", torch.zeros(0, 3, dtype=torch.long))
        counts = (grids.prod(-1) // self.merge ** 2).tolist()
        parts = text.split(self.pad)
        expanded = parts[0] + "".join(self.pad * n + part for n, part in zip(counts, parts[1:]))
        templated = resolve_template(self.tokenizer, self.cfg.chat_template) is not None
        ids = self.tokenizer(expanded, add_special_tokens=not templated)["input_ids"]
        if ids.count(self.image_id) != sum(counts):
            raise ValueError(f"the prompt's text tokenizes to {ids.count(self.image_id)} image tokens where its "
                             f"images need {sum(counts)}")
        positions = mrope_positions(ids, grids, self.image_id, self.merge)
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


def mrope_positions(ids: list[int], grids: torch.Tensor, image_id: int, merge: int) -> torch.Tensor:
    """[3, len(ids)] M-RoPE positions (temporal, height, width) of one prompt whose image
    tokens come in runs of t·h·w / merge² per image, in the order of ``grids``."""
    columns, position, i = [], 0, 0
    images = iter(grids.tolist())
    while i < len(ids):
        if ids[i] != image_id:
            columns.append(torch.full((3, 1), position))
            position, i = position + 1, i + 1
            continue
        t, h, w = next(images)
        h, w = h // merge, w // merge
        grid = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij"))
        columns.append(grid.reshape(3, -1) + position)
        position, i = position + max(h, w), i + t * h * w
    return torch.cat(columns, dim=1)
