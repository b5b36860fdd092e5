"""rlx's torchvision-free Qwen-VL video tensors against transformers' own video processor.

    python benchmarks/vlm_video_check.py

For several frame lists (odd frame counts, sizes that need resizing and sizes that do
not, the default pixel bounds and tight ones) it builds ``Qwen2VLVideoProcessor`` directly
(no model hub) and compares its ``pixel_values_videos`` and ``video_grid_thw`` with
``rlx_qwen_vl.video.process_videos``: the grids must be equal; the pixels are equal where
no resize happens, and differ slightly where one does (transformers resizes with
torchvision's antialiased bicubic, rlx with PIL's). Where qwen-vl-utils imports, it also
decodes a list of frame files with its ``fetch_video`` through rlx's processor (as a row's
video file would go) and compares the resulting tensors with transformers' on the same
frames. Without torchvision (a CPU-only machine) the comparisons are skipped with a note
and only rlx's side runs. Needs no network; prints one JSON object.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

# (frames, width, height, min_pixels, max_pixels); 0 keeps the video processor's default
# bound. The default cases go first: in transformers 5.17 an instance built with bounds
# changes the defaults of the instances built after it (seen on the GPU machine).
CASES = [
    (1, 224, 168, 0, 0),  # one frame, scaled up to the default minimum of 128 merged patches
    (7, 640, 480, 0, 0),  # scaled down within the default bounds
    (4, 112, 112, 56 * 56, 112 * 112),  # already a multiple of 28 within the bounds: no resize
    (5, 110, 80, 56 * 56, 112 * 112),  # odd count (padded with the last frame), resized
    (3, 640, 360, 56 * 56, 28 * 28 * 64),  # a tight maximum
    (6, 300, 200, 28 * 28 * 200, 28 * 28 * 400),  # a raised minimum
]


def frames_of_case(count: int, width: int, height: int, seed: int) -> list:
    """A coloured square moving over a noisy ground (noise makes resampling differences show)."""
    import numpy as np
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    side = min(width, height) // 3
    out = []
    for k in range(count):
        ground = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        image = Image.fromarray(ground)
        x = (width - side) * k // max(count - 1, 1)
        ImageDraw.Draw(image).rectangle((x, height // 3, x + side, height // 3 + side), fill=(220, 40, 40))
        out.append(image)
    return out


def hf_processor(min_pixels: int, max_pixels: int):
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    bounds = {k: v for k, v in (("min_pixels", min_pixels), ("max_pixels", max_pixels)) if v}
    return Qwen2VLVideoProcessor(**bounds)


def hf_tensors(processor, frames: list) -> dict:
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    # transformers 5.19 warns that its default (no total pixel cap) will change; rlx matches no cap
    extra = {"cap_pixels_per_frame": False} if hasattr(Qwen2VLVideoProcessor, "cap_pixels_per_frame") else {}
    return processor(videos=[frames], return_tensors="pt", do_sample_frames=False, **extra)


def compare(ours: dict, theirs: dict) -> dict:
    grids_equal = ours["video_grid_thw"].tolist() == theirs["video_grid_thw"].tolist()
    a, b = ours["pixel_values_videos"], theirs["pixel_values_videos"].float()
    same_shape = a.shape == b.shape
    diff = (a - b).abs() if same_shape else None
    return {"grid": ours["video_grid_thw"].tolist(), "hf_grid": theirs["video_grid_thw"].tolist(),
            "grids_equal": grids_equal, "shapes_equal": same_shape,
            "max_abs_diff": float(diff.max()) if same_shape else None,
            "mean_abs_diff": float(diff.mean()) if same_shape else None,
            "pixels_equal": bool(same_shape and diff.max() < 1e-5)}


def frame_cases(torchvision: bool) -> list[dict]:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from rlx_qwen_vl.video import VideoSettings, process_videos

    images = Qwen2VLImageProcessorPil()
    results = []
    for seed, (count, width, height, low, high) in enumerate(CASES):
        frames = frames_of_case(count, width, height, seed)
        settings = VideoSettings(**{k: v for k, v in (("min_pixels", low), ("max_pixels", high)) if v})
        ours = process_videos([frames], settings, images)
        case = {"frames": count, "size": [width, height], "min_pixels": settings.min_pixels,
                "max_pixels": settings.max_pixels, "grid": ours["video_grid_thw"].tolist(),
                "patches": list(ours["pixel_values_videos"].shape)}
        if torchvision:
            case.update(compare(ours, hf_tensors(hf_processor(low, high), frames)))
        results.append(case)
    return results


def fetch_video_case(torchvision: bool) -> dict:
    """A list of frame files through qwen-vl-utils' ``fetch_video`` and rlx's processor of a
    tiny model folder (made here), against transformers on the frames fetch_video gave."""
    from rlx.config import resolve
    from rlx.plugins import get_host
    from rlx_qwen_vl.processor import QwenVLProcessor
    from rlx_qwen_vl.tiny import make_tiny_qwen_vl

    with tempfile.TemporaryDirectory() as tmp:
        folder = make_tiny_qwen_vl(Path(tmp) / "tiny")
        paths = []
        for k, frame in enumerate(frames_of_case(5, 160, 120, 7)):
            paths.append(str(Path(tmp) / f"frame_{k}.png"))
            frame.save(paths[-1])
        host = get_host()
        config = resolve(host.algorithms.get("grpo"), {"model": {"path": folder}, "data": {"chat_template": "none"}})
        processor = QwenVLProcessor(folder, config=config)
        video = processor.fetch_video(paths, 2.0)
        encoded = processor.encode("<video>Which way?", [], [video])
        tensors = encoded.inputs.tensors
        result = {"fetched_frames": len(video.frames), "fetched_size": list(video.frames[0].size), "fps": video.fps,
                  "grid": tensors["video_grid_thw"].tolist(),
                  "second_per_grid_ts": tensors["second_per_grid_ts"].tolist(),
                  "video_tokens": encoded.ids.count(processor.video_id)}
        if torchvision:
            bounds = processor.video
            result.update(compare(tensors, hf_tensors(hf_processor(bounds.min_pixels, bounds.max_pixels), video.frames)))
        return result


def main() -> int:
    start = time.perf_counter()
    torchvision = importlib.util.find_spec("torchvision") is not None
    report: dict = {"python": sys.version.split()[0]}
    import torch
    import transformers

    report.update(torch=torch.__version__, transformers=transformers.__version__)
    if torchvision:
        import torchvision as tv

        report["torchvision"] = tv.__version__
    else:
        report["note"] = ("torchvision is not importable: transformers' Qwen2VLVideoProcessor cannot run here, so "
                          "only rlx's torchvision-free side runs (grids and shapes, no comparison)")
    report["frame_lists"] = frame_cases(torchvision)
    try:
        import qwen_vl_utils  # noqa: F401  (it imports torchvision)

        report["fetch_video"] = fetch_video_case(torchvision)
    except ImportError as e:
        report["fetch_video"] = {"skipped": f"qwen-vl-utils does not import: {type(e).__name__}: {e}"}
    checked = [c for c in report["frame_lists"] + [report["fetch_video"]] if "grids_equal" in c]
    report["all_grids_equal"] = all(c["grids_equal"] for c in checked) if checked else None
    report["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(report, indent=2))
    return 0 if report["all_grids_equal"] in (True, None) else 1


if __name__ == "__main__":
    sys.exit(main())
