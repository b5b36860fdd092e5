"""The sampling kernels (``rlx.engines.draw``, CUDA only) run by Triton's interpreter on the
CPU: tokens drawn with their probabilities under softmax(z / T), the exact log-prob of
each, banned ids never drawn but kept in the normaliser, rows longer than a block, seeds
that repeat a draw and calls that draw afresh; and the kernels compiled for an H200."""

import json
import math
import os
import subprocess
import sys

import pytest

CHECK = r"""
import json, torch
from rlx.engines.draw import draw
out = {}
logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5]]).repeat(1000, 1)
token, logprob = draw(logits, 1.3, torch.Generator().manual_seed(0), block=8)
want = (logits[0] / 1.3).log_softmax(-1)
out["one_block"] = dict(counts=torch.bincount(token, minlength=5).tolist(), probs=want.exp().tolist(),
                        logprob_err=(logprob - want[token]).abs().max().item())
# 20 tokens in blocks of 8: the last block part-filled; the likeliest token banned
torch.manual_seed(0)
z = torch.randn(20) * 1.5
logits = z.repeat(300, 1)
banned = torch.tensor([int(z.argmax()), 17])
token, logprob = draw(logits, 0.8, torch.Generator().manual_seed(1), banned, block=8)
want = (z / 0.8).log_softmax(-1)
allowed = want.index_fill(0, banned, float("-inf")).softmax(-1)
out["blocks"] = dict(counts=torch.bincount(token, minlength=20).tolist(), probs=allowed.tolist(),
                     banned=banned.tolist(), logprob_err=(logprob - want[token]).abs().max().item())
flat = torch.zeros(64, 12)
first = draw(flat, 1.0, torch.Generator().manual_seed(5), block=8)[0]
generator = torch.Generator().manual_seed(5)
again, after = draw(flat, 1.0, generator, block=8)[0], draw(flat, 1.0, generator, block=8)[0]
strided = draw(torch.zeros(12, 64).t(), 1.0, torch.Generator().manual_seed(5), block=8)[0]
out["seeds"] = dict(same=first.tolist() == again.tolist(), fresh=(first != after).float().mean().item(),
                    strided_same=strided.tolist() == first.tolist())
edges = torch.full((2, 20), float("-inf"))
edges[0, 19] = 0.0  # all the mass on the last token, in the last, part-filled block
edges[1, 3] = 0.0   # on one token of the first block
token, logprob = draw(edges, 1.0, torch.Generator().manual_seed(2), block=8)
only_last, only_last_logprob = draw(torch.zeros(1, 20), 1.0, torch.Generator().manual_seed(2),
                                    torch.arange(19), block=8)
out["edges"] = dict(tokens=token.tolist() + only_last.tolist(), logprobs=logprob.tolist() + only_last_logprob.tolist())
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def checked():
    result = subprocess.run([sys.executable, "-c", CHECK], env={**os.environ, "TRITON_INTERPRET": "1"},
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _within_five_standard_errors(counts, probs):
    n = sum(counts)
    for count, p in zip(counts, probs):
        assert abs(count / n - p) <= 5 * (p * (1 - p) / n) ** 0.5 + 1e-9, (counts, probs)


def test_draws_follow_the_tempered_softmax(checked):
    _within_five_standard_errors(checked["one_block"]["counts"], checked["one_block"]["probs"])
    assert checked["one_block"]["logprob_err"] < 1e-5


def test_rows_over_several_blocks_and_banned_ids(checked):
    blocks = checked["blocks"]
    assert all(blocks["counts"][i] == 0 for i in blocks["banned"])
    _within_five_standard_errors(blocks["counts"], blocks["probs"])
    # the log-prob is under the whole softmax, banned ids in its normaliser
    assert blocks["logprob_err"] < 1e-5


def test_tokens_at_minus_infinity_are_never_drawn_and_the_last_token_is(checked):
    edges = checked["edges"]
    assert edges["tokens"] == [19, 3, 19]  # the third row: a flat one with every token but the last banned
    assert edges["logprobs"][:2] == [0.0, 0.0]
    assert abs(edges["logprobs"][2] - math.log(1 / 20)) < 1e-6


def test_a_seed_repeats_a_draw_and_the_next_call_draws_afresh(checked):
    seeds = checked["seeds"]
    assert seeds["same"] and seeds["strided_same"]
    assert seeds["fresh"] > 0.8  # 12 equally likely tokens: a repeat has probability 1/12


def test_the_kernels_compile_for_an_h200():
    """The interpreter runs the kernels' Python; this lowers them to H200 machine code (sm_90),
    which catches what only the compiler rejects."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    from rlx.engines.draw import _block_sums, _pick

    common = {"Logits": "*bf16", "Allowed": "*i1", "Top": "*fp32", "Total": "*fp32", "Drawable": "*fp32"}
    sums = {**common, "vocab": "i32", "stride": "i32", "blocks": "i32", "inverse_temperature": "fp32",
            "BANNED": "constexpr", "BLOCK": "constexpr"}
    pick = {**common, "Seed": "*i64", "Tokens": "*i64", "Logprobs": "*fp32", "vocab": "i32", "stride": "i32",
            "blocks": "i32", "inverse_temperature": "fp32", "BANNED": "constexpr", "BLOCK": "constexpr",
            "BLOCKS": "constexpr"}
    for banned in (False, True):
        for fn, signature, constants in ((_block_sums, sums, {"BANNED": banned, "BLOCK": 2048}),
                                         (_pick, pick, {"BANNED": banned, "BLOCK": 2048, "BLOCKS": 128})):
            kernel = compile(ASTSource(fn=fn, signature=signature, constexprs=constants),
                             target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
            assert kernel.asm["cubin"]
