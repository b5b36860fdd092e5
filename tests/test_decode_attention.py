"""The Triton decode-attention kernel (a CUDA kernel in rlx.engines.static_decode) run by
Triton's interpreter on the CPU, against SDPA: grouped query heads padded to the kernel's
tile, prompt padding that masks whole leading blocks, spans that end inside a block, and a
batch smaller than the cache's rows, this step's key and value written by the kernel, a
span reaching far past the rows' columns (a graph captured once for the whole cache), and
the samples of a prompt reading its columns once, through the prompt kernel, from the
slot that leads them (their own copies hold noise), a tile short of a prompt's samples,
and a bucket's spare rows."""

import json
import os
import subprocess
import sys

import pytest

CHECK = r"""
import json, numpy as np, torch, torch.nn.functional as F
from rlx.engines.decode_attention import decode_attention
from rlx.engines.static_decode import prompt_members
torch.manual_seed(0)
diffs, written = [], []
# live slots of b (the rest a bucket's spare rows), n samples a prompt, per_tile of them a tile
for live, b, rows, kv, groups, d, length, span, block, width, behind, n, per_tile in [
        (6, 6, 8, 2, 7, 32, 200, 150, 64, 90, 6, 2, 2),
        (3, 3, 3, 1, 4, 64, 90, 90, 32, 40, 6, 1, 1),  # one sample a prompt: one kernel
        (3, 4, 5, 2, 1, 16, 130, 67, 64, 60, 6, 4, 4),
        (5, 5, 6, 2, 7, 32, 200, 200, 32, 40, 150, 2, 2),
        (8, 8, 8, 2, 3, 32, 120, 120, 32, 70, 20, 8, 3),  # more samples than a tile takes
        (5, 8, 8, 2, 7, 32, 200, 200, 32, 90, 6, 3, 3)]:
    q = torch.randn(b, kv, groups, d)
    k, v = torch.randn(b, 1, kv, d).transpose(1, 2), torch.randn(b, 1, kv, d).transpose(1, 2)  # as the decoder's
    # each row's rotary embedding at its own position
    angles = torch.randint(0, 500, (b, 1)) * 10000.0 ** (-torch.arange(0, d, 2) / d)
    cos, sin = torch.cat([angles, angles], 1).cos(), torch.cat([angles, angles], 1).sin()
    keys, values = torch.randn(rows, kv, length, d), torch.randn(rows, kv, length, d)
    members = None
    leader = torch.arange(rows)
    if per_tile > 1:
        members = torch.from_numpy(prompt_members(np.arange(live), n, per_tile, rows))
        for row, listed in enumerate(members.tolist()):
            for m in listed:
                if m >= 0:
                    leader[m] = row
    # a row that does not lead holds noise in its prompt columns: it must read its leader's
    pad = torch.randint(0, width, (rows,))
    pad[0] = width - 1  # more than a whole block of padding before the first real column
    pad = pad[leader]
    before = keys.clone(), values.clone()
    # each row's own column: the span's last or up to behind - 1 before it (rows that joined later)
    column = span - 1 - torch.randint(0, behind, (rows,))
    valid = (torch.arange(length)[None] >= pad[:, None]) | (torch.arange(length)[None] >= width)
    out = decode_attention(q, k, v, cos, sin, keys, values, valid, column, span, d ** -0.5,
                           torch.full((rows,), width), members, block=block, prompt_block=block)
    q, k = (x * cos[:, None, None] + torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1) * sin[:, None, None]
            for x in (q, k))
    want_keys, want_values = before[0].clone(), before[1].clone()
    want_keys[torch.arange(b), :, column[:b]], want_values[torch.arange(b), :, column[:b]] = k[:, :, 0], v[:, :, 0]
    written.append(torch.equal(keys, want_keys) and torch.equal(values, want_values))
    want_keys[:, :, :width], want_values[:, :, :width] = want_keys[leader, :, :width], want_values[leader, :, :width]
    mask = (valid[:b, :span] & (torch.arange(span) <= column[:b, None]))[:, None, None, :]
    want = F.scaled_dot_product_attention(q, want_keys[:b, :, :span], want_values[:b, :, :span], attn_mask=mask,
                                          scale=d ** -0.5)
    diffs.append((out - want).abs().max().item())
print(json.dumps([diffs, written]))
"""


def test_kernel_matches_sdpa_under_the_interpreter():
    result = subprocess.run([sys.executable, "-c", CHECK], env={**os.environ, "TRITON_INTERPRET": "1"},
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    diffs, written = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(diffs) == 6 and max(diffs) < 1e-5, diffs
    assert written == [True] * 6  # this step's key and value in its column, of its rows only


H100_SHARED = 232448  # bytes of shared memory a program may take on an H100 or H200


def compiles_for_sm90(kernel, pointers: dict, scalars: tuple, strides: str, constexprs: dict, warps: int) -> bool:
    """Whether ``kernel`` lowers to sm_90 machine code that fits the SM's shared memory."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    signature = {**pointers, **{name: "fp32" if name == "scale" else "i32" for name in scalars},
                 **{name: "i32" for name in strides.split()}, **{name: "constexpr" for name in constexprs}}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    compiled = compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": 2})
    return bool(compiled.asm["cubin"]) and compiled.metadata.shared <= H100_SHARED


@pytest.mark.parametrize("prompt_done", [False, True], ids=["own-prompt", "prompt-kernel-first"])
def test_the_decode_kernel_compiles_for_an_h200(prompt_done):
    """The interpreter runs the kernels' Python; this lowers them to H200 machine code
    (sm_90) for W1's shape, which catches what only the compiler rejects."""
    from rlx.engines.decode_attention import _decode

    pointers = {**{name: "*bf16" for name in ("Q", "Knew", "Vnew", "Cos", "Sin", "K", "V")}, "Valid": "*i1",
                "Column": "*i64",
                "Width": "*i64", **{name: "*fp32" for name in ("Most", "Total", "Acc")}, "Out": "*bf16"}
    strides = "sqb sqh sqg scb ssnb snkb snkh snvb snvh skb skh skn svb svh svn smb ssb ssh sab sah sag sob soh sog"
    assert compiles_for_sm90(_decode, pointers, ("scale", "span"), strides,
                             {"GROUPS": 7, "GROUPS_PAD": 16, "D": 64, "BLOCK": 32, "PROMPT_DONE": prompt_done}, 2)


@pytest.mark.parametrize("groups, head_dim", [(7, 64), (7, 128), (16, 64), (2, 256)],
                         ids=["w1", "7b", "largest-tile", "head-256"])
def test_the_prompt_kernel_compiles_for_an_h200(groups, head_dim):
    """At W1's shape, the 7B shape's head size, and the largest tiles ``samples_per_tile``
    allows."""
    import triton

    from rlx.engines.decode_attention import _prompt, samples_per_tile

    members = min(8, samples_per_tile(groups, head_dim))

    pointers = {**{name: "*bf16" for name in ("Q", "Cos", "Sin", "K", "V")}, "Valid": "*i1", "Width": "*i64",
                "Members": "*i64",
                **{name: "*fp32" for name in ("Most", "Total", "Acc")}}
    strides = "sqb sqh sqg scb ssnb skb skh skn svb svh svn smb seb ssb ssh sab sah sag"
    assert compiles_for_sm90(_prompt, pointers, ("scale",), strides,
                             {"GROUPS": groups, "MEMBERS": members, "D": head_dim, "BLOCK": 64,
                              "TILE": max(16, triton.next_power_of_2(members * groups))}, 4)
