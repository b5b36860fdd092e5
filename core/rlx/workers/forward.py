"""The forward passes the workers share: per-token log-probs (and entropy) and values of
a batch's responses, in micro-batches. One path, so that rollout scoring, the old and
reference log-probs and the training step all compute the same thing."""

from __future__ import annotations

import functools
import random
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from rlx import logprob_kernels, models, ops, varlen
from rlx.batch import Batch, on_device
from rlx.multimodal import model_positions, present


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


@dataclass
class Host:
    """A batch's masks and prompt columns on the host: what laying out its forward needs
    (which tokens are actions, which samples share a prompt, where each goes in a packed
    row), worked out there without waiting for the GPU. Read from the device, each of a
    micro-batch's several index tensors was a wait for the GPU's queue to drain, and the
    GPU idled while the host worked out the next and queued the forward."""

    attention: np.ndarray  # [B, P + R] bool
    action: np.ndarray  # [B, R] bool
    prompts: np.ndarray  # [B, P] the prompt columns of input_ids

    @classmethod
    def of(cls, batch: Batch) -> "Host":
        """``batch``'s, in one copy from its device."""
        p, width = batch.prompt_len, batch.input_ids.shape[1]
        both = torch.cat([batch.attention_mask != 0, batch.action_mask != 0], 1)
        copied = torch.cat([both.long(), batch.input_ids[:, :p]], 1).cpu().numpy()
        return cls(copied[:, :width] != 0, copied[:, width:2 * width - p] != 0, copied[:, 2 * width - p:])

    def select(self, index: list[int]) -> "Host":
        return Host(self.attention[index], self.action[index], self.prompts[index])


# tokens whose float32 logits a chunk holds at once: 2^27 elements (512 MiB) of them
_CHUNK_ELEMENTS = 1 << 27
# Off CUDA, a pass whose probabilities take at most 2^24 float32 elements (64 MiB) keeps
# them for the backward pass rather than recomputing logits and softmax there (a quarter
# of the output head's time on W0's CPU update).
_KEEP_ELEMENTS = 1 << 24


def response_logprobs(model, batch: Batch, temperature: float, *, with_entropy: bool = False,
                      entropy_grad: bool = False, packed: bool = False, share: bool = True, host: Host | None = None):
    """log softmax(z / T) of each response token [B, R], and the entropy of the untempered
    logits when asked (differentiable only with ``entropy_grad``); 0 on tokens outside
    ``action_mask``. ``host``: the batch's ``Host`` when the caller has it already.

    The model runs up to its last hidden states (``response_states``); the output head then
    runs over the action tokens only, a chunk at a time, and under autograd each chunk is
    recomputed in the backward pass: the [tokens, vocab] float32 logits never exist whole.
    """
    host = host or Host.of(batch)
    index, = on_device(batch.input_ids.device, np.flatnonzero(host.action))
    states = response_states(model, batch, packed=packed, share=share, host=host)
    head = models.hf_module(model).get_output_embeddings()
    hidden, labels = states.flatten(0, 1).index_select(0, index), batch.responses.flatten()[index]
    logp, entropy = _head_logprobs(head, hidden, labels, temperature, with_entropy, entropy_grad)
    shape = batch.action_mask.shape

    def scatter(values):
        return values.new_zeros(shape.numel()).index_copy(0, index, values).view(shape)

    return scatter(logp), scatter(entropy) if with_entropy else None


def response_values(critic, batch: Batch, *, packed: bool = False, share: bool = True,
                    host: Host | None = None) -> torch.Tensor:
    """The critic's value of the state before each response token, [B, R] in float32 (any
    finite number outside ``action_mask``), from the states ``response_logprobs`` takes."""
    states = response_states(critic, batch, packed=packed, share=share, host=host)
    return models.hf_module(critic).score(states).squeeze(-1).float()


def response_states(model, batch: Batch, *, packed: bool = False, share: bool = True,
                    host: Host | None = None) -> torch.Tensor:
    """The last hidden states that predict each response token (the state before it), [B, R, H].

    Samples that share a prompt run it once (``_shared_row_states`` on CUDA,
    ``_shared_prompt_states`` elsewhere); otherwise ``packed`` runs the samples as one row
    without their padding (``_packed_states``). ``share=False`` runs every sample's prompt.
    """
    row = _row_ready(model)
    shared = None
    if share and not batch.extra and (row or _cache_ready(model)):
        host = host or Host.of(batch)
        shared = _shared_prompts(batch, host)
    if shared is not None and row:
        return _shared_row_states(model, batch, host, *shared)
    if packed and not batch.extra:
        return _packed_states(model, batch)
    if shared is not None:
        return _shared_prompt_states(model, batch, *on_device(batch.input_ids.device, *shared))
    response_len = batch.action_mask.shape[1]
    last, _ = _final_states(model, input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                            position_ids=model_positions(batch.position_ids), use_cache=False,
                            **present(batch.extra))
    return last[:, -(response_len + 1):-1]


def _shared_prompts(batch: Batch, host: Host) -> tuple[np.ndarray, np.ndarray] | None:
    """(the first row of each distinct prompt, each row's prompt among them) when a batch's
    samples share prompts enough to pay (at most half as many prompts as rows, the n samples
    of a GRPO group) and its positions are plain text ones. None otherwise."""
    if batch.position_ids is None or batch.position_ids.dim() != 2:
        return None
    prompts = np.concatenate([host.prompts, host.attention[:, :batch.prompt_len]], 1)
    keys = [row.tobytes() for row in prompts]
    # numbered in an order of their own, not the batch's: the prompts' pass then adds up the
    # same rows in the same order however the batch came (np.unique over rows: 10x slower)
    labels = {key: i for i, key in enumerate(sorted(set(keys)))}
    if 2 * len(labels) > len(batch):
        return None
    inverse = np.fromiter((labels[key] for key in keys), np.int64, len(keys))
    return np.unique(inverse, return_index=True)[1], inverse


def _row_ready(model) -> bool:
    """Whether ``model`` runs a row of shared prompts (``_shared_row_states``) on the flash
    kernel: on CUDA, attending through ``rlx_varlen``, full attention in every layer."""
    module = models.hf_module(model)
    return next(module.parameters()).device.type == "cuda" and module.config._attn_implementation == varlen.NAME \
        and models.full_attention(module.config)


def _cache_ready(model) -> bool:
    """Whether ``model`` can run its prompts once through a cache (``_shared_prompt_states``):
    full attention in every layer, its layers eager (a compiled layer would trace the cache),
    no gradient checkpointing (which turns the cache off), not ZeRO-3 (every forward gathers
    the weights with the other ranks, whose batches may share less: each rank must run as many
    forwards)."""
    module = models.hf_module(model)
    return not (module.is_gradient_checkpointing or models.zero3(module) or models.layers_compiled(model)) \
        and models.full_attention(module.config)


def _shared_prompt_states(model, batch: Batch, first: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """``response_logprobs``'s states with each distinct prompt run once: its keys and
    values, taken by every sample of it (their gradients add up there), then the responses
    alone over them. The same numbers as one forward over prompt and response, with the
    prompt's share of the layers' work divided by the samples per prompt."""
    p, response_len = batch.prompt_len, batch.action_mask.shape[1]
    prompt_states, out = _final_states(model, input_ids=batch.input_ids[first, :p],
                                       attention_mask=batch.attention_mask[first, :p],
                                       position_ids=batch.position_ids[first, :p], use_cache=True)
    cache = out.past_key_values
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys.index_select(0, inverse), layer.values.index_select(0, inverse)
    rest, _ = _final_states(model, input_ids=batch.input_ids[:, p:], attention_mask=batch.attention_mask,
                            position_ids=batch.position_ids[:, p:], past_key_values=cache, use_cache=False)
    # the prompt's last state predicts the first response token; each response state the next
    first_state = prompt_states[:, -1:].index_select(0, inverse)
    return torch.cat([first_state, rest[:, :response_len - 1]], 1)


def _shared_row_states(model, batch: Batch, host: Host, first: np.ndarray, inverse: np.ndarray) -> torch.Tensor:
    """``response_logprobs``'s states from one forward over a packed row that holds each
    distinct prompt once, followed by the responses of its samples, none of the padding.

    Each response attends to its prompt's keys, then to its own (``rlx_varlen`` gathers them
    by ``key_index`` for the variable-length flash kernel), so the numbers are those of one
    forward over each prompt and response, and the prompts' gradients add up over their
    samples. Unlike ``_shared_prompt_states`` this is one forward: compiled layers, gradient
    checkpointing and ZeRO-3 take it. The row's layout is worked out on the host.
    """
    rows, width = host.attention.shape
    p = batch.prompt_len
    carries = np.zeros(rows, bool)
    carries[first] = True  # the row that brings its prompt into the packed row
    # a prompt's samples side by side, the one that carries it first
    order = np.argsort(inverse * rows + np.arange(rows))
    keep = host.attention.copy()
    keep[:, :p] &= carries[:, None]
    keep = keep[order]
    taken = (order[:, None] * width + np.arange(width))[keep]  # the packed row's tokens in the flat batch
    row = np.broadcast_to(np.arange(rows)[:, None], keep.shape)[keep]
    prompt = np.broadcast_to(np.arange(width) < p, keep.shape)[keep]
    # segments: each prompt, each response; a response's keys are its prompt's, then its own
    segment = 2 * row + ~prompt
    starts = np.flatnonzero(np.diff(segment, prepend=-1))
    lengths = np.diff(starts, append=len(segment))
    docs = segment[starts]
    group, is_prompt = inverse[order][docs // 2], docs % 2 == 0
    prompt_start, prompt_len = np.zeros(len(first), np.int64), np.zeros(len(first), np.int64)
    prompt_start[group[is_prompt]], prompt_len[group[is_prompt]] = starts[is_prompt], lengths[is_prompt]
    before = np.where(is_prompt, 0, prompt_len[group])
    run_starts = np.stack([prompt_start[group], starts], 1).ravel()
    run_lengths = np.stack([before, lengths], 1).ravel()
    run_offsets = run_lengths.cumsum() - run_lengths
    key_index = np.repeat(run_starts - run_offsets, run_lengths) + np.arange(run_lengths.sum())
    # each (row, column)'s place in the packed row; a sample's prompt columns are its carrier's
    place = np.full((rows, width), -1)
    placed = np.full((rows, width), -1)
    placed[keep] = np.arange(len(taken))
    place[order] = placed
    place[:, :p] = place[first[inverse], :p]
    # a response token is predicted from the place before; padding columns point anywhere valid
    before_token = place[:, p - 1:width - 1].clip(min=0)
    taken, key_index, cu_q, cu_k, before_token = on_device(
        batch.input_ids.device, taken, key_index, np.concatenate([[0], lengths.cumsum()]),
        np.concatenate([[0], (before + lengths).cumsum()]), before_token)
    last, _ = _final_states(model, input_ids=batch.input_ids.flatten()[taken][None],
                            position_ids=batch.position_ids.flatten()[taken][None], use_cache=False,
                            key_index=key_index, cu_seq_lens_q=cu_q.int(), cu_seq_lens_k=cu_k.int(),
                            max_length_q=int(lengths.max()), max_length_k=int((before + lengths).max()))
    return last[0][before_token]


def _packed_states(model, batch: Batch) -> torch.Tensor:
    """The last hidden states that predict each response token, [B, R, H], from one forward
    over the samples' real tokens laid end to end: no compute on padding.

    The model gets the positions, restarting at 0 for each sample, the samples' bounds and
    no attention mask; attention then stays within each sample (flash-attn's or torch's
    variable-length kernel on CUDA, ``rlx.varlen``; on the CPU SDPA with a block-diagonal
    mask, which pays only where padding is a large share of the batch).
    """
    valid = batch.attention_mask.bool()
    positions = batch.position_ids[valid][None]
    last, _ = _final_states(model, input_ids=batch.input_ids[valid][None], position_ids=positions, use_cache=False,
                            **varlen.packed_kwargs(positions))
    # a token's place in the packed row; a response token is predicted from the place before
    place = valid.flatten().cumsum(0).view(valid.shape) - 1
    before = (place[:, batch.prompt_len:] - 1).clamp(min=0)  # padding columns point anywhere valid
    return last[0][before]


def _final_states(model, **inputs) -> tuple[torch.Tensor, object]:
    """The model's last hidden states (after its final norm) and its output, from one pass
    through the outermost module (ZeRO-3 adds up gradients only there), a causal LM's head
    on one position.

    A hook on the decoder stack takes the states, not ``output_hidden_states``: that installs
    transformers' capture hooks in every attention module, whose ``ContextVar`` Dynamo cannot
    trace, so a compiled layer broke into three graphs around its attention.
    """
    module = models.hf_module(model)
    one = {"logits_to_keep": 1} if module.get_output_embeddings() is not None else {}
    out, base = models.run_capturing(model, getattr(module, module.base_model_prefix), **inputs, **one)
    return base[0], out


def _head_logprobs(head, hidden: torch.Tensor, labels: torch.Tensor, temperature: float, with_entropy: bool,
                   entropy_grad: bool):
    from torch.utils.checkpoint import checkpoint

    if len(hidden) == 0:  # no action tokens: empty results that still reach the graph
        empty = hidden[:, 0].float() * 0
        return empty, empty
    vocab = head.out_features if hasattr(head, "out_features") else head.weight.shape[0]
    size = max(1, _CHUNK_ELEMENTS // vocab)
    # A plain linear head (not LoRA-wrapped, not a ZeRO-3 shard) takes the hand-written
    # backward, which recomputes only the logits; otherwise autograd replays each chunk.
    direct = type(head) is torch.nn.Linear and head.bias is None and not hasattr(head.weight, "ds_id")
    if torch.is_grad_enabled() and direct and not entropy_grad:
        keep = hidden.device.type != "cuda" and len(hidden) * vocab <= _KEEP_ELEMENTS
        return _HeadLogprob.apply(hidden, head.weight, labels, temperature, with_entropy, size, keep)
    parts = []
    for start in range(0, len(hidden), size):
        h, y = hidden[start:start + size], labels[start:start + size]
        if torch.is_grad_enabled():
            parts.append(checkpoint(_chunk, head, h, y, temperature, with_entropy, use_reentrant=False))
        else:
            parts.append(_chunk(head, h, y, temperature, with_entropy))
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def _chunk(head, hidden, labels, temperature, with_entropy):
    logits = head(hidden)
    if torch.is_grad_enabled():  # autograd replays this chunk: plain ops
        logp = ops.token_logprobs(logits, labels, temperature)
        return logp, ops.entropy_from_logits(logits) if with_entropy else logp.new_zeros(0)
    logp, _, entropy = _stats_of(logits)(logits, labels, temperature, with_entropy)
    return logp, entropy


def _stats(logits, labels, temperature: float, with_entropy: bool, keep: bool = False):
    """log softmax(z / T) at the labels, its normaliser logsumexp(z / T) and the entropy of
    softmax(z) when asked (``ops.token_logprobs`` and ``ops.entropy_from_logits``), from
    eager kernels that each make one pass (log_softmax, exp) rather than logsumexp's
    several; with ``keep`` the second value is softmax(z / T) itself rather than its normaliser."""
    scaled = logits.float() if temperature == 1 else logits.float() / temperature
    logprobs = scaled.log_softmax(-1)
    logp = logprobs.gather(-1, labels[:, None]).squeeze(-1)
    probs = logprobs.exp() if keep or (with_entropy and temperature == 1) else None
    saved = probs if keep else scaled.gather(-1, labels[:, None]).squeeze(-1) - logp
    if not with_entropy:
        return logp, saved, logp.new_zeros(0)
    if temperature != 1:  # the entropy is of the untempered distribution
        logprobs = logits.float().log_softmax(-1)
        probs = logprobs.exp()
    return logp, saved, -torch.linalg.vecdot(probs, logprobs)


def _logits_grad(logits, lse, labels, grad_logp, temperature: float):
    """∂(Σ g·logp)/∂z = g·(onehot − softmax(z / T)) / T in the logits' dtype, as softmax's
    one pass and two in-place updates."""
    g = grad_logp.float() / temperature
    grad = (logits.float() if temperature == 1 else logits.float() / temperature).softmax(-1).mul_(-g[:, None])
    return grad.scatter_add_(-1, labels[:, None], g[:, None]).to(logits.dtype)


def _stats_of(logits: torch.Tensor):
    """``_stats`` for these logits: one read of them in Triton kernels on CUDA."""
    return logprob_kernels.stats if logprob_kernels.supported(logits.device) else _stats


def _grad_of(logits: torch.Tensor):
    """``_logits_grad`` for these logits: on CUDA a Triton kernel that writes the gradient
    over the logits, which the backward pass recomputed and needs no more."""
    if logprob_kernels.supported(logits.device):
        return lambda z, lse, labels, g, temperature: logprob_kernels.logits_grad(z, lse, labels, g, temperature,
                                                                                   out=z)
    return _logits_grad


class _HeadLogprob(torch.autograd.Function):
    """log softmax(h·Wᵀ / T) at the labels (and the entropy of softmax(h·Wᵀ), as a value
    only), ``size`` tokens at a time. Saves the hidden states and one normaliser per token;
    the backward pass recomputes each chunk's logits once, ∂logp/∂z = (onehot − softmax(z/T)) / T,
    and adds the chunks' weight gradients up in one buffer (as separate autograd nodes each
    chunk's took a copy and an addition of the whole head: 3 % of W1's update). With ``keep``
    it saves softmax(z/T) itself instead."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, temperature, with_entropy, size, keep):
        logps, saved, entropies = [], [], []
        for start in range(0, len(hidden), size):
            logits = hidden[start:start + size] @ weight.t()
            stats = functools.partial(_stats, keep=True) if keep else _stats_of(logits)
            logp, kept, entropy = stats(logits, labels[start:start + size], temperature, with_entropy)
            logps.append(logp)
            saved.append(kept)
            entropies.append(entropy)
        ctx.temperature, ctx.size, ctx.keep = temperature, size, keep
        ctx.save_for_backward(hidden, weight, labels, torch.cat(saved))
        entropy = torch.cat(entropies)
        ctx.mark_non_differentiable(entropy)
        return torch.cat(logps), entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, labels, saved = ctx.saved_tensors
        grad_hidden, grad_weight = torch.empty_like(hidden), None
        for start in range(0, len(hidden), ctx.size):
            end = start + ctx.size
            h, y, g = hidden[start:end], labels[start:end], grad_logp[start:end]
            if ctx.keep:
                g = g.float() / ctx.temperature
                grad = (saved[start:end] * -g[:, None]).scatter_add_(-1, y[:, None], g[:, None]).to(hidden.dtype)
            else:
                logits = h @ weight.t()
                grad = _grad_of(logits)(logits, saved[start:end], y, g, ctx.temperature)
            torch.mm(grad, weight, out=grad_hidden[start:end])
            if ctx.needs_input_grad[1]:
                grad_weight = grad.t() @ h if grad_weight is None else grad_weight.addmm_(grad.t(), h)
        return grad_hidden, grad_weight, None, None, None, None, None


def forward_micro_batch(t) -> int:
    """Samples per no-grad forward: with no activations kept for a backward pass, larger
    micro-batches fit and keep the GPU busier (1.3x on W1's log-prob pass at 4x)."""
    return t.forward_micro_batch_size or 4 * t.micro_batch_size


@torch.no_grad()
def batched(fn, batch: Batch, micro: int) -> torch.Tensor:
    """``fn`` over micro-batches of ``batch``, concatenated."""
    return torch.cat([fn(batch.select(index)) for index in chunks(len(batch), micro)])
