"""The output head's Triton kernels (rlx.logprob_kernels, CUDA kernels) run by Triton's
interpreter on the CPU against float64 arithmetic: log-probs, normalisers and entropy over
rows whose vocabulary ends inside a block, at T = 1 (the entropy shares the normaliser) and
T ≠ 1 (it has sums of its own), and the gradient written beside the logits or over them."""

import json
import os
import subprocess
import sys

CHECK = r"""
import json, torch
from rlx.logprob_kernels import logits_grad, stats
torch.manual_seed(0)
diffs = []
for rows, vocab, block, temperature, entropy in [(5, 300, 64, 1.0, True), (4, 300, 128, 0.7, True),
                                                  (3, 64, 64, 0.7, False), (6, 1000, 256, 1.3, True)]:
    logits = torch.randn(rows, vocab) * 4
    labels = torch.randint(0, vocab, (rows,))
    grad_logp = torch.randn(rows)
    logp, lse, ent = stats(logits, labels, temperature, entropy, block=block)
    z = logits.double()
    want_lse = (z / temperature).logsumexp(-1)
    want_logp = (z / temperature).gather(-1, labels[:, None]).squeeze(-1) - want_lse
    diffs.append((logp.double() - want_logp).abs().max().item())
    diffs.append((lse.double() - want_lse).abs().max().item())
    if entropy:
        diffs.append((ent.double() + (z.softmax(-1) * z.log_softmax(-1)).sum(-1)).abs().max().item())
    else:
        diffs.append(float(ent.numel()))
    onehot = torch.nn.functional.one_hot(labels, vocab).double()
    want_grad = (onehot - (z / temperature - want_lse[:, None]).exp()) * grad_logp.double()[:, None] / temperature
    diffs.append((logits_grad(logits, lse, labels, grad_logp, temperature, block=block).double() - want_grad).abs().max().item())
    over = logits.clone()
    diffs.append((logits_grad(over, lse, labels, grad_logp, temperature, block=block, out=over).double() - want_grad)
                 .abs().max().item())
print(json.dumps(diffs))
"""


def test_kernels_match_float64_under_the_interpreter():
    result = subprocess.run([sys.executable, "-c", CHECK], env={**os.environ, "TRITON_INTERPRET": "1"},
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    diffs = json.loads(result.stdout.strip().splitlines()[-1])
    assert len(diffs) == 20 and max(diffs) < 1e-4, diffs


def test_the_kernels_compile_for_an_h200():
    """The interpreter runs the kernels' Python; this lowers them to H200 machine code (sm_90)
    with bf16 logits, which catches what only the compiler rejects."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    from rlx.logprob_kernels import _block_stats, _combine, _grad

    target = GPUTarget("cuda", 90, 32)
    flags = {"ENTROPY": True, "UNTEMPERED": True}
    sources = [
        ASTSource(fn=_block_stats, signature={"Logits": "*bf16", "Partial": "*fp32", "vocab": "i32", "stride": "i32",
                                              "plane": "i32", "blocks": "i32", "temperature": "fp32",
                                              "ENTROPY": "constexpr", "UNTEMPERED": "constexpr", "BLOCK": "constexpr"},
                  constexprs={**flags, "BLOCK": 4096}),
        ASTSource(fn=_combine, signature={"Logits": "*bf16", "Labels": "*i64", "Partial": "*fp32", "Logp": "*fp32",
                                          "Lse": "*fp32", "Entropy": "*fp32", "stride": "i32", "plane": "i32",
                                          "blocks": "i32", "temperature": "fp32", "ENTROPY": "constexpr",
                                          "UNTEMPERED": "constexpr", "BLOCKS": "constexpr"},
                  constexprs={**flags, "BLOCKS": 64}),
        ASTSource(fn=_grad, signature={"Logits": "*bf16", "Lse": "*fp32", "Labels": "*i64", "Grad": "*fp32",
                                       "Out": "*bf16", "vocab": "i32", "stride": "i32", "out_stride": "i32",
                                       "temperature": "fp32", "BLOCK": "constexpr"},
                  constexprs={"BLOCK": 4096}),
    ]
    for source in sources:
        assert compile(source, target=target, options={"num_warps": 8}).asm["cubin"]
