"""Grouped-query attention for one decode step, as a Triton kernel (CUDA only).

A decode step's query is one token, so attention is a pass over the cached keys and
values, bound by memory. SDPA's kernels tile for many query rows: on W1 (512 rows, 2 KV
heads of 7 query heads each) cuDNN's took 2.1 ms of a 4.5 ms step at a 640-column span,
about a quarter of the card's bandwidth. Here one program holds the query heads of one KV
head of one row and streams that head's keys and values once, with an online softmax.

The n samples of a prompt hold the same keys and values over its columns: a first kernel
reads them once for all of the samples' query heads, and the decode kernel goes on from
there (on W1, 8 samples of a 128-token prompt, that is 7/8 of the prompt's reads saved).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU build of torch comes without Triton
    triton = None


# the prompt kernel's tile of query rows (a prompt's samples × their heads) × head size at most:
# 128 rows at head size 64, its float32 sums 32 KB a program, as for 64 rows at 128
TILE_ELEMENTS = 128 * 64


def supported(head_dim: int, groups: int, device: torch.device) -> bool:
    """Whether the kernel runs here: CUDA with Triton, a power-of-two head size of 16-256."""
    return (triton is not None and device.type == "cuda" and head_dim in (16, 32, 64, 128, 256)
            and groups <= 64)


def samples_per_tile(groups: int, head_dim: int) -> int:
    """How many samples of a prompt the prompt kernel serves from one read of its columns:
    as many as fit a tile of ``TILE_ELEMENTS`` with their ``groups`` query heads each (1:
    the decode kernel alone)."""
    return max(1, TILE_ELEMENTS // head_dim // groups)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     keys: torch.Tensor, values: torch.Tensor, valid: torch.Tensor, column: torch.Tensor, span: int,
                     scale: float, width: torch.Tensor, members: torch.Tensor | None = None, *, block: int = 32,
                     warps: int = 2, stages: int = 3, prompt_block: int = 64, prompt_warps: int = 4) -> torch.Tensor:
    """Turn this step's query and key heads ``q``/``k`` by the rotary embedding (``cos``,
    ``sin`` [b, d], each row's, as x·cos + rotate_half(x)·sin), write the key and the value
    ``v`` into each row's cache column ``column[r]`` and return softmax(q·Kᵀ·scale)·V over
    the row's cache columns ``[:span]`` that are ``valid`` and not past its column. The
    turn happens as the heads are loaded: no kernel of its own (two a layer, compiled).

    With ``members`` [rows, m], the samples of a prompt read its columns once: row r's
    first ``width[r]`` columns are its prompt, and a row that leads its prompt's samples
    lists them (itself first, then -1 for none; a row that does not lead starts with -1).
    A first kernel reads each leader's prompt columns once for the query heads of all the
    samples it lists, stacked into one tile, and leaves each row's softmax state (maximum,
    sum, weighted values) in float32; the decode kernel starts from that state and reads
    only the columns the row decoded. Every row the decode kernel attends for must be
    listed by a leader. Without ``members`` each row reads all of its own columns.

    ``q`` is [b, kv_heads, groups, d]; ``k``/``v`` [b, kv_heads, 1, d]; ``keys``/``values``
    [rows ≥ b, kv_heads, length, d] with the head dimension contiguous; ``valid`` [rows,
    length] bool; ``column`` and ``width`` [rows ≥ b]. Returns [b, kv_heads, groups, d] in
    ``q``'s dtype. The new key and value are attended from registers, so the write needs no
    kernel of its own and no ordering against the reads. ``block`` columns are read per
    iteration by ``warps`` warps, ``stages`` iterations in flight; the prompt kernel reads
    ``prompt_block`` columns with ``prompt_warps`` warps
    (benchmarks/decode_attention_check.py compares settings).
    """
    b, kv_heads, groups, d = q.shape
    k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (k, v))
    out = torch.empty_like(q)
    pad = max(16, triton.next_power_of_2(groups))
    shared = members is not None
    if shared:  # each row's softmax state over its prompt columns
        most = torch.empty(b, kv_heads, pad, device=q.device, dtype=torch.float32)
        total = torch.empty_like(most)
        acc = torch.empty(b, kv_heads, pad, d, device=q.device, dtype=torch.float32)
        per_tile = members.shape[1]
        _prompt[(b, kv_heads)](
            q, cos, sin, keys, values, valid, width, members, most, total, acc, scale,
            q.stride(0), q.stride(1), q.stride(2), cos.stride(0), sin.stride(0),
            keys.stride(0), keys.stride(1), keys.stride(2), values.stride(0), values.stride(1), values.stride(2),
            valid.stride(0), members.stride(0),
            most.stride(0), most.stride(1), acc.stride(0), acc.stride(1), acc.stride(2),
            GROUPS=groups, MEMBERS=per_tile, TILE=max(16, triton.next_power_of_2(per_tile * groups)), D=d,
            BLOCK=prompt_block, num_warps=prompt_warps, num_stages=2)
    else:  # unused pointers
        most = total = acc = out
    _decode[(b, kv_heads)](
        q, k, v, cos, sin, keys, values, valid, column, width, most, total, acc, out, scale, span,
        q.stride(0), q.stride(1), q.stride(2), cos.stride(0), sin.stride(0),
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        keys.stride(0), keys.stride(1), keys.stride(2), values.stride(0), values.stride(1), values.stride(2),
        valid.stride(0), most.stride(0), most.stride(1), acc.stride(0), acc.stride(1), acc.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        GROUPS=groups, GROUPS_PAD=pad, D=d, BLOCK=block, PROMPT_DONE=shared, num_warps=warps, num_stages=stages)
    return out


if triton is not None:
    @triton.jit
    def _online(q, k, v, ok, m, total, acc, scale):
        """One block of columns folded into a running softmax: scores of the query rows
        ``q`` against keys ``k``, masked where not ``ok``; returns the new maximum, sum and
        weighted values."""
        s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where(ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        # a row whose columns so far are all masked (prompt padding) has no maximum yet
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - m_safe)
        p = tl.exp(s - m_safe[:, None])
        return m_new, total * alpha + tl.sum(p, 1), acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)

    @triton.jit
    def _columns(q, K, V, Valid, row, head, start, end, m, total, acc, scale,
                 skb, skh, skn, svb, svh, svn, smb, D: tl.constexpr, BLOCK: tl.constexpr):
        """Row ``row``'s cache columns ``[start, end)`` of KV head ``head``, ``BLOCK`` at a time,
        folded into the running softmax of the query rows ``q``."""
        d = tl.arange(0, D)
        for first in range(start, end, BLOCK):
            n = first + tl.arange(0, BLOCK)
            inside = n < end
            ok = inside & (tl.load(Valid + row * smb + n, mask=inside, other=0) != 0)
            k = tl.load(K + row * skb + head * skh + n[:, None] * skn + d[None, :], mask=inside[:, None], other=0.0)
            v = tl.load(V + row * svb + head * svh + n[:, None] * svn + d[None, :], mask=inside[:, None], other=0.0)
            m, total, acc = _online(q, k, v, ok, m, total, acc, scale)
        return m, total, acc

    @triton.jit
    def _turned(X, offsets, d, cos, sin, D: tl.constexpr, mask):
        """The heads at ``X + offsets + d`` turned by the rotary embedding: x·cos +
        rotate_half(x)·sin, where rotate_half(x) is (-x[D/2:], x[:D/2]); in X's dtype."""
        partner = (d + D // 2) % D
        x = tl.load(X + offsets + d, mask=mask, other=0.0).to(tl.float32)
        other = tl.load(X + offsets + partner, mask=mask, other=0.0).to(tl.float32)
        other = tl.where(d < D // 2, -other, other)
        return (x * cos + other * sin).to(X.dtype.element_ty)

    @triton.jit
    def _prompt(Q, Cos, Sin, K, V, Valid, Width, Members, Most, Total, Acc, scale,
                sqb, sqh, sqg, scb, ssnb, skb, skh, skn, svb, svh, svn, smb, seb, ssb, ssh, sab, sah, sag,
                GROUPS: tl.constexpr, MEMBERS: tl.constexpr, TILE: tl.constexpr, D: tl.constexpr,
                BLOCK: tl.constexpr):
        row, head = tl.program_id(0), tl.program_id(1)
        if tl.load(Members + row * seb) < 0:  # not a leader
            return
        # tile row t is query head t % GROUPS of the (t // GROUPS)-th sample listed
        t, d = tl.arange(0, TILE), tl.arange(0, D)
        member = t // GROUPS
        g = t % GROUPS
        slot = tl.load(Members + row * seb + member, mask=member < MEMBERS, other=-1)
        real = slot >= 0
        slot = tl.where(real, slot, 0)
        cos = tl.load(Cos + slot[:, None] * scb + d[None, :]).to(tl.float32)
        sin = tl.load(Sin + slot[:, None] * ssnb + d[None, :]).to(tl.float32)
        q = _turned(Q, slot[:, None] * sqb + head * sqh + g[:, None] * sqg, d[None, :], cos, sin, D, real[:, None])
        width = tl.load(Width + row)
        m = tl.full([TILE], float("-inf"), tl.float32)
        total = tl.zeros([TILE], tl.float32)
        acc = tl.zeros([TILE, D], tl.float32)
        m, total, acc = _columns(q, K, V, Valid, row, head, 0, width, m, total, acc, scale,
                                 skb, skh, skn, svb, svh, svn, smb, D, BLOCK)
        state = slot * ssb + head * ssh + g
        tl.store(Most + state, m, mask=real)
        tl.store(Total + state, total, mask=real)
        tl.store(Acc + slot[:, None] * sab + head * sah + g[:, None] * sag + d[None, :], acc, mask=real[:, None])

    @triton.jit
    def _decode(Q, Knew, Vnew, Cos, Sin, K, V, Valid, Column, Width, Most, Total, Acc, Out, scale, span,
                sqb, sqh, sqg, scb, ssnb, snkb, snkh, snvb, snvh, skb, skh, skn, svb, svh, svn, smb,
                ssb, ssh, sab, sah, sag, sob, soh, sog,
                GROUPS: tl.constexpr, GROUPS_PAD: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
                PROMPT_DONE: tl.constexpr):
        row, head = tl.program_id(0), tl.program_id(1)
        g, d = tl.arange(0, GROUPS_PAD), tl.arange(0, D)
        real = g < GROUPS
        cos = tl.load(Cos + row * scb + d).to(tl.float32)
        sin = tl.load(Sin + row * ssnb + d).to(tl.float32)
        q = _turned(Q, row * sqb + head * sqh + g[:, None] * sqg, d[None, :], cos[None, :], sin[None, :], D,
                    real[:, None])
        last = tl.load(Column + row)
        k_new = _turned(Knew, row * snkb + head * snkh, d, cos, sin, D, d < D)
        v_new = tl.load(Vnew + row * snvb + head * snvh + d)
        tl.store(K + row * skb + head * skh + last * skn + d, k_new)
        tl.store(V + row * svb + head * svh + last * svn + d, v_new)
        if PROMPT_DONE:  # the prompt kernel's state over the row's first width columns
            first = tl.load(Width + row)
            state = row * ssb + head * ssh + g
            m = tl.load(Most + state, mask=real, other=float("-inf"))
            total = tl.load(Total + state, mask=real, other=0.0)
            acc = tl.load(Acc + row * sab + head * sah + g[:, None] * sag + d[None, :], mask=real[:, None], other=0.0)
        else:
            first = 0
            m = tl.full([GROUPS_PAD], float("-inf"), tl.float32)
            total = tl.zeros([GROUPS_PAD], tl.float32)
            acc = tl.zeros([GROUPS_PAD, D], tl.float32)
        # the columns before this step's (its own key and value are in registers): a row
        # reads no further, however far the span its graph was captured for reaches
        seen = tl.minimum(last, span)
        m, total, acc = _columns(q, K, V, Valid, row, head, first, seen, m, total, acc, scale,
                                 skb, skh, skn, svb, svh, svn, smb, D, BLOCK)
        # this step's column, always valid
        s_new = tl.sum(q.to(tl.float32) * k_new.to(tl.float32)[None, :], 1) * scale
        m_new = tl.maximum(m, s_new)
        alpha = tl.exp(m - m_new)
        p_new = tl.exp(s_new - m_new)
        total = total * alpha + p_new
        acc = acc * alpha[:, None] + p_new[:, None] * v_new.to(tl.float32)[None, :]
        out = acc / total[:, None]
        tl.store(Out + row * sob + head * soh + g[:, None] * sog + d[None, :], out.to(Out.dtype.element_ty),
                 mask=real[:, None])
