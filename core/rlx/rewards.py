"""The reward pipeline of the online loop: rule functions and an optional reward model.

``reward.functions`` names registered reward functions, a user's
``path/to/file.py:function`` (``module:function`` works too) or the URL of a reward
server (``rlx.remote_rewards``); ``reward.model`` adds a
reward model loaded by the registered loader ``reward.model_type``. Each source's
rewards are multiplied by its weight in ``reward.weights`` (functions first, then the
model; empty: all 1) and summed.

A reward function is called as ``fn(prompts, completions, labels, **columns)``, where
``columns`` holds the dataset's other columns, one value per sample. It returns one
number per sample, or a dict with ``rewards``, optional ``scores`` (what dynamic
filtering looks at, e.g. correctness when ``rewards`` also holds shaping) and any
other entries as extra metrics (a number, or one number per sample), logged as
``reward/<source>/<key>``.

Every value is checked: a function that raises or returns something other than one
finite number per sample stops the run with a ``RewardError`` naming the function and
the first offending sample.

Only the standard library is imported here; a reward model loader imports what it needs.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rlx.algorithm import call_with_accepted
from rlx.config import RewardConfig
from rlx.plugins import PluginError, check_file, load_object
from rlx.registry import RegistryError
from rlx.errors import RewardError
from rlx.remote_rewards import is_url, remote_source

_SHOWN_CHARS = 80  # how much of a prompt or completion an error message quotes


@dataclass
class RewardResult:
    """Per-sample ``rewards`` (the weighted sum), ``scores`` for dynamic filtering (the
    sum of the functions' own scores where any returns them, else the rewards) and
    batch-mean ``metrics``."""

    rewards: list[float]
    scores: list[float]
    metrics: dict[str, float]


@dataclass
class RewardSource:
    """One weighted term: ``fn(prompts, completions, labels, **columns)``.

    ``name`` labels its metrics (``reward/<name>``); ``what`` names it in errors.
    """

    name: str
    what: str
    fn: Callable[..., Any]
    weight: float = 1.0


class RewardPipeline:
    """Scores a batch with every source and combines the results."""

    def __init__(self, sources: list[RewardSource]):
        self.sources = sources

    def __call__(self, prompts: list[str], completions: list[str], labels: list,
                 columns: dict[str, list] | None = None) -> RewardResult:
        columns = columns or {}
        n = len(completions)
        lengths = {"prompts": len(prompts), "labels": len(labels), **{k: len(v) for k, v in columns.items()}}
        if any(size != n for size in lengths.values()):
            raise RewardError(f"reward inputs disagree in length: completions {n}, "
                              + ", ".join(f"{k} {v}" for k, v in lengths.items()))
        if n == 0:
            return RewardResult([], [], {})

        rewards = [0.0] * n
        scores: list[float] | None = None
        metrics: dict[str, float] = {}
        for source in self.sources:
            values, own_scores, extras = run_source(source, prompts, completions, labels, columns)
            rewards = [r + source.weight * v for r, v in zip(rewards, values)]
            if own_scores is not None:
                scores = own_scores if scores is None else [a + b for a, b in zip(scores, own_scores)]
            metrics[f"reward/{source.name}"] = sum(values) / n
            for key, value in extras.items():
                metrics[f"reward/{source.name}/{key}"] = value
        return RewardResult(rewards, rewards if scores is None else scores, metrics)


def build_reward(cfg: RewardConfig, host, *, device=None) -> RewardPipeline:
    """The pipeline ``cfg`` describes, with components from ``host``'s registries.

    ``device`` is where a reward model runs (its loader's default when ``None``).
    Unknown names, files that fail to import and a wrong number of weights fail here,
    before any rollout.
    """
    sources = [_function_source(spec, cfg, host) for spec in cfg.functions]
    names = [s.name for s in sources] + (["model"] if cfg.model else [])
    if not names:
        raise RewardError("no reward: set reward.functions and/or reward.model")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise RewardError(f"reward sources must have distinct names; repeated: {', '.join(repeated)}")
    weights = [float(w) for w in cfg.weights] or [1.0] * len(names)
    if len(weights) != len(names):
        raise RewardError(f"reward.weights has {len(weights)} values but there are {len(names)} reward "
                          f"sources ({', '.join(names)}); give one weight per source, functions first, "
                          f"then the model, or none for all 1")
    bad = [(name, w) for name, w in zip(names, weights) if not math.isfinite(w)]
    if bad:
        raise RewardError(f"reward.weights: the weight of {bad[0][0]} is {bad[0][1]}")

    # the model loads last: every configuration error above is found without waiting for it
    if cfg.model:
        sources.append(_model_source(cfg, host, device))
    for source, weight in zip(sources, weights):
        source.weight = weight
    return RewardPipeline(sources)


def _model_source(cfg: RewardConfig, host, device) -> RewardSource:
    try:
        factory = host.get("register_reward_models", cfg.model_type)
    except RegistryError as e:
        raise RewardError(f"reward.model_type: {e}") from e
    try:
        scorer = call_with_accepted(factory, cfg.model, config=cfg, device=device)  # device only if it takes one
    except Exception as e:
        raise RewardError(f"reward.model: {cfg.model_type!r} could not load {cfg.model!r}: "
                          f"{type(e).__name__}: {e}") from e

    def model(prompts, completions, labels, **columns):
        return scorer(prompts, completions)

    return RewardSource("model", f"reward model {cfg.model!r}", model)


def check_functions(cfg: RewardConfig, host) -> None:
    """``reward.functions`` as far as it can be checked without running user code: each
    name registered, each file there (``build_reward`` imports the rest)."""
    for spec in cfg.functions:
        if is_url(spec):
            continue
        if ":" not in spec:
            _function_source(spec, cfg, host)  # a registry lookup
            continue
        try:
            check_file(spec, what="reward function")
        except PluginError as e:
            raise RewardError(f"reward.functions: {e}") from e


def _function_source(spec: str, cfg: RewardConfig, host) -> RewardSource:
    if is_url(spec):
        return remote_source(spec, cfg.remote)
    if ":" not in spec:
        try:
            return RewardSource(spec, f"reward function {spec!r}", host.get("register_reward_functions", spec))
        except RegistryError as e:
            raise RewardError(f"reward.functions: {e}") from e
    try:
        fn = load_object(spec, what="reward function")
    except PluginError as e:
        raise RewardError(f"reward.functions: {e}") from e
    if not callable(fn):
        raise RewardError(f"reward.functions: {spec!r} is a {type(fn).__name__}, not a function")
    target, _, attr = spec.partition(":")
    # "rewards.py:brevity" rather than the full path: metric names stay short
    name = f"{Path(target).name if target.endswith('.py') else target}:{attr}"
    return RewardSource(name, f"reward function {spec!r}", fn)


# ---------------------------------------------------------------------------
# calling and checking one source


def run_source(source: RewardSource, prompts, completions, labels, columns):
    """``(rewards, scores or None, extra metrics)`` of one source, every value checked."""
    n = len(completions)

    def sample(i: int) -> str:
        return f"sample {i} (prompt {_shorten(prompts[i])}, completion {_shorten(completions[i])})"

    try:
        result = source.fn(prompts, completions, labels, **columns)
    except RewardError:  # already names what failed (a reward server); calling it per sample would not help
        raise
    except Exception as e:
        where = _first_failing(source, prompts, completions, labels, columns, sample)
        raise RewardError(f"{source.what} raised {type(e).__name__} on {where}: {e}") from e

    if isinstance(result, dict):
        if "rewards" not in result:
            raise RewardError(f"{source.what} returned a dict without 'rewards' (keys: {', '.join(map(str, result))})")
        extras = {k: v for k, v in result.items() if k not in ("rewards", "scores")}
        scores = _numbers(source, "scores", result["scores"], n, sample) if "scores" in result else None
        metrics = {}
        for key, value in extras.items():
            if isinstance(value, numbers.Real):  # one number for the batch
                metrics[key] = _number(source, key, value, lambda: "the batch")
            else:
                metrics[key] = sum(_numbers(source, key, value, n, sample)) / n
        return _numbers(source, "rewards", result["rewards"], n, sample), scores, metrics
    return _numbers(source, "rewards", result, n, sample), None, {}


def _first_failing(source, prompts, completions, labels, columns, sample) -> str:
    """The first sample that raises on its own, to point the user at it."""
    for i in range(len(completions)):
        try:
            source.fn(prompts[i:i + 1], completions[i:i + 1], labels[i:i + 1],
                      **{k: v[i:i + 1] for k, v in columns.items()})
        except Exception:
            return sample(i)
    return f"a batch of {len(completions)} samples (each sample alone scores without error)"


def _numbers(source: RewardSource, key: str, values: Any, n: int, sample) -> list[float]:
    if isinstance(values, (str, bytes, dict)):
        raise RewardError(f"{source.what} returned {key} of type {type(values).__name__}; "
                          f"expected a list of {n} numbers")
    try:
        values = list(values)
    except TypeError:
        raise RewardError(f"{source.what} returned {key} of type {type(values).__name__}; "
                          f"expected a list of {n} numbers or a dict with 'rewards'") from None
    if len(values) < n:
        raise RewardError(f"{source.what} returned {len(values)} {key} for {n} samples: "
                          f"nothing for {sample(len(values))}")
    if len(values) > n:
        raise RewardError(f"{source.what} returned {len(values)} {key} for {n} samples")
    return [_number(source, key, v, lambda i=i: sample(i)) for i, v in enumerate(values)]


def _number(source: RewardSource, key: str, value: Any, where: Callable[[], str]) -> float:
    """``value`` as a finite float; ``where()`` describes it in an error (built only then)."""
    try:
        number = None if isinstance(value, (str, bytes)) else float(value)
    except (TypeError, ValueError):
        number = None
    if number is None:
        raise RewardError(f"{source.what} returned {key} {_shorten(value)} of type "
                          f"{type(value).__name__} for {where()}: not a number")
    if not math.isfinite(number):
        raise RewardError(f"{source.what} returned {key} {number} for {where()}")
    return number


def _shorten(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS - 3] + "..."
