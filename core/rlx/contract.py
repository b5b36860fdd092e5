"""The contract every rlx plugin distribution keeps, as checks a test suite can run.

In a plugin's own tests (``rlx plugins new`` writes this file)::

    from rlx.contract import contract_tests

    test_contract = contract_tests("rlx-myplugin")

pytest then runs one test per check, named after it (``loads``, ``light-import``,
``unique-names``, ``dependencies``, ``policy-loss:cispo``, ``algorithm:cispo:trains`` ...).
``rlx plugins check rlx-myplugin`` runs the same checks from the command line, and
``RLX_CONTRACT=rlx-myplugin pytest --pyargs rlx.contract`` under pytest without a test
file (``RLX_CONTRACT_TRAIN=0`` skips the training runs).

What is checked, for the distribution and each component it registers:

- it loads (no import error, unknown hook, misspelt hook argument, unmarked hook
  function, raising registration hook), its names are unique, and building a plugin
  host with it imports no torch, ray, vllm or deepspeed;
- each part an algorithm names (estimator, losses) comes from rlx, from the
  distribution itself or from a distribution it declares as a dependency;
- an algorithm's config resolves with its defaults, every field has a help text and an
  unknown ``algorithm.*`` key is refused; the algorithm trains two steps of the smallest
  run on a built-in task with the built-in tiny model;
- an estimator returns [B, T] advantages and returns and scalar metrics, and groups by
  ``group_ids``, not by position (shuffling the samples shuffles its output alike);
- a policy, value or off-policy loss returns a per-token loss shaped like the mask and
  scalar metrics, and its gradient reaches the log-probs (values); a preference loss
  returns one loss and one value of each metric per pair (example), and a gradient;
- a reward function returns one finite number per sample; a sampler refuses an
  unknown option and keeps or drops whole groups; a reward-model or VLM-processor
  factory takes ``(path, *, config)``; a task makes prompts with labels.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, fields
from importlib import metadata
from typing import Any, Callable

from rlx.algorithm import PreferenceScores, UnpairedScores, call_with_accepted, check_loss_output
from rlx.config import ConfigError, OnlineConfig, resolve
from rlx.plugins import Host, build_host

HEAVY = ("torch", "ray", "vllm", "deepspeed")


class ContractError(AssertionError):
    """A plugin breaks the contract; the message names the component and what is wrong."""


@dataclass
class Check:
    id: str
    run: Callable[[], None]


def contract_tests(dist: str, *, train: bool = True):
    """A pytest test function running every check of ``dist``, one parametrized case each;
    ``train=False`` leaves out the training runs."""
    import pytest

    found = checks(dist, train=train)

    @pytest.mark.parametrize("check", found, ids=[c.id for c in found])
    def test_contract(check: Check) -> None:
        check.run()

    return test_contract


def checks(dist: str, *, train: bool = True, host: Host | None = None) -> list[Check]:
    """The checks of distribution ``dist``: the load checks first, then one or two a component."""
    host = host or build_host()
    if dist not in host.plugins:  # nothing else can be checked
        return [Check("loads", lambda: _loads(host, dist))]
    found = [Check("loads", lambda: _loads(host, dist)), Check("light-import", lambda: _light_import(dist)),
             Check("unique-names", lambda: _unique(host, dist)),
             Check("dependencies", lambda: _dependencies(host, dist))]
    mine = {hook: [name for name in registry.items if registry.providers[name] == dist]
            for hook, registry in host.registries.items()}
    for name in mine["register_algorithms"]:
        spec = host.algorithms.get(name)
        found.append(Check(f"algorithm:{name}:config", lambda spec=spec: _config(spec)))
        if train:
            found.append(Check(f"algorithm:{name}:trains", lambda spec=spec: _trains(host, spec)))
    per_kind = {
        "register_advantage_estimators": ("estimator", _estimator),
        "register_policy_losses": ("policy-loss", _policy_loss),
        "register_value_losses": ("value-loss", _value_loss),
        "register_off_policy_corrections": ("off-policy-correction", _correction),
        "register_preference_losses": ("preference-loss", _preference_loss),
        "register_reward_functions": ("reward-function", _reward_function),
        "register_reward_models": ("reward-model", _path_factory),
        "register_vlm_processors": ("vlm-processor", _path_factory),
        "register_samplers": ("sampler", _sampler),
        "register_tasks": ("task", _task),
    }
    for hook, (kind, check) in per_kind.items():
        for name in mine.get(hook, []):
            found.append(Check(f"{kind}:{name}", lambda c=check, h=hook, n=name: c(host, h, n)))
    return found


def run_checks(dist: str, *, train: bool = True) -> list[tuple[str, str | None]]:
    """``(check id, failure or None)`` for every check of ``dist``."""
    results = []
    for check in checks(dist, train=train):
        try:
            check.run()
            results.append((check.id, None))
        except Exception as e:  # a check's failure is reported, not raised: the others still run
            results.append((check.id, f"{type(e).__name__}: {e}"))
    return results


# ---------------------------------------------------------------------------
# the distribution


def _loads(host: Host, dist: str) -> None:
    # a name conflict is recorded as a failure too, but it is the unique-names check's
    conflicts = [r.conflict_message(n) for r in host.registries.values() for n, ps in r.conflicts.items() if dist in ps]
    reason = host.failures.get(dist)
    if reason and reason != "; ".join(conflicts):
        raise ContractError(f"{dist} failed to load: {reason}")
    if dist not in host.plugins:
        raise ContractError(f"{dist} is not installed, or has no entry point in the 'rlx' group")


@functools.lru_cache(maxsize=None)
def _heavy_after_loading(only: str | None, path: tuple[str, ...]) -> str:
    """The heavy modules a fresh process on import path ``path`` holds once it has built a
    plugin host with the distribution ``only`` (None: every installed one), as a printed list."""
    code = ("import sys\nfrom rlx.plugins import build_host\nbuild_host()\n"
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    env.pop("RLX_LOAD_PLUGINS", None)
    if only is not None:
        env["RLX_LOAD_PLUGINS"] = only
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    if result.returncode:
        raise ContractError(f"building a plugin host with {only or 'every plugin'} failed: "
                            f"{result.stderr.strip()[-500:]}")
    return result.stdout.strip().splitlines()[-1]


def _light_import(dist: str) -> None:
    path = tuple(sys.path)
    if _heavy_after_loading(None, path) == "[]":  # all of them together are light: so is each
        return
    heavy = _heavy_after_loading(dist, path)
    if heavy != "[]":
        raise ContractError(f"loading {dist} imports {heavy}: import them inside the functions that use them, "
                            f"so that `rlx plugins list` stays light")


def _unique(host: Host, dist: str) -> None:
    for registry in host.registries.values():
        for name, providers in registry.conflicts.items():
            if dist in providers:
                raise ContractError(registry.conflict_message(name))


def _requirement_names(dist: str) -> set[str]:
    names = set()
    for requirement in metadata.requires(dist) or []:
        if "extra ==" in requirement:
            continue
        names.add(_normalize(re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0]))
    return names


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _dependencies(host: Host, dist: str) -> None:
    allowed = {_normalize(dist), "rlx"} | _requirement_names(dist)
    for name in host.algorithms:
        if host.algorithms.providers[name] != dist:
            continue
        spec = host.algorithms.get(name)
        for part, hook in [("estimator", "register_advantage_estimators"), ("policy_loss", "register_policy_losses"),
                           ("value_loss", "register_value_losses"), ("preference_loss", "register_preference_losses")]:
            part_name = getattr(spec, part)
            if not part_name:
                continue
            registry = host.registry(hook)
            if part_name not in registry:
                raise ContractError(f"algorithm {name!r} names {part} {part_name!r}, which no installed plugin "
                                    f"registers")
            provider = registry.providers[part_name]
            if _normalize(provider) not in allowed:
                raise ContractError(
                    f"algorithm {name!r} names {part} {part_name!r} of {provider}, which {dist} does not depend on: "
                    f"add {provider!r} to its dependencies, or register a {part} of its own")


# ---------------------------------------------------------------------------
# algorithms


def _config(spec) -> None:
    if spec.config is object:
        resolve(spec, {})
        return
    for f in fields(spec.config):
        if not f.metadata.get("help"):
            raise ContractError(f"algorithm {spec.name!r}: config field {f.name!r} has no help text: declare it "
                                f"with rlx.config.opt(default, help)")
    resolve(spec, {})
    try:
        resolve(spec, {"algorithm": {"no_such_key": 1}})
    except ConfigError:
        return
    raise ContractError(f"algorithm {spec.name!r} accepted the unknown key algorithm.no_such_key")


def smallest_run(spec, output: str) -> dict:
    """The smallest run of ``spec`` on a built-in task with the built-in tiny model."""
    data = spec.defaults.get("data.path", "")
    tree: dict[str, Any] = {
        "output": output,
        "model": {"path": "builtin:tiny"},
        "data": {"path": data if data.startswith("builtin:") else "builtin:arithmetic_small", "builtin_size": 24,
                 "eval_size": 4, "chat_template": "none", "max_length": 64},
        "training": {"batch_size": 4, "micro_batch_size": 4, "max_steps": 2, "threads": 1},
        "checkpoint": {"save_final": False},
        "logging": {"progress": False, "tensorboard": False},
    }
    if spec.loop == "online":
        tree["rollout"] = {"max_new_tokens": 4}
        tree["algorithm"] = {"rollout_batch_size": 2, "n_samples": 2, "eval_size": 2, "eval_k": 2}
    return tree


def _trains(host: Host, spec) -> None:
    import json
    from pathlib import Path

    from rlx.run import run

    with tempfile.TemporaryDirectory(prefix="rlx-contract-") as out:
        run(resolve(spec, smallest_run(spec, out)), host)
        rows = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    steps = [row["step"] for row in rows if "step" in row and any(k.startswith("loss") for k in row)]
    if steps[-2:] != [1, 2]:
        raise ContractError(f"algorithm {spec.name!r}: two training steps logged steps {steps}")
    for row in rows:
        for key, value in row.items():
            if key.startswith("loss") and not math.isfinite(value):
                raise ContractError(f"algorithm {spec.name!r}: {key} is {value} at step {row.get('step')}")


# ---------------------------------------------------------------------------
# parts of algorithms


def _part_config(host: Host, part: str, name: str):
    """The config of the first algorithm that names this part, else ``OnlineConfig()``."""
    for algo in host.algorithms:
        spec = host.algorithms.get(algo)
        if getattr(spec, part) == name and spec.config is not object:
            return spec.config(), spec
    return OnlineConfig(), None


def _batch(seed: int = 0):
    """Six samples of three prompts, interleaved (ids 0,1,2,0,1,2), right-padded to T = 5."""
    import torch

    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([5, 3, 4, 2, 5, 1])
    mask = (torch.arange(5)[None, :] < lengths[:, None]).float()
    group_ids = torch.tensor([0, 1, 2, 0, 1, 2])
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 1.0, 0.25])
    logp = -torch.rand(6, 5, generator=g) - 0.1
    return mask, group_ids, rewards, logp, g


def _scalar_metrics(what: str, metrics: Any) -> None:
    if not isinstance(metrics, dict):
        raise ContractError(f"{what} returned metrics of type {type(metrics).__name__}, not a dict")
    for key, value in metrics.items():
        if not (isinstance(value, (int, float)) or getattr(value, "numel", lambda: 0)() == 1):
            raise ContractError(f"{what} returned metric {key!r}, not a scalar (a float or a 0-d tensor)")


def _estimator(host: Host, hook: str, name: str) -> None:
    import torch

    fn = host.get(hook, name)
    config, _ = _part_config(host, "estimator", name)
    mask, group_ids, rewards, _, g = _batch()
    values = torch.randn(6, 5, generator=g) * mask

    def estimate(order, ids):
        out = call_with_accepted(fn, rewards[order], mask[order], kl=None, beta=0.0, values=values[order],
                                 group_ids=ids[order], n_samples=2, config=config)
        if not isinstance(out, tuple) or len(out) not in (2, 3):
            raise ContractError(f"estimator {name!r} must return (advantages, returns) or (advantages, returns, "
                                f"metrics), got {type(out).__name__}")
        for label, tensor in zip(("advantages", "returns"), out[:2]):
            if tuple(tensor.shape) != (6, 5) or not torch.isfinite(tensor).all():
                raise ContractError(f"estimator {name!r}: {label} must be finite and [B, T] = (6, 5), got "
                                    f"{tuple(tensor.shape)}")
        if len(out) == 3:
            _scalar_metrics(f"estimator {name!r}", out[2])
        return out[0] * mask[order]

    plain = estimate(torch.arange(6), group_ids)
    order = torch.tensor([3, 0, 5, 1, 4, 2])
    shuffled = estimate(order, group_ids + 7)
    if not torch.allclose(shuffled, plain[order], atol=1e-5):
        raise ContractError(f"estimator {name!r} gives other advantages when the samples are shuffled with their "
                            f"group ids: group by group_ids, not by position")


def _loss_inputs():
    import torch

    mask, _, _, logp, g = _batch()
    logp = logp.clone().requires_grad_(True)
    old = logp.detach() + 0.05 * torch.randn(6, 5, generator=g)
    rollout = old + 0.05 * torch.randn(6, 5, generator=g)
    advantages = torch.randn(6, 5, generator=g) * mask
    return logp, old, rollout, advantages, mask


def _gradient_flows(what: str, loss, mask, leaf) -> None:
    from rlx import ops

    total = ops.masked_mean(loss, mask) if loss.dim() == 2 else loss.mean()
    if total.requires_grad:
        total.backward()
    if leaf.grad is None or not leaf.grad.isfinite().all() or not leaf.grad.abs().sum() > 0:
        raise ContractError(f"{what}: no finite, non-zero gradient reaches its input (is the loss detached?)")


def _policy_loss(host: Host, hook: str, name: str) -> None:
    fn = host.get(hook, name)
    config, _ = _part_config(host, "policy_loss", name)
    logp, old, rollout, advantages, mask = _loss_inputs()
    per_token, metrics = call_with_accepted(fn, logp, old, advantages, mask, config=config, rollout_logp=rollout)
    check_loss_output("policy loss", name, per_token, metrics, mask)
    _gradient_flows(f"policy loss {name!r}", per_token, mask, logp)


def _value_loss(host: Host, hook: str, name: str) -> None:
    import torch

    fn = host.get(hook, name)
    config, _ = _part_config(host, "value_loss", name)
    mask, _, _, _, g = _batch()
    values = torch.randn(6, 5, generator=g).requires_grad_(True)
    old, returns = values.detach() + 0.1, torch.randn(6, 5, generator=g)
    per_token, metrics = call_with_accepted(fn, values, old, returns, mask, config=config)
    check_loss_output("value loss", name, per_token, metrics, mask)
    _gradient_flows(f"value loss {name!r}", per_token, mask, values)


def _correction(host: Host, hook: str, name: str) -> None:
    fn = host.get(hook, name)
    logp, old, rollout, advantages, mask = _loss_inputs()
    per_token, metrics = call_with_accepted(fn, -(logp - old).exp() * advantages, old, rollout, mask,
                                            config=OnlineConfig())
    check_loss_output("off-policy correction", name, per_token, metrics, mask)
    _gradient_flows(f"off-policy correction {name!r}", per_token, mask, logp)


def _preference_loss(host: Host, hook: str, name: str) -> None:
    import torch

    fn = host.get(hook, name)
    config, spec = _part_config(host, "preference_loss", name)
    g = torch.Generator().manual_seed(0)
    policy = torch.rand(4, generator=g).mul(-10).requires_grad_(True)
    reference = policy.detach() - torch.rand(4, generator=g)
    if spec is not None and spec.data == "unpaired":
        statistics = getattr(fn, "step_statistics", "kl_ref_point")
        desirable = torch.tensor([True, False, True, False])
        scores = UnpairedScores(
            logratio=policy - reference, kl_ref_point=torch.tensor(0.1) if statistics == "kl_ref_point" else None,
            desirable=desirable, policy=policy, reference=reference, tokens=torch.full((4,), 5.0),
            step_logratio=(policy - reference).detach() if statistics == "logratios" else None,
            step_desirable=desirable if statistics == "logratios" else None)
    else:
        scores = PreferenceScores(chosen=policy, rejected=policy.detach() - 1.0, ref_chosen=reference,
                                  ref_rejected=reference - 0.5, chosen_tokens=torch.full((4,), 5.0),
                                  rejected_tokens=torch.full((4,), 6.0), chosen_nll=-policy / 5)
    loss, metrics = fn(scores, config=config)
    what = f"preference loss {name!r}"
    if tuple(getattr(loss, "shape", ())) != (4,):
        raise ContractError(f"{what} must return one loss per pair, shape [B] = (4,), got "
                            f"{tuple(getattr(loss, 'shape', ()))}")
    for key, value in metrics.items():
        if tuple(getattr(value, "shape", ())) != (4,):  # the loop averages them over the step's pairs
            raise ContractError(f"{what} returned metric {key!r} of shape {tuple(getattr(value, 'shape', ()))}, "
                                f"not one value per pair, [B] = (4,)")
    _gradient_flows(what, loss, None, policy)


# ---------------------------------------------------------------------------
# rewards, samplers, factories, tasks


def _reward_function(host: Host, hook: str, name: str) -> None:
    from rlx.rewards import RewardSource, run_source
    from rlx.tasks import TASKS, prompt_rows

    rows = prompt_rows(TASKS["arithmetic_small"], 4)
    prompts, labels = [r["prompt"] for r in rows], [r["label"] for r in rows]
    completions = [labels[0], "no idea", "", labels[3] + "?"]
    rewards, _, _ = run_source(RewardSource(name, f"reward function {name!r}", host.get(hook, name)),
                               prompts, completions, labels, {})
    if len(rewards) != 4:
        raise ContractError(f"reward function {name!r} returned {len(rewards)} rewards for 4 samples")


def _sampler(host: Host, hook: str, name: str) -> None:
    factory = host.get(hook, name)
    try:
        factory({"no_such_option": 1})
    except ConfigError:
        pass
    else:
        raise ContractError(f"sampler {name!r} accepted the unknown option no_such_option: build its options with "
                            f"rlx.config.build(OptionsClass, options, 'algorithm.sampler_options')")
    sampler = factory({})
    if not isinstance(getattr(sampler, "max_rounds", None), int):
        raise ContractError(f"sampler {name!r} needs an int attribute max_rounds (extra generation rounds)")
    kept = sampler.keep([[0.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    if len(kept) != 3 or not all(isinstance(k, bool) for k in kept):
        raise ContractError(f"sampler {name!r}: keep(groups) must return one bool per group, got {kept!r}")


def _path_factory(host: Host, hook: str, name: str) -> None:
    factory = host.get(hook, name)
    params = list(inspect.signature(factory).parameters.values())
    takes_config = any(p.name == "config" or p.kind is p.VAR_KEYWORD for p in params)
    if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD) \
            or not takes_config:
        raise ContractError(f"{host.registry(hook).kind} {name!r} must be a factory (path, *, config)")


def _task(host: Host, hook: str, name: str) -> None:
    from rlx.tasks import prompt_rows, sft_rows

    task = host.get(hook, name)
    rows = prompt_rows(task, 4) + sft_rows(task, 4)
    if not all(isinstance(r.get("prompt"), str) and isinstance(r.get("label", r.get("response")), str) for r in rows):
        raise ContractError(f"task {name!r}: make(rng) must return {{'prompt': str, 'answer': str}}")


# ---------------------------------------------------------------------------
# `RLX_CONTRACT=rlx-myplugin pytest --pyargs rlx.contract`: the suite without a test file


def pytest_generate_tests(metafunc) -> None:
    if metafunc.function is not test_distribution:
        return
    dist = os.environ.get("RLX_CONTRACT", "")
    found = checks(dist, train=os.environ.get("RLX_CONTRACT_TRAIN", "1") != "0") if dist else [Check("usage", _usage)]
    metafunc.parametrize("check", found, ids=[c.id for c in found])


def _usage() -> None:
    raise ContractError("name the distribution to check: RLX_CONTRACT=rlx-myplugin pytest --pyargs rlx.contract")


def test_distribution(check: Check) -> None:
    """Run one contract check of the distribution named by ``RLX_CONTRACT``."""
    check.run()
