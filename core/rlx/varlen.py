"""Attention over packed rows on CUDA without flash-attn installed: ``rlx_varlen``.

A packed row lays several samples end to end, positions restarting at 0 for each.
transformers keeps attention within each sample either with flash-attn's variable-length
kernel or, under SDPA, with a dense block-diagonal mask over the whole row: quadratic in
the row's length, so a micro-batch of 16 W1 samples packed would attend over 16 times the
pairs it needs. This implementation runs PyTorch's own flash kernel for variable lengths
(``aten._flash_attention_forward``) on packed forwards and plain SDPA on every other call, and
is what ``model.attn_implementation=auto`` picks on CUDA for text models when flash-attn is
not installed.

Packed callers pass ``cu_seq_lens_q`` (``packed_kwargs``), which transformers hands down to
the attention function; a mask-free row of one sample, or a packed row given without them,
is found from its positions. A row whose samples share their prompts
(``rlx.workers.forward``) also passes ``key_index``: each query segment then attends to
its own run of keys, the row's keys gathered in that order (a response's run is its prompt's
keys, then its own), causal from the end of the run.
"""

from __future__ import annotations

import torch

NAME = "rlx_varlen"


def available(device: torch.device | str) -> bool:
    """Whether torch's flash kernel runs on ``device``: CUDA of compute capability 8.0 or
    newer (older cards raise at the first packed forward)."""
    device = torch.device(device)
    return device.type == "cuda" and torch.cuda.is_available() and hasattr(torch.ops.aten, "_flash_attention_forward") \
        and torch.cuda.get_device_capability(device) >= (8, 0)


def register() -> None:
    """Make ``rlx_varlen`` an attention implementation transformers can load a model with."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    def mask(*args, attention_mask=None, **kwargs):
        # no padding: causal, or packed (the attention finds the samples); else SDPA's mask
        return None if attention_mask is None else sdpa_mask(*args, attention_mask=attention_mask, **kwargs)

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, mask)
    _count_grouped_heads()


def _count_grouped_heads() -> None:
    """Let torch's FLOP count of the flash kernel take grouped key heads, as torch 2.12 does.

    A compiled layer's partitioner counts FLOPs to pick what to recompute in the backward
    pass (under ``training.compile_memory`` below 1); before 2.12 the count raised when keys
    had fewer heads than queries. Grouped heads do the work of as many heads as the query's.
    """
    from torch.utils.flop_counter import flop_registry

    op = torch.ops.aten._flash_attention_forward
    count = flop_registry.get(op)
    if count is None or getattr(count, "takes_groups", False):
        return
    cu = torch.zeros(2, dtype=torch.int32, device="meta")
    try:
        count(torch.empty(3, 4, 8, device="meta"), *[torch.empty(3, 2, 8, device="meta")] * 2, cu, cu, 3, 3)
        return  # this torch counts them
    except AssertionError:
        pass

    def grouped(query, key, value, *args, **kwargs) -> int:
        heads = query.shape[-2]
        key, value = (torch.empty(*t.shape[:-2], heads, t.shape[-1], device="meta") for t in (key, value))
        return count(query, key, value, *args, **kwargs)

    grouped.takes_groups = True
    flop_registry[op] = grouped


def packed_kwargs(position_ids: torch.Tensor) -> dict:
    """The sample boundaries of packed rows ``[1, T]`` as transformers' flash kwargs."""
    starts = (position_ids.flatten() == 0).nonzero().flatten()
    total = torch.tensor([position_ids.numel()], device=starts.device)
    cu = torch.cat([starts, total]).int()
    longest = int((cu[1:] - cu[:-1]).max())
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}


def attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
              cu_seq_lens_q=None, max_length_q=None, position_ids=None, key_index=None, cu_seq_lens_k=None,
              max_length_k=None, **kwargs):
    """query [1, H, T, D], key/value [1, H_kv, T, D] -> ([1, T, H, D], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    causal = getattr(module, "is_causal", True)
    if key_index is not None:  # a row of shared prompts: each segment's keys gathered after one another
        key, value = key.index_select(2, key_index), value.index_select(2, key_index)
    else:
        cu_seq_lens_k, max_length_k = cu_seq_lens_q, max_length_q
    if query.shape[0] != 1:  # not a packed row
        cu_seq_lens_q = None
    elif cu_seq_lens_q is None and attention_mask is None and causal \
            and position_ids is not None and query.shape[2] > 1 and query.shape[2] == position_ids.shape[-1]:
        found = packed_kwargs(position_ids[0] if position_ids.dim() == 3 else position_ids)
        if len(found["cu_seq_lens_q"]) > 2:
            cu_seq_lens_q, max_length_q = found["cu_seq_lens_q"], found["max_length_q"]
            cu_seq_lens_k, max_length_k = cu_seq_lens_q, max_length_q
    if cu_seq_lens_q is None or not causal or dropout or query.dtype not in (torch.float16, torch.bfloat16):
        if cu_seq_lens_q is not None:  # packed, but not for the flash kernel (float32, dropout): sample by sample
            return _by_sample(module, query, key, value, cu_seq_lens_q, cu_seq_lens_k, dropout, scaling, causal)
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    out = _varlen(query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1),
                  cu_seq_lens_q.int(), cu_seq_lens_k.int(), int(max_length_q), int(max_length_k), scaling)
    return out[None], None


def _varlen(q, k, v, cu_q, cu_k, longest_q: int, longest_k: int, scale: float | None):
    """q [T, H, D], k/v [T_k, H_kv, D] through torch's variable-length flash kernel, causal
    (from the end of each key segment where it is longer than its queries').

    The aten op itself rather than ``torch.nn.attention.varlen``: it takes grouped key heads
    as they are (the wrapper repeated them before torch 2.12), and a compiled layer's
    partitioner knows it as attention, to keep for the backward pass; the wrapper's custom
    op looked free to recompute, and ran twice in every layer.
    """
    return torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_k, longest_q, longest_k, 0.0, True, False,
                                                   scale=scale)[0]


def _by_sample(module, query, key, value, cu_q, cu_k, dropout, scaling, causal):
    """The packed row's segments one at a time through SDPA (float32 on CUDA, say); a
    segment with more keys than queries is causal from the end of its keys, as the flash
    kernel is."""
    import torch.nn.functional as F

    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    parts, cu_q, cu_k = [], cu_q.tolist(), cu_k.tolist()
    for q0, q1, k0, k1 in zip(cu_q, cu_q[1:], cu_k, cu_k[1:]):
        mask = None
        if causal and k1 - k0 != q1 - q0:
            mask = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool, device=query.device).tril(k1 - k0 - (q1 - q0))
        parts.append(F.scaled_dot_product_attention(
            query[:, :, q0:q1], key[:, :, k0:k1], value[:, :, k0:k1], attn_mask=mask, is_causal=causal and mask is None,
            dropout_p=dropout if module.training else 0.0, scale=scaling))
    return torch.cat(parts, 2).transpose(1, 2).contiguous(), None
