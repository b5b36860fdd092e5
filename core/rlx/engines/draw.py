"""Sampling a decode step's next tokens in two Triton kernels (CUDA only).

Each row's token is drawn through the cumulative distribution of softmax(z / T) with one
uniform for the row, as the CPU draws (``static_decode._inverse_cdf``). The exponential
race drawn in PyTorch wrote a float32 uniform for every row and token and took two
logarithms of each: on W1 (512 rows × 151,936 tokens) the draw and the race took 0.37 ms
of a 3.6 ms decode step. Here the logits are read once for each block's maximum and sums,
and one block of each row again for the token, with no per-token random numbers or
logarithms. The uniform comes from Philox keyed by a seed drawn on the GPU each call, so a
CUDA graph replays a fresh draw.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU build of torch comes without Triton
    triton = None


def supported(device: torch.device) -> bool:
    return triton is not None and device.type == "cuda"


def draw(logits: torch.Tensor, temperature: float, generator: torch.Generator | None,
         banned: torch.Tensor | None = None, *, block: int = 2048, warps: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's token drawn from softmax(logits / T) and its log-prob under it. ``banned``
    ids are never drawn but stay in the log-prob's normaliser (as top-k would leave them).
    Returns (tokens [rows] int64, log-probs [rows] float32).

    Two kernels: one program per row and block of ``block`` tokens sums the block's
    weights (every program at once, so the logits stream at the memory's rate); then one
    program per row finds the block its uniform falls in from those sums and reads only
    that block again for the token."""
    if logits.stride(1) != 1:  # the kernels read each row's logits contiguously
        logits = logits.contiguous()
    rows, vocab = logits.shape
    blocks = triton.cdiv(vocab, block)
    # one seed per call from the generator: replayed graphs and seeded runs draw afresh
    seed = torch.randint(0, 2**31 - 1, (1,), device=logits.device, generator=generator)
    allowed = logits.new_zeros(0, dtype=torch.bool)
    if banned is not None:
        allowed = torch.ones(vocab, dtype=torch.bool, device=logits.device).index_fill_(0, banned, False)
    # per row and block: the largest z / T, and the sums of exp(z / T − it) over all and over drawable tokens
    stats = torch.empty(3, rows, blocks, dtype=torch.float32, device=logits.device)
    _block_sums[(rows, blocks)](logits, allowed, stats[0], stats[1], stats[2], vocab, logits.stride(0), blocks,
                                1.0 / temperature, BANNED=banned is not None, BLOCK=block, num_warps=warps)
    tokens = torch.empty(rows, dtype=torch.int64, device=logits.device)
    logprobs = torch.empty(rows, dtype=torch.float32, device=logits.device)
    _pick[(rows,)](logits, allowed, stats[0], stats[1], stats[2], seed, tokens, logprobs, vocab, logits.stride(0),
                   blocks, 1.0 / temperature, BANNED=banned is not None, BLOCK=block,
                   BLOCKS=triton.next_power_of_2(blocks), num_warps=warps)
    return tokens, logprobs


if triton is not None:
    @triton.jit
    def _block_sums(Logits, Allowed, Top, Total, Drawable, vocab, stride, blocks, inverse_temperature,
                    BANNED: tl.constexpr, BLOCK: tl.constexpr):
        row, block = tl.program_id(0), tl.program_id(1)
        cols = block * BLOCK + tl.arange(0, BLOCK)
        inside = cols < vocab
        z = tl.load(Logits + row * stride + cols, mask=inside, other=float("-inf")).to(tl.float32) * inverse_temperature
        top = tl.max(z, 0)
        weight = tl.exp(z - tl.where(top == float("-inf"), 0.0, top))  # a block of -inf: weights 0
        tl.store(Top + row * blocks + block, top)
        tl.store(Total + row * blocks + block, tl.sum(weight, 0))
        if BANNED:
            weight = tl.where(tl.load(Allowed + cols, mask=inside, other=0) != 0, weight, 0.0)
        tl.store(Drawable + row * blocks + block, tl.sum(weight, 0))

    @triton.jit
    def _pick(Logits, Allowed, Top, Total, Drawable, Seed, Tokens, Logprobs, vocab, stride, blocks,
              inverse_temperature, BANNED: tl.constexpr, BLOCK: tl.constexpr, BLOCKS: tl.constexpr):
        row = tl.program_id(0)
        logits = Logits + row * stride
        # the row's blocks, their sums brought to the row's largest z / T
        index = tl.arange(0, BLOCKS)
        real = index < blocks
        tops = tl.load(Top + row * blocks + index, mask=real, other=float("-inf"))
        top = tl.max(tops, 0)
        shift = tl.where(top == float("-inf"), 0.0, top)
        scale = tl.where(tops == float("-inf"), 0.0, tl.exp(tops - shift))
        total = tl.sum(tl.load(Total + row * blocks + index, mask=real, other=0.0) * scale, 0)
        drawable = tl.load(Drawable + row * blocks + index, mask=real, other=0.0) * scale
        # one uniform in (0, 1) for the row, from the top 24 of Philox's bits
        uniform = ((tl.randint(tl.load(Seed), row) >> 8).to(tl.float32) + 0.5) * 5.9604644775390625e-08
        target = uniform * tl.sum(drawable, 0)
        # the block whose running sum first reaches the target (or, should rounding leave the
        # sums short of it, the last block with a drawable token)
        running = tl.cumsum(drawable, 0)
        chosen = tl.min(tl.where((running >= target) & (drawable > 0), index, BLOCKS), 0)
        chosen = tl.where(chosen < BLOCKS, chosen, tl.max(tl.where(drawable > 0, index, -1), 0))
        chosen = tl.maximum(chosen, 0)  # only if every token is banned
        before = tl.sum(tl.where(index < chosen, drawable, 0.0), 0)
        # in that block, the first token whose running sum reaches the target (or its last drawable one)
        cols = chosen * BLOCK + tl.arange(0, BLOCK)
        inside = cols < vocab
        z = tl.load(logits + cols, mask=inside, other=float("-inf")).to(tl.float32) * inverse_temperature
        weight = tl.exp(z - shift)
        if BANNED:
            weight = tl.where(tl.load(Allowed + cols, mask=inside, other=0) != 0, weight, 0.0)
        reached = ((before + tl.cumsum(weight, 0)) >= target) & (weight > 0)
        token = tl.min(tl.where(reached, cols, vocab), 0)
        token = tl.where(token < vocab, token, tl.max(tl.where(weight > 0, cols, -1), 0))
        token = tl.maximum(token, 0)
        z = tl.load(logits + token).to(tl.float32) * inverse_temperature
        tl.store(Tokens + row, token.to(tl.int64))
        tl.store(Logprobs + row, z - top - tl.log(total))
