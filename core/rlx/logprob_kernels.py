"""The output head's softmax arithmetic over a chunk of logits, as Triton kernels (CUDA only):
each token's log-prob under softmax(z / T) at its label, the normaliser logsumexp(z / T)
and the entropy of softmax(z); and the gradient g·(onehot − softmax(z / T)) / T.

torch.compile's kernels for the same took 0.74 ms for the sums (with the entropy) and 0.45 ms
for the gradient over a chunk of W1's bf16 logits (883 tokens × 151,936) on an H100: the
reduction made several passes over a row, one program per row. Here every (row, block)
program reads its block once, all of them side by side, and a second kernel adds up each
row's blocks: 0.12 ms and 0.19 ms (benchmarks/head_kernels_check.py).
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU build of torch comes without Triton
    triton = None

BLOCK = 4096


def supported(device: torch.device) -> bool:
    return triton is not None and device.type == "cuda"


def stats(logits: torch.Tensor, labels: torch.Tensor, temperature: float, with_entropy: bool, *,
          block: int = BLOCK, warps: int = 8) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log softmax(z / T) at ``labels``, logsumexp(z / T), the entropy of softmax(z) or an
    empty tensor), each [rows] float32, from ``logits`` [rows, vocab] in any float dtype."""
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    rows, vocab = logits.shape
    labels = labels.contiguous()
    blocks = triton.cdiv(vocab, block)
    # the entropy is of the untempered logits: at T ≠ 1 it needs sums of its own
    untempered = with_entropy and temperature != 1
    # per row and block: the largest z / T, Σ exp(z / T − it), and for the entropy Σ exp(…)·z
    # (with T ≠ 1 the same three for z itself)
    partial = torch.empty(6 if untempered else 3, rows, blocks, dtype=torch.float32, device=logits.device)
    _block_stats[(rows, blocks)](logits, partial, vocab, logits.stride(0), rows * blocks, blocks, temperature,
                                 ENTROPY=with_entropy, UNTEMPERED=untempered, BLOCK=block, num_warps=warps)
    logp = torch.empty(rows, dtype=torch.float32, device=logits.device)
    lse = torch.empty_like(logp)
    entropy = torch.empty_like(logp) if with_entropy else logp.new_empty(0)
    _combine[(rows,)](logits, labels, partial, logp, lse, entropy, logits.stride(0), rows * blocks, blocks,
                      temperature, ENTROPY=with_entropy, UNTEMPERED=untempered,
                      BLOCKS=triton.next_power_of_2(blocks), num_warps=1)
    return logp, lse, entropy


def logits_grad(logits: torch.Tensor, lse: torch.Tensor, labels: torch.Tensor, grad_logp: torch.Tensor,
                temperature: float, *, out: torch.Tensor | None = None, block: int = BLOCK,
                warps: int = 8) -> torch.Tensor:
    """∂(Σ g·logp)/∂z = g·(onehot − exp(z / T − lse)) / T in the logits' dtype, written into
    ``out`` (which may be ``logits`` itself: each element is read before it is written)."""
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    rows, vocab = logits.shape
    lse, labels, grad_logp = lse.contiguous(), labels.contiguous(), grad_logp.contiguous()
    out = torch.empty_like(logits) if out is None else out
    _grad[(rows, triton.cdiv(vocab, block))](logits, lse, labels, grad_logp, out, vocab, logits.stride(0),
                                             out.stride(0), temperature, BLOCK=block, num_warps=warps)
    return out


if triton is not None:
    @triton.jit
    def _block_stats(Logits, Partial, vocab, stride, plane, blocks, temperature,
                     ENTROPY: tl.constexpr, UNTEMPERED: tl.constexpr, BLOCK: tl.constexpr):
        row, block = tl.program_id(0), tl.program_id(1)
        cols = block * BLOCK + tl.arange(0, BLOCK)
        inside = cols < vocab
        z = tl.load(Logits + row.to(tl.int64) * stride + cols, mask=inside, other=float("-inf")).to(tl.float32)
        s = z / temperature
        top = tl.max(s, 0)
        weight = tl.exp(s - top)
        at = Partial + row * blocks + block
        tl.store(at, top)
        tl.store(at + plane, tl.sum(weight, 0))
        if ENTROPY:
            if UNTEMPERED:
                top = tl.max(z, 0)
                weight = tl.exp(z - top)
                tl.store(at + 3 * plane, top)
                tl.store(at + 4 * plane, tl.sum(weight, 0))
                tl.store(at + 5 * plane, tl.sum(tl.where(inside, weight * z, 0.0), 0))
            else:
                tl.store(at + 2 * plane, tl.sum(tl.where(inside, weight * z, 0.0), 0))

    @triton.jit
    def _combine(Logits, Labels, Partial, Logp, Lse, Entropy, stride, plane, blocks, temperature,
                 ENTROPY: tl.constexpr, UNTEMPERED: tl.constexpr, BLOCKS: tl.constexpr):
        row = tl.program_id(0)
        index = tl.arange(0, BLOCKS)
        real = index < blocks
        at = Partial + row * blocks + index
        tops = tl.load(at, mask=real, other=float("-inf"))
        top = tl.max(tops, 0)
        scale = tl.where(real, tl.exp(tops - top), 0.0)
        total = tl.sum(tl.load(at + plane, mask=real, other=0.0) * scale, 0)
        lse = top + tl.log(total)
        label = tl.load(Labels + row)
        z = tl.load(Logits + row.to(tl.int64) * stride + label).to(tl.float32)
        tl.store(Lse + row, lse)
        tl.store(Logp + row, z / temperature - lse)
        if ENTROPY:
            if UNTEMPERED:
                tops = tl.load(at + 3 * plane, mask=real, other=float("-inf"))
                top = tl.max(tops, 0)
                scale = tl.where(real, tl.exp(tops - top), 0.0)
                total = tl.sum(tl.load(at + 4 * plane, mask=real, other=0.0) * scale, 0)
                weighted = tl.sum(tl.load(at + 5 * plane, mask=real, other=0.0) * scale, 0)
                tl.store(Entropy + row, top + tl.log(total) - weighted / total)
            else:
                weighted = tl.sum(tl.load(at + 2 * plane, mask=real, other=0.0) * scale, 0)
                tl.store(Entropy + row, lse - weighted / total)

    @triton.jit
    def _grad(Logits, Lse, Labels, Grad, Out, vocab, stride, out_stride, temperature, BLOCK: tl.constexpr):
        row, block = tl.program_id(0), tl.program_id(1)
        cols = block * BLOCK + tl.arange(0, BLOCK)
        inside = cols < vocab
        z = tl.load(Logits + row.to(tl.int64) * stride + cols, mask=inside, other=0.0).to(tl.float32)
        g = tl.load(Grad + row).to(tl.float32) / temperature
        onehot = (cols == tl.load(Labels + row)).to(tl.float32)
        grad = (onehot - tl.exp(z / temperature - tl.load(Lse + row))) * g
        tl.store(Out + row.to(tl.int64) * out_stride + cols, grad.to(Out.dtype.element_ty), mask=inside)
