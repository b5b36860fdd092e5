"""Sampling a decode step's next tokens as one Triton kernel (CUDA only).

Each row's token is drawn through the cumulative distribution of softmax(z / T) with one
uniform for the row, as the CPU draws (``static_decode._inverse_cdf``). The exponential
race drawn in PyTorch wrote a float32 uniform for every row and token and took two
logarithms of each: on W1 (512 rows × 151,936 tokens) the draw and the race took 0.37 ms
of a 3.6 ms decode step. Here a program reads its row's logits once for the maximum and
the normalisers, then again only up to the drawn token (half the row on average), with no
per-token random numbers or logarithms. The uniform comes from Philox keyed by a seed drawn
on the GPU each call, so a CUDA graph replays a fresh draw.
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
         banned: torch.Tensor | None = None, *, block: int = 2048, warps: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's token drawn from softmax(logits / T) and its log-prob under it. ``banned``
    ids are never drawn but stay in the log-prob's normaliser (as top-k would leave them).
    Returns (tokens [rows] int64, log-probs [rows] float32)."""
    if logits.stride(1) != 1:  # the kernel reads each row's logits contiguously
        logits = logits.contiguous()
    rows, vocab = logits.shape
    # one seed per call from the generator: replayed graphs and seeded runs draw afresh
    seed = torch.randint(0, 2**31 - 1, (1,), device=logits.device, generator=generator)
    allowed = logits.new_zeros(0, dtype=torch.bool)
    if banned is not None:
        allowed = torch.ones(vocab, dtype=torch.bool, device=logits.device).index_fill_(0, banned, False)
    tokens = torch.empty(rows, dtype=torch.int64, device=logits.device)
    logprobs = torch.empty(rows, dtype=torch.float32, device=logits.device)
    _draw[(rows,)](logits, allowed, seed, tokens, logprobs, vocab, logits.stride(0), 1.0 / temperature,
                   BANNED=banned is not None, BLOCK=block, num_warps=warps)
    return tokens, logprobs


if triton is not None:
    @triton.jit
    def _draw(Logits, Allowed, Seed, Tokens, Logprobs, vocab, stride, inverse_temperature,
              BANNED: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        lanes = tl.arange(0, BLOCK)
        logits = Logits + row * stride
        # pass 1: the maximum of z / T, the sum of exp(z / T − maximum) over every token (the
        # log-prob's normaliser) and over the tokens that may be drawn
        top = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), 0)
        total = tl.sum(tl.zeros([BLOCK], tl.float32), 0)
        drawable = tl.sum(tl.zeros([BLOCK], tl.float32), 0)
        for start in range(0, vocab, BLOCK):
            cols = start + lanes
            inside = cols < vocab
            z = tl.load(logits + cols, mask=inside, other=float("-inf")).to(tl.float32) * inverse_temperature
            new_top = tl.maximum(top, tl.max(z, 0))
            shift = tl.where(new_top == float("-inf"), 0.0, new_top)  # no finite logit yet: the sums stay 0
            scale = tl.exp(top - shift)
            weight = tl.exp(z - shift)
            total = total * scale + tl.sum(weight, 0)
            if BANNED:
                weight = tl.where(tl.load(Allowed + cols, mask=inside, other=0) != 0, weight, 0.0)
            drawable = drawable * scale + tl.sum(weight, 0)
            top = new_top
        # one uniform in (0, 1) for the row, from the top 24 of Philox's bits
        uniform = ((tl.randint(tl.load(Seed), row) >> 8).to(tl.float32) + 0.5) * 5.9604644775390625e-08
        target = uniform * drawable
        # pass 2: the first token whose running sum of weights reaches the target, read up to it
        shift = tl.where(top == float("-inf"), 0.0, top)
        running = tl.sum(tl.zeros([BLOCK], tl.float32), 0)
        token = tl.min(tl.full([BLOCK], -1, tl.int32), 0)
        last = tl.min(tl.full([BLOCK], -1, tl.int32), 0)  # the last drawable token seen, should rounding leave the
        start = 0                                           # running sum short of the target at the row's end
        while (start < vocab) & (token < 0):
            cols = start + lanes
            inside = cols < vocab
            z = tl.load(logits + cols, mask=inside, other=float("-inf")).to(tl.float32) * inverse_temperature
            weight = tl.exp(z - shift)
            if BANNED:
                weight = tl.where(tl.load(Allowed + cols, mask=inside, other=0) != 0, weight, 0.0)
            reached = ((running + tl.cumsum(weight, 0)) >= target) & (weight > 0)
            first = tl.min(tl.where(reached, cols, vocab), 0)
            token = tl.where(first < vocab, first, token)
            last = tl.maximum(last, tl.max(tl.where(weight > 0, cols, -1), 0))
            running += tl.sum(weight, 0)
            start += BLOCK
        token = tl.maximum(tl.where(token < 0, last, token), 0)  # 0 only if every token is banned
        z = tl.load(logits + token).to(tl.float32) * inverse_temperature
        tl.store(Tokens + row, token.to(tl.int64))
        tl.store(Logprobs + row, z - top - tl.log(total))
