"""Reward-model training end to end on the built-in tiny model.

Runs go through ``rlx.run.run(resolve(spec, tree), host)``, the path ``rlx train``
takes after parsing its arguments.

About the data of the accuracy test: on ``builtin:arithmetic`` pairs the rejected answer
is the right one off by 1, 2 or 10, so a reward model has to do two-digit arithmetic
to rank them; the random tiny model stays at chance there for hundreds of steps
(tried: lr 2e-4 to 3e-3, up to 200 steps of 64 pairs). ``builtin:copy`` pairs (the
rejected copy drops or changes a letter) are learnt in a few dozen steps, which is
what a CI-sized run can show.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlx import testing
from rlx.plugins import get_host
from rlx.run import RunError
from rlx.testing import one_thread  # noqa: F401


SMALL = {"data.builtin_size": 64, "data.eval_size": 16, "training.batch_size": 8, "training.micro_batch_size": 4}


@pytest.fixture(scope="module")
def tiny() -> str:
    """The built-in tiny model, made once into the test cache."""
    from rlx.tiny import builtin_model

    return builtin_model("builtin:tiny")


def train(out: Path, model: str, **settings) -> list[dict]:
    """Train a reward model into ``out`` with dotted ``settings``; the rows of metrics.jsonl."""
    return testing.train("rm", out, {"model.path": model, **settings})


def test_held_out_accuracy_rises_well_above_chance(tmp_path, tiny):
    data = {"data.path": "builtin:copy", "data.builtin_size": 1600, "data.eval_size": 128}
    untrained = train(tmp_path / "untrained", tiny, **data, **{"training.max_steps": 1, "training.lr": 0.0,
                                                               "checkpoint.save_final": False})
    assert 0.4 <= untrained[-1]["eval/accuracy"] <= 0.6, untrained[-1]
    rows = train(tmp_path / "run", tiny, **data, **{"training.max_steps": 50, "training.lr": 3e-4,
                                                    "training.eval_every": 25})
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    assert len(evals) == 2 and evals[-1] >= 0.72, evals
    assert rows[-1]["eval/loss"] < untrained[-1]["eval/loss"] - 0.05
    assert rows[-1]["eval/reward/margin"] > 0.2  # chosen scores clearly above rejected


def test_log_exp_loss_runs(tmp_path, tiny):
    rows = train(tmp_path / "run", tiny, **SMALL, **{"training.max_steps": 3, "algorithm.preference_loss": "log_exp",
                                                     "checkpoint.save_final": False})
    config = (tmp_path / "run" / "config.yaml").read_text()
    assert "preference_loss: log_exp" in config
    assert len(rows) == 3 and all(0 < r["loss"] < 5 for r in rows)
    assert 0 <= rows[-1]["eval/accuracy"] <= 1


def test_unknown_preference_loss_is_named(tmp_path, tiny):
    with pytest.raises(RunError, match="'bradley_terri'.*Did you mean 'bradley_terry'"):
        train(tmp_path / "run", tiny, **SMALL, **{"training.max_steps": 1,
                                                  "algorithm.preference_loss": "bradley_terri"})


def _pairs(n: int, margin: float | None) -> list[dict]:
    from rlx.tasks import TASKS, pair_rows

    rows = pair_rows(TASKS["arithmetic"], n)
    if margin is not None:
        for row in rows:
            row["gap"] = margin
    return rows


def test_margin_column_from_a_jsonl_file(tmp_path, tiny):
    settings = {"data.eval_size": 4, "training.max_steps": 2, "training.batch_size": 8, "training.micro_batch_size": 8,
                "checkpoint.save_final": False}
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _pairs(40, margin=3.0)))
    plain = train(tmp_path / "plain", tiny, **settings, **{"data.path": str(path)})
    margin = train(tmp_path / "margin", tiny, **settings, **{"data.path": str(path), "algorithm.margin_key": "gap"})
    # -log σ(Δ - m): at Δ ≈ 0 a margin of 3 makes the loss about log(1 + e³) ≈ 3.05 instead of log 2
    assert plain[0]["loss"] == pytest.approx(0.693, abs=0.05)
    assert margin[0]["loss"] == pytest.approx(3.05, abs=0.1)
    # accuracy ignores the margin: the same pairs, the same untrained scores
    assert margin[0]["accuracy"] == plain[0]["accuracy"]


def test_a_row_without_the_margin_column_is_named(tmp_path, tiny):
    rows = _pairs(12, margin=1.0)
    del rows[6]["gap"]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(RunError, match=rf"{path} line 7: key 'gap' is missing"):
        train(tmp_path / "run", tiny, **{"data.path": str(path), "algorithm.margin_key": "gap",
                                         "training.max_steps": 1})
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_final_loads_as_a_sequence_classifier(tmp_path, tiny):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from rlx import data, models
    from rlx.config import DataConfig

    out = tmp_path / "run"
    rows = train(out, tiny, **SMALL, **{"training.max_steps": 3, "training.lr": 1e-3})
    final = out / "final"
    model = AutoModelForSequenceClassification.from_pretrained(final)
    assert model.config.num_labels == 1 and model.score.out_features == 1
    assert model.config.architectures[0].endswith("ForSequenceClassification")
    # the trained head and body, not a freshly initialised head
    saved = torch.load(next((out / "checkpoints").glob("step_*")) / "engine" / "engine.pt", weights_only=True)["params"]
    for name, param in model.named_parameters():
        assert torch.equal(param, saved[name]), name

    # the loaded model gives the eval pairs the rewards training saw: same accuracy, read at
    # the EOS that ends each response, and the model's own padded-batch ``.logits`` agree
    tokenizer = AutoTokenizer.from_pretrained(final)
    cfg = DataConfig()
    host = get_host()
    eval_rows = data.load_rows("builtin:arithmetic", DataConfig(builtin_size=64), split="test", task_format="pairs",
                               tasks=host.registry("register_tasks").items).rows[:16]
    correct = 0
    with torch.no_grad():
        for row in eval_rows:
            pair = data.encode_pair(row, tokenizer, cfg)
            scores = []
            for key in ("chosen", "rejected"):
                ids = torch.tensor([pair[f"{key}_ids"]])
                scores.append(models.last_token_values(models.token_values(model, ids), torch.ones_like(ids)).item())
            correct += scores[0] > scores[1]
            batch = data.pad_batch([pair["chosen_ids"], pair["rejected_ids"]],
                                   [pair["chosen_mask"], pair["rejected_mask"]], tokenizer.pad_token_id)
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, 0]
            assert logits.tolist() == pytest.approx(scores, abs=1e-4)
    assert correct / len(eval_rows) == pytest.approx(rows[-1]["eval/accuracy"])
