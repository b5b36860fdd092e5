import subprocess
import sys

import pytest

from rlx.config import RewardConfig
from rlx.plugins import build_host
from rlx.rewards import build_reward

EOS = "<|endoftext|>"
PROMPTS = ["2+2=", "The quick brown fox ", "a", "count the letters in abcabc: "]
COMPLETIONS = ["4", "jumps over the lazy dog.", " b c d e f g h", "6, as each letter appears twice"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny Qwen2 reward model (random weights) and byte-level BPE tokenizer."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForSequenceClassification

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(PROMPTS + COMPLETIONS, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOS, pad_token=EOS)

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=128, num_labels=1,
                         pad_token_id=tokenizer.pad_token_id)
    path = tmp_path_factory.mktemp("rm")
    Qwen2ForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_registered_by_its_distribution():
    host = build_host()
    assert host.registry("register_reward_models").providers["model"] == "rlx-reward-model"


def test_registration_imports_no_torch():
    code = "import sys, rlx_reward_model; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_scores_are_the_value_at_the_last_token_of_the_training_encoding(model_dir):
    import torch
    from transformers import AutoModelForSequenceClassification

    from rlx import data, models
    from rlx.config import DataConfig

    scorer = build_host().get("register_reward_models", "model")(str(model_dir), config=RewardConfig(), device="cpu")
    scores = scorer(PROMPTS, COMPLETIONS)

    # the ids rlx-rm trains on (prompt, response, EOS), one unpadded sequence at a time
    tokenizer = models.load_tokenizer(str(model_dir))
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    expected = []
    for p, c in zip(PROMPTS, COMPLETIONS):
        ids = data.encode_pair({"prompt": p, "chosen": c, "rejected": c}, tokenizer, DataConfig())["chosen_ids"]
        assert ids[-1] == tokenizer.eos_token_id
        with torch.no_grad():
            hidden = model.model(input_ids=torch.tensor([ids])).last_hidden_state
            expected.append(model.score(hidden)[0, -1, 0].item())
    assert scores == pytest.approx(expected, abs=1e-5)
    assert len(set(scores)) == len(scores)


def test_batching_and_padding_do_not_change_scores(model_dir, monkeypatch):
    import rlx_reward_model
    from rlx_reward_model import load_reward_model

    scorer = load_reward_model(str(model_dir), config=RewardConfig(), device="cpu")
    alone = [scorer([p], [c])[0] for p, c in zip(PROMPTS, COMPLETIONS)]
    assert scorer(PROMPTS, COMPLETIONS) == pytest.approx(alone, abs=1e-5)
    monkeypatch.setattr(rlx_reward_model, "BATCH_SIZE", 3)  # two batches, unevenly padded
    assert scorer(PROMPTS[::-1], COMPLETIONS[::-1]) == pytest.approx(alone[::-1], abs=1e-5)


def test_pipeline_with_a_reward_model(model_dir, tmp_path):
    from rlx_reward_model import load_reward_model

    rules = tmp_path / "rules.py"
    rules.write_text("def first(prompts, completions, labels):\n    return [1.0, 0.0, 0.0, 0.0]\n")
    cfg = RewardConfig(functions=[f"{rules}:first"], model=str(model_dir), weights=[2.0, 0.5])
    pipeline = build_reward(cfg, build_host(), device="cpu")
    model_scores = load_reward_model(str(model_dir), device="cpu")(PROMPTS, COMPLETIONS)
    result = pipeline(PROMPTS, COMPLETIONS, [None] * 4)
    assert result.rewards == pytest.approx([2.0 * e + 0.5 * m for e, m in zip([1, 0, 0, 0], model_scores)])
    assert result.metrics["reward/model"] == pytest.approx(sum(model_scores) / 4)


def test_models_that_are_not_reward_models_are_refused(tmp_path):
    from transformers import Qwen2Config

    from rlx_reward_model import load_reward_model

    # the check reads only the config: no weights are needed
    Qwen2Config(architectures=["Qwen2ForSequenceClassification"], num_labels=3).save_pretrained(tmp_path / "cls")
    Qwen2Config(architectures=["Qwen2ForCausalLM"]).save_pretrained(tmp_path / "lm")
    with pytest.raises(ValueError, match="num_labels=3"):
        load_reward_model(str(tmp_path / "cls"), device="cpu")
    with pytest.raises(ValueError, match="not a reward model.*Qwen2ForCausalLM"):
        load_reward_model(str(tmp_path / "lm"), device="cpu")
