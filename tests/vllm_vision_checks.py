"""Checks of the vLLM engine with images, on a tiny random Idefics3 (a VLM whose vLLM model
module loads without torchvision), against the trainer's forward over the same tokens and
images. Run in a process of its own, like ``vllm_checks.py``; prints one JSON object.

    python tests/vllm_vision_checks.py FOLDER     (makes the model and images in FOLDER)
"""

import json
import sys
from pathlib import Path

import torch

IDEFICS3_TOKENS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"]


def make_tiny_idefics3(out: str | Path) -> str:
    """A random Idefics3 (a two-layer SigLIP tower over 56x56 images, 4 image tokens each;
    a two-layer Llama with heads of 32, the smallest vLLM's CPU attention takes) with its
    processor, saved as transformers would."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    from rlx.tiny import make_tokenizer

    tokenizer = make_tokenizer(out, extra_special=IDEFICS3_TOKENS)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    config = Idefics3Config(
        text_config=dict(model_type="llama", vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                         max_position_embeddings=1024, bos_token_id=eos, eos_token_id=eos, pad_token_id=pad,
                         tie_word_embeddings=True),
        vision_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                           image_size=56, patch_size=14),
        scale_factor=2, image_token_id=tokenizer.convert_tokens_to_ids("<image>"), pad_token_id=pad,
        tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        Idefics3ForConditionalGeneration(config).save_pretrained(out)
    images = Idefics3ImageProcessorPil(do_image_splitting=False, size={"longest_edge": 56},
                                       max_image_size={"longest_edge": 56})
    Idefics3Processor(image_processor=images, tokenizer=tokenizer, image_seq_len=4).save_pretrained(out)
    return str(out)


def write_rows(folder: Path, n: int = 8) -> Path:
    """``n`` rows "<image>Colour?" over red or blue squares, and one row with no image."""
    from PIL import Image, ImageDraw

    colours = {"red": (220, 40, 40), "blue": (40, 80, 220)}
    rows = []
    for i in range(n):
        name = sorted(colours)[i % 2]
        image = Image.new("RGB", (56, 56), (128, 128, 128))
        ImageDraw.Draw(image).rectangle((4 + i, 6, 30 + i, 40), fill=colours[name])
        image.save(folder / f"{i}.png")
        rows.append({"prompt": "<image>Colour?", "images": [f"{i}.png"], "label": name})
    rows.append({"prompt": "Colour of the sky?", "label": "blue"})
    (folder / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return folder / "rows.jsonl"


def main(folder: str) -> None:
    from rlx import models, multimodal
    from rlx.config import ModelConfig, resolve
    from rlx.engines.vllm import VLLMEngine
    from rlx.errors import RunError
    from rlx.online import batch_of_completions
    from rlx.plugins import get_host
    from rlx.rollout import SamplingParams
    from rlx.workers.forward import response_logprobs

    root = Path(folder)
    path = make_tiny_idefics3(root / "model") if not (root / "model" / "config.json").is_file() else str(root / "model")
    data = write_rows(root)
    host = get_host()
    config = resolve(host.algorithms.get("grpo"), {"model": {"path": path},
                                                    "data": {"path": str(data), "chat_template": "none"}})
    tokenizer = models.load_tokenizer(path)
    vision = multimodal.vision_data(config, host, tokenizer).reading(str(data))
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    prompts = [vision.encode_prompt(r) for r in rows[:3] + rows[-1:]]  # three with an image, one without
    ids, inputs = [p["prompt_ids"] for p in prompts], [p["inputs"] for p in prompts]
    image_id = tokenizer.convert_tokens_to_ids("<image>")

    out = {}
    engine = VLLMEngine(path, seed=0, dtype="float32", max_model_len=256, eos_ids=[tokenizer.eos_token_id])
    hf = models.load_causal_lm(ModelConfig(path=path), torch.device("cpu"), trainable=False)

    def gap(model, completions, temperature, n):
        samples = [p for p in prompts for _ in range(n)]
        batch = batch_of_completions([p["prompt_ids"] for p in samples], completions, tokenizer.pad_token_id,
                                     [0.0] * len(samples), [i // n for i in range(len(samples))], "cpu",
                                     [p["inputs"] for p in samples])
        with torch.no_grad():
            logp, _ = response_logprobs(model, batch, temperature)
        mask = batch.action_mask.bool()
        return (logp[mask] - batch.rollout_logp[mask]).abs().max().item()

    sampled = SamplingParams(n=4, temperature=0.8, top_p=0.9, top_k=20, max_new_tokens=8, seed=3)
    first = engine.generate(ids, sampled, inputs)
    out["samples"] = len(first)
    out["tokens"] = sum(len(c.token_ids) for c in first)
    out["gap_start"] = gap(hf, first, 0.8, 4)
    out["image_tokens_sampled"] = sum(c.token_ids.count(image_id) for c in first)
    greedy = engine.generate(ids, SamplingParams(n=1, greedy=True, max_new_tokens=8), inputs)
    out["greedy_gap"] = gap(hf, greedy, 1.0, 1)

    # vLLM expands the images itself: a prompt whose ids are not what it expands to is refused
    try:
        engine.generate([ids[0] + [ids[0][-1]]], sampled, inputs[:1])
        out["mismatch"] = "accepted"
    except RunError as e:
        out["mismatch"] = str(e)

    # a sync of every weight, the vision tower's too: the same images give the new model's
    # numbers (vLLM's cached image embeddings are dropped with the old weights)
    old = models.load_causal_lm(ModelConfig(path=path), torch.device("cpu"), trainable=False)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    engine.update_weights(hf.state_dict())
    after = engine.generate(ids, sampled, inputs)
    out["gap_after_sync"] = gap(hf, after, 0.8, 4)
    out["gap_to_old_after_sync"] = gap(old, after, 0.8, 4)

    # a frozen vision tower: only the language model's weights are sent
    frozen = models.load_causal_lm(ModelConfig(path=path, freeze_vision=True), torch.device("cpu"))
    with torch.no_grad():
        for name, p in frozen.named_parameters():
            p.copy_(dict(hf.named_parameters())[name])
            if p.requires_grad:
                p.add_(torch.randn_like(p) * 0.05)
    sent = models.engine_weights(frozen, frozen.state_dict())
    out["frozen_sent_vision"] = sorted(k for k in sent if "vision_model" in k)
    engine.update_weights(sent)
    out["gap_after_frozen_sync"] = gap(frozen.eval(), engine.generate(ids, sampled, inputs), 0.8, 4)
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
