"""SDPA that reads grouped-query key heads in place on the CPU: ``rlx_sdpa``.

Given a mask, transformers' SDPA path copies each key and value head once for every query
head that shares it (CUDA's kernels take grouped heads only without a mask), and the
backward pass sums the copies back. PyTorch's CPU kernel takes grouped heads with a mask,
so there the copies go: 3.5 % of W0's update, a padded batch of a model with two query
heads per key head. Everywhere else this is transformers' SDPA, which
``model.attn_implementation=auto`` picks off the CPU.
"""

from __future__ import annotations

import torch

NAME = "rlx_sdpa"


def register() -> None:
    """Make ``rlx_sdpa`` an attention implementation transformers can load a model with."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
              **kwargs):
    """query [B, H, Q, D], key/value [B, H_kv, K, D] -> ([B, Q, H, D], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if attention_mask is None or query.device.type != "cpu" or key.shape[1] == query.shape[1]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None
