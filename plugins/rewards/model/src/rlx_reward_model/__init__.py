"""Reward model ``model``: scores completions with a model trained by ``rlx train --algo rm``.

Such a model is a Hugging Face ``AutoModelForSequenceClassification`` folder with one
label (a scalar ``score`` head) and its tokenizer. A sample is encoded as the reward
model saw its training pairs: the prompt (given the tokenizer's special tokens unless
it already starts with BOS, as a rendered chat template does), the completion, then
EOS; the reward is the head's value at that last token. Texts are scored without
gradients in batches of ``BATCH_SIZE``, grouped by length so little padding is
computed; padding never changes a score.

torch and transformers are imported only when a model is loaded.
"""

from __future__ import annotations

from rlx import hookimpl

BATCH_SIZE = 16


def load_reward_model(path, *, config=None, device=None):
    """A scorer ``(prompts, completions) -> list[float]`` for the model in ``path``.

    ``device`` defaults to this process's GPU when CUDA is available, else the CPU; the
    weights load in bfloat16 on GPU, float32 on CPU.
    """
    import torch
    from transformers import AutoConfig

    from rlx import models, paths
    from rlx.config import ModelConfig

    # a causal LM would load with a fresh random head and score noise: refuse it
    hf_config = AutoConfig.from_pretrained(paths.model_path(path))
    architectures = hf_config.architectures or []
    if hf_config.num_labels != 1 or not any(a.endswith("ForSequenceClassification") for a in architectures):
        raise ValueError(f"{path} is not a reward model: expected a *ForSequenceClassification model with one "
                         f"label (as `rlx train --algo rm` saves), found {', '.join(architectures) or 'none'} "
                         f"with num_labels={hf_config.num_labels}")
    device = models.resolve_device("auto" if device is None else str(device))
    tokenizer = models.load_tokenizer(path)
    if tokenizer.eos_token_id is None:
        raise ValueError(f"{path}: the tokenizer has no EOS token, which ends every scored text")
    model = models.load_value_model(ModelConfig(path=str(path)), device, trainable=False)
    bos = tokenizer.bos_token

    def encode(prompt: str, completion: str) -> list[int]:
        special = not (bos and prompt.startswith(bos))
        return (tokenizer(prompt, add_special_tokens=special)["input_ids"]
                + tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])

    @torch.no_grad()
    def score(prompts: list[str], completions: list[str]) -> list[float]:
        ids = [encode(p, c) for p, c in zip(prompts, completions)]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        rewards = [0.0] * len(ids)
        for start in range(0, len(order), BATCH_SIZE):
            chunk = order[start:start + BATCH_SIZE]
            lengths = torch.tensor([len(ids[i]) for i in chunk])
            # right padding with any id: the attention mask hides it and positions stay 0..n-1
            input_ids = torch.zeros(len(chunk), int(lengths.max()), dtype=torch.long)
            for row, i in enumerate(chunk):
                input_ids[row, :len(ids[i])] = torch.tensor(ids[i])
            mask = (torch.arange(input_ids.shape[1]) < lengths[:, None]).long().to(device)
            values = models.last_token_values(models.token_values(model, input_ids.to(device), mask), mask)
            for i, value in zip(chunk, values.tolist()):
                rewards[i] = value
        return rewards

    return score


@hookimpl
def register_reward_models(register):
    register("model", load_reward_model)
