"""An algorithm spec and the parts it names fail early and by name when they break the
contract docs/plugin-guide.md states, instead of deep inside a run."""

from dataclasses import dataclass

import pytest

from rlx import AlgorithmSpec
from rlx.algorithm import check_loss_output
from rlx.config import ONLINE_DEFAULTS, ConfigError, OnlineConfig, opt, resolve
from rlx.errors import PluginError
from rlx.testing import QUIET, one_thread  # noqa: F401  (one_thread: autouse)


@dataclass
class CISPOConfig(OnlineConfig):
    clip_max: float = opt(5.0, "upper bound of the clipped importance weight")


def online(**fields) -> AlgorithmSpec:
    return AlgorithmSpec(**{"name": "cispo", "description": "x", "loop": "online", "config": CISPOConfig,
                            "data": "prompts", "estimator": "group_norm", "policy_loss": "cispo", **fields})


@pytest.mark.parametrize("fields, message", [
    ({"config": object}, "an online algorithm needs config=, a dataclass subclassing rlx.config.OnlineConfig"),
    ({"config": dict}, "is not a dataclass"),
    ({"estimator": None}, "names its estimator"),
    ({"loop": "onlin"}, "loop is 'onlin'"),
    ({"defaults": {"algorithm.clip_mx": 3.0}}, "unknown key 'algorithm.clip_mx'. Did you mean 'algorithm.clip_max'?"),
    ({"defaults": {"training.learning_rate": 3.0}}, "unknown key 'training.learning_rate'"),
])
def test_a_bad_spec_fails_when_it_is_made(fields, message):
    with pytest.raises(PluginError, match="AlgorithmSpec 'cispo': ") as err:
        online(**fields)
    assert message in str(err.value)


def test_an_online_spec_keeps_its_keys_and_defaults():
    spec = online(defaults={**ONLINE_DEFAULTS, "algorithm.clip_max": 3.0})
    config = resolve(spec, {})
    assert config.algorithm.clip_max == 3.0 and config.algorithm.eval_size == 256
    assert resolve(spec, {"algorithm": {"clip_max": 2}}).algorithm.clip_max == 2.0
    with pytest.raises(ConfigError, match="'algorithm.rollout_batch_sise'. Did you mean 'algorithm.rollout_batch_size'"):
        resolve(spec, {"algorithm": {"rollout_batch_sise": 4}})


def test_algorithm_keys_of_a_spec_without_config_are_refused():
    spec = AlgorithmSpec(name="plain_sft", description="x", loop="offline")
    assert resolve(spec, {}).algorithm is None
    with pytest.raises(ConfigError, match="'algorithm.rollout_batch_size': plain_sft has no algorithm"):
        resolve(spec, {"algorithm": {"rollout_batch_size": 4}})


def test_loss_output_contract_names_the_loss_and_key():
    import torch

    mask = torch.ones(2, 4)
    check_loss_output("policy loss", "cispo", torch.zeros(2, 4), {"clip_frac": torch.tensor(0.5), "n": 3}, mask)
    with pytest.raises(PluginError, match=r"policy loss 'cispo' returned metric 'ratio' of shape \(2, 4\)"):
        check_loss_output("policy loss", "cispo", torch.zeros(2, 4), {"ratio": torch.ones(2, 4)}, mask)
    with pytest.raises(PluginError, match=r"returned a loss of shape \(2,\); it must be per token"):
        check_loss_output("policy loss", "cispo", torch.zeros(2), {}, mask)


PER_TOKEN_METRIC = '''
from rlx import hookimpl


@hookimpl
def register_policy_losses(register):
    def leaky(logp, old_logp, advantages, mask, *, config):
        ratio = (logp - old_logp).exp()
        return -ratio * advantages, {"ratio": ratio.detach()}
    register("leaky", leaky)
'''


def test_a_per_token_metric_stops_the_run_naming_loss_and_key(tmp_path, monkeypatch, tiny_model_dir):
    from rlx.plugins import build_host
    from rlx.run import RunError, run

    (tmp_path / "leaky_loss.py").write_text(PER_TOKEN_METRIC)
    monkeypatch.chdir(tmp_path)
    host = build_host(["leaky_loss"])
    spec = online(name="leaky_algo", policy_loss="leaky", config=OnlineConfig)
    host.algorithms.add(spec.name, spec, "leaky_loss")
    tree = {"output": str(tmp_path / "run"), "plugins": ["leaky_loss"], "model": {"path": tiny_model_dir},
            "data": {"path": "builtin:arithmetic_small", "builtin_size": 16, "eval_size": 0, "chat_template": "none"},
            "training": {"batch_size": 4, "micro_batch_size": 4, "max_steps": 1},
            "rollout": {"max_new_tokens": 2},
            "algorithm": {"rollout_batch_size": 2, "n_samples": 2, "eval_size": 2},
            "logging": {"progress": False, "tensorboard": False}}
    with pytest.raises(RunError, match="policy loss 'leaky' returned metric 'ratio' of shape"):
        run(resolve(spec, tree), host)
