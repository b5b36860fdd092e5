"""Qwen-VL video tensors without torchvision: what transformers' ``Qwen2VLVideoProcessor``
makes of a list of frames, from PIL and transformers' PIL image processor.

transformers' video processor needs torchvision to run; this one takes the same settings
and steps. Every frame of a video is resized (bicubic) to one size, ``smart_resize`` of the
first frame's with the video bounds (a video is one tensor there, its frames one size);
then rescaled and normalised as images are; the frame count is padded up to a multiple of
``temporal_patch_size`` with copies of the last frame; and each group of
``temporal_patch_size`` frames is cut into patches in the order the vision tower merges
them (``merge_size``² neighbours together). Resizing runs in PIL where transformers uses
torchvision's antialiased bicubic, so pixels of resized frames may differ slightly;
``benchmarks/vlm_video_check.py`` measures it on a machine with torchvision.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

# Qwen2VLVideoProcessor's defaults: a frame is kept between 128 and 768 merged patches
MIN_PIXELS, MAX_PIXELS = 128 * 28 * 28, 768 * 28 * 28


@dataclass
class VideoSettings:
    min_pixels: int = MIN_PIXELS
    max_pixels: int = MAX_PIXELS
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2

    @classmethod
    def of_folder(cls, path: str | Path, *, min_pixels: int = 0, max_pixels: int = 0) -> "VideoSettings":
        """The settings transformers' video processor would load from a model folder: the
        ``video_processor`` of ``processor_config.json``, else ``video_preprocessor_config.json``,
        else ``preprocessor_config.json`` (older Qwen-VL folders have only that, and their
        videos take the image bounds), else the defaults; ``min_pixels`` / ``max_pixels``
        (when set) replace the bounds."""
        found: dict = {}
        folder = Path(path)
        nested = folder / "processor_config.json"
        if nested.is_file():
            found = json.loads(nested.read_text()).get("video_processor") or {}
        for name in ("video_preprocessor_config.json", "preprocessor_config.json"):
            if not found and (folder / name).is_file():
                found = json.loads((folder / name).read_text())
        size = found.get("size") or {}
        settings = cls(min_pixels=found.get("min_pixels") or size.get("shortest_edge") or MIN_PIXELS,
                       max_pixels=found.get("max_pixels") or size.get("longest_edge") or MAX_PIXELS,
                       **{k: found[k] for k in ("patch_size", "temporal_patch_size", "merge_size") if k in found})
        settings.min_pixels = min_pixels or settings.min_pixels
        settings.max_pixels = max_pixels or settings.max_pixels
        return settings


def process_videos(videos: list[list], settings: VideoSettings, images) -> dict[str, torch.Tensor]:
    """``pixel_values_videos`` [patches, C·temporal_patch·patch²] and ``video_grid_thw``
    [videos, 3] of ``videos`` (each a list of RGB PIL frames); ``images``, the PIL image
    processor, rescales and normalises them as it does images."""
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    patches, grids = [], []
    for frames in videos:
        width, height = frames[0].size
        height, width = smart_resize(height, width, factor=settings.patch_size * settings.merge_size,
                                     min_pixels=settings.min_pixels, max_pixels=settings.max_pixels)
        stacked = []
        for frame in frames:
            frame = frame.resize((width, height), Image.Resampling.BICUBIC)
            pixels = images.rescale(np.asarray(frame).transpose(2, 0, 1), images.rescale_factor)
            stacked.append(images.normalize(pixels, images.image_mean, images.image_std))
        flat, grid = patchify(torch.from_numpy(np.stack(stacked)).float(), settings)
        patches.append(flat)
        grids.append(grid)
    return {"pixel_values_videos": torch.cat(patches), "video_grid_thw": torch.tensor(grids)}


def patchify(frames: torch.Tensor, settings: VideoSettings) -> tuple[torch.Tensor, list[int]]:
    """[T, C, H, W] frames to [t·h·w, C·temporal_patch·patch²] patches and their grid
    (t, h, w): time-major, then each merge_size² block of neighbouring patches together,
    each patch laid out channel, time, row, column."""
    patch, merge, temporal = settings.patch_size, settings.merge_size, settings.temporal_patch_size
    if pad := -len(frames) % temporal:  # the last frame repeated, as transformers pads
        frames = torch.cat([frames, frames[-1:].expand(pad, -1, -1, -1)])
    count, channels, height, width = frames.shape
    t, h, w = count // temporal, height // patch, width // patch
    blocks = frames.reshape(t, temporal, channels, h // merge, merge, patch, w // merge, merge, patch)
    # (t, h/merge, w/merge, merge_h, merge_w, C, temporal, patch_h, patch_w)
    blocks = blocks.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return blocks.reshape(t * h * w, channels * temporal * patch * patch), [t, h, w]
