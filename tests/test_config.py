"""Typed config: YAML + dotted overrides, with unknown keys and bad values named."""

from dataclasses import dataclass

import pytest

from rlx.algorithm import AlgorithmSpec
from rlx.config import (ConfigError, DataConfig, ModelConfig, RunConfig, TrainingConfig, demo_data, demo_settings,
                        describe_fields, load_yaml, opt, parse_override, resolve, set_dotted)


@dataclass
class ToyConfig:
    beta: float = opt(0.1, "a coefficient")
    mode: str = opt("a", "a mode")


SPEC = AlgorithmSpec(name="toy", description="toy", loop="offline", config=ToyConfig,
                     defaults={"training.lr": 3e-4})


def tree(*overrides):
    t = {}
    for o in overrides:
        set_dotted(t, *parse_override(o))
    return t


def test_defaults_and_overrides():
    config = resolve(SPEC, tree("training.batch_size=16", "algorithm.beta=0.5", "model.lora.rank=8"))
    assert config.training.lr == 3e-4  # the algorithm's default
    assert config.training.batch_size == 16
    assert config.algorithm.beta == 0.5
    assert config.model.lora.rank == 8
    assert resolve(SPEC, tree("training.lr=1e-5")).training.lr == 1e-5


def test_unknown_key_names_it_and_suggests():
    with pytest.raises(ConfigError) as err:
        resolve(SPEC, tree("training.lrr=1"))
    assert "training.lrr" in str(err.value) and "'training.lr'" in str(err.value)
    with pytest.raises(ConfigError, match="algorithm.bta.*algorithm.beta"):
        resolve(SPEC, tree("algorithm.bta=1"))
    with pytest.raises(ConfigError, match="unknown config key 'trainin'"):
        resolve(SPEC, tree("trainin.lr=1"))


@pytest.mark.parametrize("override, message", [
    ("training.batch_size=abc", "training.batch_size: expected an integer"),
    ("training.packing=maybe", "training.packing: expected true or false"),
    ("training.backend=deepsped", "did you mean 'deepspeed'"),
    ("training.lr=fast", "training.lr: expected a number"),
    ("training.batch_size=10", "multiple of training.micro_batch_size"),
])
def test_bad_values_are_named(override, message):
    with pytest.raises(ConfigError, match=f"(?i){message}"):
        resolve(SPEC, tree(override, "training.micro_batch_size=4"))


def test_yaml_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("training:\n  lr: 2.0e-5\n  epochs: 3\nalgorithm:\n  mode: b\n")
    config = resolve(SPEC, load_yaml(path))
    assert (config.training.lr, config.training.epochs, config.algorithm.mode) == (2e-5, 3, "b")
    with pytest.raises(ConfigError, match="does not exist"):
        load_yaml(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("training: [1, 2\n")
    with pytest.raises(ConfigError, match="bad.yaml.*not valid YAML"):
        load_yaml(tmp_path / "bad.yaml")


def test_override_syntax():
    with pytest.raises(ConfigError, match="dotted.key=value"):
        parse_override("training.lr")
    assert parse_override("training.adam_betas=[0.9, 0.99]") == ("training.adam_betas", [0.9, 0.99])


def test_every_field_is_described():
    rows = describe_fields(RunConfig)
    keys = {r[0] for r in rows}
    assert {"training.lr", "model.lora.rank", "data.prompt_key", "checkpoint.every"} <= keys
    assert all(help_text for key, _, _, help_text in rows if key != "algorithm"), "every key needs a help text"


# ---------------------------------------------------------------------------
# demo settings: an algorithm's defaults apply only on its demo data


@pytest.fixture(scope="module")
def dpo():
    from rlx.plugins import get_host

    return get_host().algorithms.get("dpo")


def test_the_demo_takes_the_algorithms_defaults(dpo):
    config = resolve(dpo, {})
    assert config.algorithm.beta == 0.5
    assert (config.model.path, config.data.path) == ("builtin:tiny-arithmetic", "builtin:arithmetic_small")
    assert config.training.batch_size == 32
    # naming the demo data is still the demo
    assert resolve(dpo, tree("data.path=builtin:arithmetic_small")).algorithm.beta == 0.5


def test_own_data_takes_none_of_the_demo_settings(dpo, tmp_path):
    config = resolve(dpo, tree(f"data.path={tmp_path / 'pairs.jsonl'}", "model.path=my/model"))
    assert config.algorithm.beta == 0.1 == dpo.config().beta  # DPO's own default, not the demo's 0.5
    assert config.training.lr == TrainingConfig().lr
    assert config.training.batch_size == TrainingConfig().batch_size
    assert config.training.scheduler == TrainingConfig().scheduler
    assert config.data.chat_template == DataConfig().chat_template
    assert config.training.max_steps == 0


def test_own_data_needs_a_model(dpo, tmp_path):
    path = tmp_path / "pairs.jsonl"
    with pytest.raises(ConfigError, match=rf"data.path is '{path}', your own data.*give the model to train with --model"):
        resolve(dpo, tree(f"data.path={path}"))
    # another built-in task trains rlx's own tiny model, made for the built-in tasks
    config = resolve(dpo, tree("data.path=builtin:copy"))
    assert config.model.path == ModelConfig().path and config.algorithm.beta == 0.1


def test_demo_settings_are_the_defaults_the_user_left_unset(dpo):
    settings = demo_settings(dpo, tree("algorithm.beta=0.2", "training.lr=1e-5", "model.path=other"))
    assert settings == {k: v for k, v in dpo.defaults.items()
                        if k not in ("algorithm.beta", "training.lr", "model.path")}
    assert settings["data.path"] == demo_data(dpo) == "builtin:arithmetic_small"
    assert demo_settings(dpo, tree("data.path=rows.jsonl", "model.path=m")) == {}


def test_without_demo_data_the_demo_is_rlxs_default_data():
    # SPEC's defaults name no data: its demo is rlx's default data
    assert demo_data(SPEC) == DataConfig().path
    assert resolve(SPEC, {}).training.lr == 3e-4
    assert resolve(SPEC, tree(f"data.path={DataConfig().path}")).training.lr == 3e-4
    assert resolve(SPEC, tree("data.path=builtin:copy")).training.lr == TrainingConfig().lr


def test_every_choice_can_be_written_on_the_command_line_and_in_yaml():
    """YAML reads on/off/yes/no as booleans, so a choice spelled so could never be set."""
    import dataclasses
    import typing

    import yaml

    def choices(tp):
        if typing.get_origin(tp) is typing.Literal:
            yield from typing.get_args(tp)
        for arg in typing.get_args(tp):
            yield from choices(arg)
        if dataclasses.is_dataclass(tp):
            for f in dataclasses.fields(tp):
                yield from choices(typing.get_type_hints(tp)[f.name])

    found = list(choices(RunConfig))
    assert "auto" in found and "deepspeed" in found
    assert [c for c in found if yaml.safe_load(str(c)) != c] == []
    assert resolve(SPEC, tree("training.compile=on")).training.compile is True
    assert resolve(SPEC, tree("training.compile=auto")).training.compile == "auto"
