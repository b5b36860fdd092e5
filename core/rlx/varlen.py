"""Attention over packed rows on CUDA without flash-attn installed: ``rlx_varlen``.

A packed row lays several samples end to end, positions restarting at 0 for each.
transformers keeps attention within each sample either with flash-attn's variable-length
kernel or, under SDPA, with a dense block-diagonal mask over the whole row: quadratic in
the row's length, so a micro-batch of 16 W1 samples packed would attend over 16 times the
pairs it needs. This implementation runs PyTorch's own flash kernel for variable lengths
(``torch.nn.attention.varlen``) on packed forwards and plain SDPA on every other call, and
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

import inspect
import math

import torch

try:
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # before torch 2.10
    varlen_attn = None

NAME = "rlx_varlen"
# The kernel's keyword names, read here rather than inside a compiled layer: its signature
# grew between torch releases (``window_size`` and ``scale`` in 2.11 after ``is_causal``;
# ``enable_gqa`` later still, without which key heads are repeated).
_PARAMS = frozenset(inspect.signature(varlen_attn).parameters) if varlen_attn is not None else frozenset()


def available(device: torch.device | str) -> bool:
    return varlen_attn is not None and torch.device(device).type == "cuda"


def register() -> None:
    """Make ``rlx_varlen`` an attention implementation transformers can load a model with."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    def mask(*args, attention_mask=None, **kwargs):
        # no padding: causal, or packed (the attention finds the samples); else SDPA's mask
        return None if attention_mask is None else sdpa_mask(*args, attention_mask=attention_mask, **kwargs)

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, mask)


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
    (from the end of each key segment where it is longer than its queries')."""
    groups = q.shape[1] // k.shape[1]
    kwargs = {}
    if "enable_gqa" in _PARAMS:
        kwargs["enable_gqa"] = groups > 1
    elif groups > 1:
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    if "scale" in _PARAMS:
        kwargs["scale"] = scale
    elif scale is not None:
        q = q * (scale * math.sqrt(q.shape[-1]))
    if "window_size" in _PARAMS:
        kwargs["window_size"] = (-1, 0)
    else:
        kwargs["is_causal"] = True
    return varlen_attn(q, k, v, cu_q, cu_k, longest_q, longest_k, **kwargs)


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
