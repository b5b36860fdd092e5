"""The Triton decode-attention kernel (a CUDA kernel in rlx.engines.static_decode) run by
Triton's interpreter on the CPU, against SDPA: grouped query heads padded to the kernel's
tile, prompt padding that masks whole leading blocks, spans that end inside a block, and a
batch smaller than the cache's rows, this step's key and value written by the kernel, and
prompt columns read from the row named as holding the prompt, and a span reaching far past
the rows' columns (a graph captured once for the whole cache)."""

import json
import os
import subprocess
import sys

CHECK = r"""
import json, torch, torch.nn.functional as F
from rlx.engines.decode_attention import decode_attention
torch.manual_seed(0)
diffs, written = [], []
for b, rows, kv, groups, d, length, span, block, width, behind in [(6, 8, 2, 7, 32, 200, 150, 64, 90, 6),
                                                                   (3, 3, 1, 4, 64, 90, 90, 32, 40, 6),
                                                                   (4, 5, 2, 1, 16, 130, 67, 64, 60, 6),
                                                                   (5, 6, 2, 7, 32, 200, 200, 32, 40, 150)]:
    q = torch.randn(b, kv, groups, d)
    k, v = torch.randn(b, 1, kv, d).transpose(1, 2), torch.randn(b, 1, kv, d).transpose(1, 2)  # as the decoder's
    keys, values = torch.randn(rows, kv, length, d), torch.randn(rows, kv, length, d)
    # rows in pairs of one prompt: the second reads the first's prompt columns, its own are noise
    source = torch.arange(b) // 2 * 2
    pad = torch.randint(0, width, (rows,))
    pad[0] = width - 1  # more than a whole block of padding before the first real column
    pad[:b] = pad[source]
    before = keys.clone(), values.clone()
    # each row's own column: the span's last or up to behind - 1 before it (rows that joined later)
    column = span - 1 - torch.randint(0, behind, (rows,))
    valid = (torch.arange(length)[None] >= pad[:, None]) | (torch.arange(length)[None] >= width)
    out = decode_attention(q, k, v, keys, values, valid, column, span, d ** -0.5, source, torch.full((rows,), width),
                           block=block)
    want_keys, want_values = before[0].clone(), before[1].clone()
    want_keys[torch.arange(b), :, column[:b]], want_values[torch.arange(b), :, column[:b]] = k[:, :, 0], v[:, :, 0]
    written.append(torch.equal(keys, want_keys) and torch.equal(values, want_values))
    want_keys[:b, :, :width], want_values[:b, :, :width] = want_keys[source, :, :width], want_values[source, :, :width]
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
    assert len(diffs) == 4 and max(diffs) < 1e-5, diffs
    assert written == [True] * 4  # this step's key and value in its column, of its rows only


def test_the_kernel_compiles_for_an_h200():
    """The interpreter runs the kernel's Python; this lowers it to H200 machine code (sm_90)
    for W1's shape, which catches what only the compiler rejects."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    from rlx.engines.decode_attention import _decode

    signature = {"Q": "*bf16", "Knew": "*bf16", "Vnew": "*bf16", "K": "*bf16", "V": "*bf16", "Valid": "*i1", "Column": "*i64", "Source": "*i64",
                 "Width": "*i64", "Out": "*bf16",
                 "scale": "fp32", "span": "i32",
                 **{name: "i32" for name in ("sqb", "sqh", "sqg", "snkb", "snkh", "snvb", "snvh", "skb", "skh", "skn", "svb", "svh", "svn", "smb",
                                             "sob", "soh", "sog")},
                 **{name: "constexpr" for name in ("GROUPS", "GROUPS_PAD", "D", "BLOCK")}}
    source = ASTSource(fn=_decode, signature=signature, constexprs={"GROUPS": 7, "GROUPS_PAD": 16, "D": 64, "BLOCK": 64})
    kernel = compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 2, "num_stages": 2})
    assert kernel.asm["cubin"]
