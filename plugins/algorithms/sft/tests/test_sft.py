"""SFT end to end: short runs on the built-in tiny model, as a user would start them.

Each run goes through ``rlx.run.run(resolve(spec, tree), host)``, the path the CLI
takes after parsing its arguments, and is judged by what it writes (metrics.jsonl,
final/).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlx import testing
from rlx.config import resolve
from rlx.plugins import get_host
from rlx.testing import one_thread  # noqa: F401


@pytest.fixture(scope="module")
def tiny() -> str:
    """The built-in tiny model, made once into the test cache."""
    from rlx.tiny import builtin_model

    return builtin_model("builtin:tiny")


def train(out: Path, model: str, **settings) -> list[dict]:
    """Run SFT into ``out`` with dotted ``settings``; return the rows of metrics.jsonl."""
    return testing.train("sft", out, {"model.path": model, **settings})


def test_loss_falls_on_builtin_arithmetic(tmp_path, tiny):
    rows = train(tmp_path / "run", "builtin:tiny", **{
        "data.path": "builtin:arithmetic", "data.builtin_size": 400, "data.eval_size": 32,
        "training.max_steps": 16, "training.eval_every": 4, "training.lr": 2e-3})
    assert [r["step"] for r in rows] == list(range(1, 17))
    first, last = rows[0]["loss"], rows[-1]["loss"]
    assert last < 0.6 * first, (first, last)
    evals = [r["eval/loss"] for r in rows if "eval/loss" in r]
    assert len(evals) == 4
    assert evals[-1] < 0.8 * evals[0], evals
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()


def test_prompt_tokens_carry_no_loss(tiny):
    """The encoded row masks exactly the response (and its EOS), and the training loss
    sends no gradient to the positions that predict prompt tokens."""
    import torch

    from rlx import data, models
    from rlx.objectives import _sft_objective

    config = resolve(get_host().algorithms.get("sft"), {"model": {"path": tiny}})
    tokenizer = models.load_tokenizer(tiny)
    row = {"prompt": "23+45=", "response": "68"}
    encoded = data.encode_sft(row, tokenizer, config.data)
    ids, mask = encoded["input_ids"], encoded["loss_mask"]
    n_prompt = mask.index(1)
    assert set(mask[:n_prompt]) == {0} and set(mask[n_prompt:]) == {1}
    assert tokenizer.decode(ids[n_prompt:]) == "68" + tokenizer.eos_token
    assert "23+45=" in tokenizer.decode(ids[:n_prompt])

    # the loss of a real training step: gradients reach only the logits that predict
    # response tokens (logit t predicts token t + 1)
    model = models.load_causal_lm(config.model, torch.device("cpu"))
    objective = _sft_objective(config, None, None, tokenizer, torch.device("cpu"))
    captured = []

    def keep_logits(module, args, out):
        out.retain_grad()
        captured.append(out)

    hook = model.lm_head.register_forward_hook(keep_logits)
    loss, metrics = objective.loss(model, [encoded], objective.count([encoded]))
    hook.remove()
    loss.backward()
    grad = captured[0].grad[0].abs().sum(-1)  # [T]
    assert torch.all(grad[:n_prompt - 1] == 0)
    assert torch.all(grad[n_prompt - 1:-1] > 0)
    assert grad[-1] == 0  # the last position predicts nothing
    # and the loss is the mean NLL of the response tokens alone
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    nll = -torch.stack([logp[t - 1, ids[t]] for t in range(n_prompt, len(ids))]).mean()
    assert metrics["loss"] == pytest.approx(nll.item(), rel=1e-5)


CHATS = [
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": f"{a}+{b}="}, {"role": "assistant", "content": str(a + b)},
     {"role": "user", "content": f"{a + b}-{b}="}, {"role": "assistant", "content": str(a)}]
    for a, b in [(3, 4), (12, 7), (25, 30), (41, 8), (9, 9), (60, 17), (33, 33), (70, 2), (5, 55), (18, 81)] * 4
]


def test_multi_turn_chat_file_trains(tmp_path, tiny):
    from rlx import data, models
    from rlx.config import DataConfig

    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CHATS))

    # only the assistant turns are learnt
    tokenizer = models.load_tokenizer(tiny)
    encoded = data.encode_sft({"messages": CHATS[1]}, tokenizer, DataConfig())
    learnt = tokenizer.decode([t for t, m in zip(encoded["input_ids"], encoded["loss_mask"]) if m])
    assert learnt == "19<|im_end|>\n12<|im_end|>\n"

    rows = train(tmp_path / "run", tiny, **{
        "data.path": str(path), "data.eval_size": 8, "training.max_steps": 6, "training.batch_size": 8,
        "training.micro_batch_size": 4, "training.lr": 2e-3, "training.eval_every": 1})
    assert len(rows) == 6
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert rows[-1]["eval/loss"] < rows[0]["eval/loss"]
    assert (tmp_path / "run" / "final" / "config.json").is_file()


def test_packing_matches_padding(tmp_path, tiny):
    settings = {"data.path": "builtin:arithmetic", "data.builtin_size": 64, "data.eval_size": 8,
                "training.max_steps": 1, "training.seed": 3, "checkpoint.save_final": False}
    padded = train(tmp_path / "padded", tiny, **settings)[0]
    packed = train(tmp_path / "packed", tiny, **settings, **{"training.packing": True})[0]
    assert packed["loss"] == pytest.approx(padded["loss"], abs=1e-4)
    assert packed["grad_norm"] == pytest.approx(padded["grad_norm"], rel=1e-3)
    assert packed["eval/loss"] == pytest.approx(padded["eval/loss"], abs=1e-4)
    # a different seed draws other rows: the equality above is not a coincidence
    other = train(tmp_path / "other", tiny, **{**settings, "training.seed": 4})[0]
    assert abs(other["loss"] - padded["loss"]) > 1e-3


def test_lora_trains_and_final_is_merged(tmp_path, tiny):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    rows = train(tmp_path / "run", tiny, **{
        "data.path": "builtin:arithmetic", "data.builtin_size": 128, "data.eval_size": 8,
        "training.max_steps": 4, "training.lr": 5e-3, "model.lora.rank": 4})
    assert rows[-1]["loss"] < rows[0]["loss"]
    final = tmp_path / "run" / "final"
    assert not (final / "adapter_config.json").exists()
    names = list(load_file(final / "model.safetensors"))
    assert not [n for n in names if "lora" in n or "base_layer" in n], names
    trained = AutoModelForCausalLM.from_pretrained(final)
    base = AutoModelForCausalLM.from_pretrained(tiny)
    assert set(trained.state_dict()) == set(base.state_dict())
    # the adapters were merged into the linear layers; the embeddings were frozen
    changed = [n for n, p in trained.named_parameters() if not torch.equal(p, base.get_parameter(n))]
    assert any("q_proj.weight" in n for n in changed) and any("mlp" in n for n in changed)
    assert "model.embed_tokens.weight" not in changed
