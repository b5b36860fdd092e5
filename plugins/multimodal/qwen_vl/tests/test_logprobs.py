"""Rollout and training see the same model: the log-probs the native engine reports while
sampling with images and videos equal the training forward's over prompt + completion, and
both equal transformers' own M-RoPE forward (``mm_token_type_ids``: 1 on image tokens, 2
on video tokens), for Qwen2.5-VL and Qwen2-VL. Without M-RoPE Qwen2.5-VL silently runs 1-D positions and the numbers move:
that is what this would catch."""

from __future__ import annotations

import json
import random

import pytest
import torch

from rlx import models, multimodal
from rlx.config import ModelConfig, resolve
from rlx.online import batch_of_completions
from rlx.plugins import get_host
from rlx.rollout import NativeEngine, SamplingParams
from rlx.testing import one_thread  # noqa: F401
from rlx.workers.forward import response_logprobs
from rlx_qwen_vl.shapes import VIDEO_QUESTION, moving_square


def shapes_prompts(model_path, shapes, n):
    """The shapes task's first ``n`` rows, the model's tokenizer and the task's prompt encoder."""
    train, _ = shapes
    host = get_host()
    config = resolve(host.algorithms.get("grpo"), {"model": {"path": model_path},
                                                    "data": {"path": str(train["prompts"]), "chat_template": "none"}})
    tokenizer = models.load_tokenizer(model_path)
    vision = multimodal.vision_data(config, host, tokenizer).reading(str(train["prompts"]))
    rows = [json.loads(line) for line in train["prompts"].read_text().splitlines()[:n]]
    return rows, tokenizer, vision.encode_prompt


def video_rows(images: list) -> list[dict]:
    """A prompt with an image and a video (5 frames: 3 time steps), and one with a video alone."""
    rng = random.Random(0)
    return [{"prompt": "<image>" + VIDEO_QUESTION, "images": images, "videos": [moving_square("up", "red", rng, 5)],
             "label": "up"},
            {"prompt": VIDEO_QUESTION, "videos": [moving_square("left", "blue", rng, 4)], "label": "left"}]

@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen2_vl"])
def test_rollout_training_and_transformers_log_probs_agree(arch, request, shapes):
    tiny_vl = request.getfixturevalue({"qwen2_5_vl": "tiny_vl", "qwen2_vl": "tiny_qwen2_vl"}[arch])
    rows, tokenizer, encode = shapes_prompts(tiny_vl, shapes, 3)
    rows.append({"prompt": "<image>Left, then <image>right: which is red?",
                 "images": rows[0]["images"] + rows[1]["images"], "label": "x"})  # two images, more prompt tokens
    rows.append({"prompt": "What colour is grass?", "label": "green"})  # no image at all
    rows += video_rows(rows[2]["images"])
    prompts = [encode(r) for r in rows]
    assert prompts[-2]["inputs"].tensors["video_grid_thw"].tolist() == [[3, 4, 4]]
    model = models.load_causal_lm(ModelConfig(path=tiny_vl), torch.device("cpu"), trainable=False)

    n = 2
    completions = NativeEngine(model, tokenizer).generate(
        [p["prompt_ids"] for p in prompts], SamplingParams(n=n, max_new_tokens=6, seed=0),
        [p["inputs"] for p in prompts])
    image_ids = {model.config.image_token_id, model.config.video_token_id}
    assert not any(image_ids & set(c.token_ids) for c in completions)  # responses never ask for pixels
    samples = [p for p in prompts for _ in range(n)]
    batch = batch_of_completions([p["prompt_ids"] for p in samples], completions, tokenizer.pad_token_id,
                                 [0.0] * len(samples), [i // n for i in range(len(samples))], "cpu",
                                 [p["inputs"] for p in samples])
    with torch.no_grad():
        logp, _ = response_logprobs(model, batch, 1.0)
    mask = batch.action_mask.bool()
    assert mask.sum() > 20
    torch.testing.assert_close(logp[mask], batch.rollout_logp[mask], atol=2e-5, rtol=0)

    # the batch split, shuffled and regrouped (pixel_values by each sample's patches) scores the same
    order = [7, 12, 2, 9, 0, 13, 5, 3, 10, 8, 1, 11, 6, 4]
    with torch.no_grad():
        parts = [response_logprobs(model, part, 1.0)[0] for part in batch.select(order).split(3)]
    torch.testing.assert_close(torch.cat(parts), logp[order], atol=2e-5, rtol=0)

    # transformers' own forward, one sample at a time: with M-RoPE equal; without
    # mm_token_type_ids Qwen2.5-VL silently runs 1-D positions (the numbers move) and
    # Qwen2-VL refuses
    def scores(sample, completion, **kinds):
        ids = torch.tensor([sample["prompt_ids"] + completion.token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids, **multimodal.present(sample["inputs"].tensors), **kinds).logits
        start = len(sample["prompt_ids"]) - 1
        picked = logits[0, start:-1].log_softmax(-1).gather(-1, ids[0, start + 1:, None]).squeeze(-1)
        return (picked - torch.tensor(completion.logprobs)).abs().max().item()

    with_images = [(s, c) for s, c in zip(samples, completions) if s["inputs"].tensors]
    for sample, completion in zip(samples, completions):
        ids = torch.tensor([sample["prompt_ids"] + completion.token_ids])
        kinds = (ids == model.config.image_token_id).int() + 2 * (ids == model.config.video_token_id).int()
        assert scores(sample, completion, mm_token_type_ids=kinds) < 2e-5
    if arch == "qwen2_5_vl":
        assert max(scores(s, c) for s, c in with_images) > 1e-3
    else:
        with pytest.raises(ValueError, match="mm_token_type_ids"):
            scores(*with_images[0])


@pytest.mark.parametrize("sampling,slots", [(dict(greedy=True), 64), (dict(seed=3), 64), (dict(seed=3, top_p=0.9), 64),
                                            (dict(greedy=True), 4)],
                         ids=["greedy", "sampled", "top-p", "greedy-joining"])
def test_the_static_decoder_samples_what_the_plain_loop_does(tiny_vl, shapes, sampling, slots):
    """Prompts with images decode in the static decoder (a text token's M-RoPE position is
    the same on every axis) and give the plain transformers loop's tokens and log-probs;
    with room for 2 prompts, the rest join as rows finish."""
    rows, tokenizer, encode = shapes_prompts(tiny_vl, shapes, 2)
    rows.append({"prompt": "What colour is grass?", "label": "green"})
    rows += video_rows(rows[0]["images"])
    prompts = [encode(r) for r in rows]
    model = models.load_causal_lm(ModelConfig(path=tiny_vl), torch.device("cpu"), trainable=False)
    engine = NativeEngine(model, tokenizer, max_batch_size=slots)
    assert engine.static is not None
    params = SamplingParams(n=2, max_new_tokens=12, **sampling)
    args = ([p["prompt_ids"] for p in prompts], params, [p["inputs"] for p in prompts])
    static = engine.generate(*args)
    engine.static = None
    plain = engine.generate(*args)
    assert [c.token_ids for c in static] == [c.token_ids for c in plain]
    for a, b in zip(static, plain):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=2e-5, rtol=0)
