"""Qwen2-VL and Qwen2.5-VL for rlx: a VLM processor registered for both model types.

Prompts with images then run through rollout, rewards and every algorithm that takes
them (``docs/multimodal.md``). Nothing heavy is imported until a run builds the processor.
"""

from rlx import hookimpl

MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl")


def qwen_vl_processor(model_path: str, *, config):
    from rlx_qwen_vl.processor import QwenVLProcessor

    return QwenVLProcessor(model_path, config=config)


@hookimpl
def register_vlm_processors(register):
    for name in MODEL_TYPES:
        register(name, qwen_vl_processor)
