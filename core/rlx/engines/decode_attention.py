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


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                     valid: torch.Tensor, column: torch.Tensor, span: int, scale: float, source: torch.Tensor,
                     width: torch.Tensor, *, block: int = 32, warps: int = 2, stages: int = 3) -> torch.Tensor:
    """Write this step's key and value ``k``/``v`` into each row's cache column ``column[r]``
    and return softmax(q·Kᵀ·scale)·V over the row's cache columns ``[:span]`` that are
    ``valid`` and not past its column.

    Row r reads its first ``width[r]`` columns (its prompt) from row ``source[r]``, a row
    with the same prompt: the n samples of a prompt then read one copy of its keys and
    values, which their programs, launched side by side, find in L2 rather than each
    fetching its own from memory.

    ``q`` is [b, kv_heads, groups, d]; ``k``/``v`` [b, kv_heads, 1, d]; ``keys``/``values``
    [rows ≥ b, kv_heads, length, d] with the head dimension contiguous; ``valid`` [rows,
    length] bool; ``column``, ``width`` and ``source`` [rows ≥ b]. Returns [b, kv_heads,
    groups, d] in ``q``'s dtype. The new key and value are attended from registers, so the
    write needs no kernel of its own and no ordering against the reads. ``block`` columns
    are read per iteration by ``warps`` warps, ``stages`` iterations in flight
    (benchmarks/decode_attention_check.py compares settings).
    """
    b, kv_heads, groups, d = q.shape
    k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (k, v))
    out = torch.empty_like(q)
    _decode[(b, kv_heads)](
        q, k, v, keys, values, valid, column, source, width, out, scale, span,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        keys.stride(0), keys.stride(1), keys.stride(2), values.stride(0), values.stride(1), values.stride(2),
        valid.stride(0), out.stride(0), out.stride(1), out.stride(2),
        GROUPS=groups, GROUPS_PAD=max(16, triton.next_power_of_2(groups)), D=d, BLOCK=block,
        num_warps=warps, num_stages=stages)
    return out


if triton is not None:
    @triton.jit
    def _decode(Q, Knew, Vnew, K, V, Valid, Column, Source, Width, Out, scale, span,
                sqb, sqh, sqg, snkb, snkh, snvb, snvh, skb, skh, skn, svb, svh, svn, smb, sob, soh, sog,
                GROUPS: tl.constexpr, GROUPS_PAD: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr):
        row, head = tl.program_id(0), tl.program_id(1)
        g, d = tl.arange(0, GROUPS_PAD), tl.arange(0, D)
        q = tl.load(Q + row * sqb + head * sqh + g[:, None] * sqg + d[None, :], mask=g[:, None] < GROUPS, other=0.0)
        last, width, source = tl.load(Column + row), tl.load(Width + row), tl.load(Source + row)
        k_new = tl.load(Knew + row * snkb + head * snkh + d)
        v_new = tl.load(Vnew + row * snvb + head * snvh + d)
        tl.store(K + row * skb + head * skh + last * skn + d, k_new)
        tl.store(V + row * svb + head * svh + last * svn + d, v_new)
        m = tl.full([GROUPS_PAD], float("-inf"), tl.float32)
        total = tl.zeros([GROUPS_PAD], tl.float32)
        acc = tl.zeros([GROUPS_PAD, D], tl.float32)
        # the columns before this step's (its own key and value are in registers): a row
        # reads no further, however far the span its graph was captured for reaches
        seen = tl.minimum(last, span)
        for start in range(0, seen, BLOCK):
            n = start + tl.arange(0, BLOCK)
            inside = n < seen
            ok = inside & (tl.load(Valid + row * smb + n, mask=inside, other=0) != 0)
            owner = tl.where(n < width, source, row)  # whose copy of each column is read
            k = tl.load(K + owner[:, None] * skb + head * skh + n[:, None] * skn + d[None, :], mask=inside[:, None],
                        other=0.0)
            s = tl.dot(q, tl.trans(k)) * scale
            s = tl.where(ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            # a row whose columns so far are all masked (prompt padding) has no maximum yet
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m - m_safe)
            p = tl.exp(s - m_safe[:, None])
            total = total * alpha + tl.sum(p, 1)
            v = tl.load(V + owner[:, None] * svb + head * svh + n[:, None] * svn + d[None, :], mask=inside[:, None],
                        other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m = m_new
        # this step's column, always valid
        s_new = tl.sum(q.to(tl.float32) * k_new.to(tl.float32)[None, :], 1) * scale
        m_new = tl.maximum(m, s_new)
        alpha = tl.exp(m - m_new)
        p_new = tl.exp(s_new - m_new)
        total = total * alpha + p_new
        acc = acc * alpha[:, None] + p_new[:, None] * v_new.to(tl.float32)[None, :]
        out = acc / total[:, None]
        tl.store(Out + row * sob + head * soh + g[:, None] * sog + d[None, :], out.to(Out.dtype.element_ty),
                 mask=g[:, None] < GROUPS)
