"""Grouped-query attention for one decode step, as a Triton kernel (CUDA only).

A decode step's query is one token, so attention is a pass over the cached keys and
values, bound by memory. SDPA's kernels tile for many query rows: on W1 (512 rows, 2 KV
heads of 7 query heads each) cuDNN's took 2.1 ms of a 4.5 ms step at a 640-column span,
about a quarter of the card's bandwidth. Here one program holds the query heads of one KV
head of one row and streams that head's keys and values once, with an online softmax.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU build of torch comes without Triton
    triton = None


def supported(head_dim: int, groups: int, device: torch.device) -> bool:
    """Whether the kernel runs here: CUDA with Triton, a power-of-two head size of 16-256."""
    return (triton is not None and device.type == "cuda" and head_dim in (16, 32, 64, 128, 256)
            and groups <= 64)


def decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, valid: torch.Tensor,
                     column: torch.Tensor, span: int, scale: float, *, block: int = 64, warps: int = 2,
                     stages: int = 2) -> torch.Tensor:
    """softmax(q·Kᵀ·scale)·V over cache columns ``[:span]`` that are ``valid`` and not past
    ``column`` (a one-element tensor: the column this step wrote).

    ``q`` is [b, kv_heads, groups, d]; ``keys``/``values`` [rows ≥ b, kv_heads, length, d]
    with the head dimension contiguous; ``valid`` [rows, length] bool. Returns [b, kv_heads,
    groups, d] in ``q``'s dtype. ``block`` columns are read per iteration by ``warps`` warps,
    ``stages`` iterations in flight (benchmarks/decode_attention_check.py compares settings).
    """
    b, kv_heads, groups, d = q.shape
    out = torch.empty_like(q)
    _decode[(b, kv_heads)](
        q, keys, values, valid, column, out, scale, span,
        q.stride(0), q.stride(1), q.stride(2), keys.stride(0), keys.stride(1), keys.stride(2),
        values.stride(0), values.stride(1), values.stride(2), valid.stride(0),
        out.stride(0), out.stride(1), out.stride(2),
        GROUPS=groups, GROUPS_PAD=max(16, triton.next_power_of_2(groups)), D=d, BLOCK=block,
        num_warps=warps, num_stages=stages)
    return out


if triton is not None:
    @triton.jit
    def _decode(Q, K, V, Valid, Column, Out, scale, span,
                sqb, sqh, sqg, skb, skh, skn, svb, svh, svn, smb, sob, soh, sog,
                GROUPS: tl.constexpr, GROUPS_PAD: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr):
        row, head = tl.program_id(0), tl.program_id(1)
        g, d = tl.arange(0, GROUPS_PAD), tl.arange(0, D)
        q = tl.load(Q + row * sqb + head * sqh + g[:, None] * sqg + d[None, :], mask=g[:, None] < GROUPS, other=0.0)
        last = tl.load(Column)
        k_base, v_base = K + row * skb + head * skh, V + row * svb + head * svh
        m = tl.full([GROUPS_PAD], float("-inf"), tl.float32)
        total = tl.zeros([GROUPS_PAD], tl.float32)
        acc = tl.zeros([GROUPS_PAD, D], tl.float32)
        for start in range(0, span, BLOCK):
            n = start + tl.arange(0, BLOCK)
            inside = n < span
            ok = inside & (n <= last) & (tl.load(Valid + row * smb + n, mask=inside, other=0) != 0)
            k = tl.load(k_base + n[:, None] * skn + d[None, :], mask=inside[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k)) * scale
            s = tl.where(ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            # a row whose columns so far are all masked (prompt padding) has no maximum yet
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m - m_safe)
            p = tl.exp(s - m_safe[:, None])
            total = total * alpha + tl.sum(p, 1)
            v = tl.load(v_base + n[:, None] * svn + d[None, :], mask=inside[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m = m_new
        out = acc / total[:, None]
        tl.store(Out + row * sob + head * soh + g[:, None] * sog + d[None, :], out.to(Out.dtype.element_ty),
                 mask=g[:, None] < GROUPS)
