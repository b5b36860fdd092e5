"""A tiny random Qwen2.5-VL made locally, for tests and CPU experiments (no model hub).

Two decoder layers (hidden 128, head size 32) over a two-block vision tower; the
tokenizer is rlx's tiny byte-level BPE trained with the shapes task's words and the
vision tokens. Its image and video processors keep images and video frames between 56x56
and 112x112 pixels, so a 56x56 image is 4 image tokens and 4 56x56 frames 8 video tokens.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")


TEXT = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=32, max_position_embeddings=1024,
            # M-RoPE: the 16 rotary frequencies of a 32-wide head split over (t, h, w)
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]})
VISION = {
    "qwen2_5_vl": dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=128,
                       fullatt_block_indexes=[1], window_size=56, tokens_per_second=2),  # as the released models
    "qwen2_vl": dict(depth=2, embed_dim=32, mlp_ratio=2, num_heads=2, hidden_size=128),
}


def make_tiny_qwen_vl(out_dir: str | os.PathLike, *, seed: int = 0, min_pixels: int = 56 * 56,
                      max_pixels: int = 112 * 112, text: dict | None = None, vision: dict | None = None,
                      dtype: str = "float32", arch: str = "qwen2_5_vl") -> str:
    """Save a random Qwen2.5-VL (``arch="qwen2_vl"``: Qwen2-VL), its tokenizer and its image
    processor to ``out_dir``. ``text`` and ``vision`` replace the tiny sizes (a 3B shape for
    benchmarks, say)."""
    import torch
    from transformers import (GenerationConfig, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLConfig,
                              Qwen2VLForConditionalGeneration)
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from rlx.models import save_pretrained
    from rlx.tiny import make_tokenizer
    from rlx_qwen_vl.shapes import corpus

    # repeated, so that the BPE merges make its words single tokens beside the tasks' text
    tokenizer = make_tokenizer(out_dir, extra_corpus=corpus() * 200, extra_special=VISION_TOKENS)
    start, end, image, video = tokenizer.convert_tokens_to_ids(list(VISION_TOKENS))
    eos = tokenizer.eos_token_id
    config_class, model_class = {"qwen2_5_vl": (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration),
                                 "qwen2_vl": (Qwen2VLConfig, Qwen2VLForConditionalGeneration)}[arch]
    config = config_class(
        text_config={"vocab_size": len(tokenizer), **(text or TEXT), "bos_token_id": eos, "eos_token_id": eos,
                     "pad_token_id": tokenizer.pad_token_id, "tie_word_embeddings": True},
        vision_config=vision or VISION[arch],
        image_token_id=image, video_token_id=video, vision_start_token_id=start, vision_end_token_id=end,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config).to(getattr(torch, dtype))
    model.generation_config = GenerationConfig(bos_token_id=eos, eos_token_id=eos,
                                               pad_token_id=tokenizer.pad_token_id)
    save_pretrained(model, out_dir)
    Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels).save_pretrained(out_dir)
    # written by hand: transformers' video processor needs torchvision even to save
    video = {"video_processor_type": "Qwen2VLVideoProcessor", "size": {"shortest_edge": min_pixels,
             "longest_edge": max_pixels}, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2}
    (Path(out_dir) / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2) + "\n")
    return str(out_dir)
