"""The forward passes the workers share: per-token log-probs (and entropy) and values of
a batch's responses, in micro-batches. One path, so that rollout scoring, the old and
reference log-probs and the training step all compute the same thing."""

from __future__ import annotations

import random
from collections.abc import Iterator

import torch

from rlx import models, ops
from rlx.batch import Batch


def chunks(n: int, size: int) -> list[list[int]]:
    return [list(range(i, min(i + size, n))) for i in range(0, n, size)]


def minibatches(batch: Batch, *, epochs: int, size: int, seed: int) -> Iterator[Batch]:
    """``epochs`` shuffled passes over ``batch`` in optimizer steps of ``size`` samples; the
    same ``seed`` gives policy and critic the same steps."""
    rng = random.Random(seed)
    for _ in range(epochs):
        order = list(range(len(batch)))
        rng.shuffle(order)
        for start in range(0, len(batch), size):
            yield batch.select(order[start:start + size])


def response_logits(model, batch: Batch) -> torch.Tensor:
    """Logits that predict each response token: [B, R, V]."""
    response_len = batch.action_mask.shape[1]
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
                logits_to_keep=response_len + 1, use_cache=False, **batch.extra)
    return out.logits[:, :-1]


def response_logprobs(model, batch: Batch, temperature: float, *, with_entropy: bool = False):
    """log softmax(z / T) of each response token [B, R], and the entropy of the untempered
    logits when asked."""
    logits = response_logits(model, batch)
    logp = ops.token_logprobs(logits, batch.responses, temperature)
    entropy = ops.entropy_from_logits(logits) if with_entropy else None
    return logp, entropy


def response_values(critic, batch: Batch) -> torch.Tensor:
    """The critic's value of the state before each response token: [B, R]."""
    values = models.token_values(critic, batch.input_ids, batch.attention_mask, batch.position_ids)
    response_len = batch.action_mask.shape[1]
    return values[:, batch.prompt_len - 1:batch.prompt_len - 1 + response_len].float()


@torch.no_grad()
def batched(fn, batch: Batch, micro: int) -> torch.Tensor:
    """``fn`` over micro-batches of ``batch``, concatenated."""
    return torch.cat([fn(batch.select(index)) for index in chunks(len(batch), micro)])
