"""What an algorithm plugin registers: a frozen spec naming its parts."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Literal


@dataclass(frozen=True)
class AlgorithmSpec:
    """An algorithm is a combination of registered parts, chosen by name.

    ``loop`` picks the trainer: ``"offline"`` (SFT, reward models, DPO, KTO) or
    ``"online"`` (PPO, GRPO ...). ``data`` names the row format the offline loop reads:
    ``"sft"`` (prompt + response or messages), ``"pairs"`` (prompt, chosen, rejected)
    or ``"unpaired"`` (prompt, completion, desirable flag); online algorithms read
    ``"prompts"``. ``head`` is ``"lm"`` for a causal LM and ``"value"`` for a model with a
    scalar head (reward models).

    ``config`` is the algorithm's config dataclass: its fields are the ``algorithm.*`` keys.
    An online algorithm must give one that subclasses ``rlx.config.OnlineConfig`` (the
    online loop reads its fields) and name an ``estimator`` and a ``policy_loss``.
    ``estimator``, ``policy_loss``, ``value_loss`` and ``preference_loss`` are registered
    names (of any plugin: naming another plugin's part makes yours depend on it).
    ``needs_reference`` gives an offline loss a frozen reference model (the online loop
    loads one when ``algorithm.kl_coef`` > 0). ``defaults`` maps dotted keys
    (``"training.lr"``, ``"algorithm.n_samples"``) to the values of the algorithm's demo;
    they apply only on the demo's data. A spec that breaks these rules raises
    ``PluginError`` when it is made.
    """

    name: str  # the name `rlx train --algo` takes; register the spec under it
    description: str  # one line, shown by `rlx algos list`
    loop: Literal["offline", "online"]  # the trainer that runs it
    config: type = field(default=object)  # dataclass of the algorithm.* keys (online: an OnlineConfig)
    data: Literal["sft", "pairs", "unpaired", "prompts"] = "sft"  # the row format it reads
    head: Literal["lm", "value"] = "lm"  # a causal LM, or a scalar value head (reward models)
    estimator: str | None = None  # registered advantage estimator (online)
    policy_loss: str | None = None  # registered policy loss (online)
    value_loss: str | None = None  # registered critic loss; a critic is trained when set
    preference_loss: str | None = None  # registered preference loss (pairs, unpaired data)
    needs_reference: bool = False  # offline: load a frozen reference (online: kl_coef > 0 loads one)
    defaults: dict[str, Any] = field(default_factory=dict)  # dotted keys -> values of the demo run

    def __post_init__(self) -> None:
        # checked where the spec is made, so a plugin with a bad spec is reported when it
        # loads (with its distribution) instead of failing a run halfway
        from rlx.config import check_spec

        check_spec(self)


@dataclass
class PreferenceScores:
    """What a preference loss sees: one entry per pair, tensors of shape [B].

    ``chosen``/``rejected`` are rewards (value head) or summed response log-probs (LM);
    the ``ref_*`` fields hold the frozen reference's log-probs when the algorithm needs
    one. A loss returns ``(per_pair_loss [B], {metric: per_pair_tensor [B]})``.
    """

    chosen: Any
    rejected: Any
    margin: Any = 0.0
    ref_chosen: Any = None
    ref_rejected: Any = None
    chosen_tokens: Any = None
    rejected_tokens: Any = None
    chosen_nll: Any = None


@dataclass
class UnpairedScores:
    """What an unpaired (KTO-style) loss sees: one entry per example, tensors of shape [B].

    ``logratio`` is log π − log π_ref summed over the completion; ``kl_ref_point`` the
    detached mean of that log-ratio on mismatched prompt/completion pairs of the
    optimizer step (a 0-d tensor; the loss clamps it at 0); ``desirable`` a bool tensor.
    ``policy``/``reference`` are the summed log-probs themselves, ``tokens`` the
    completion lengths, ``desirable_share`` the fraction of the step's rows that are
    desirable (to turn per-example metrics into means over one class). A loss returns
    ``(per_example_loss [B], {metric: per_example_tensor [B]})``.

    What the loop computes over the whole step before its micro-batches is what the
    loss function's ``step_statistics`` attribute names: ``"kl_ref_point"`` (also when
    it has none), ``"logratios"`` (then ``step_logratio`` holds the detached log-ratios
    of all the step's rows, ``step_desirable`` their flags, and ``kl_ref_point`` is
    None) or ``"none"`` (``kl_ref_point`` is None).
    """

    logratio: Any
    kl_ref_point: Any
    desirable: Any
    policy: Any = None
    reference: Any = None
    tokens: Any = None
    desirable_share: float = 0.5
    step_logratio: Any = None
    step_desirable: Any = None


def call_with_accepted(fn: Callable, *args, **kwargs):
    """Call a registered part with the keyword arguments it takes: hooks gain arguments
    over time, and a part written before an argument existed keeps working without it."""
    params = inspect.signature(fn).parameters.values()
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        names = {p.name for p in params}
        kwargs = {k: v for k, v in kwargs.items() if k in names}
    return fn(*args, **kwargs)


def check_loss_output(kind: str, name: str, loss: Any, metrics: Any, mask: Any) -> None:
    """Fail, naming the loss and the key, when a registered loss breaks its contract:
    a per-token loss shaped like ``mask`` and a dict of scalar metrics (floats or 0-d
    tensors; the loop sums them over micro-batches and ranks)."""
    from rlx.errors import PluginError

    if getattr(loss, "shape", None) != mask.shape:
        raise PluginError(f"{kind} {name!r} returned a loss of shape {tuple(getattr(loss, 'shape', ()))}; "
                          f"it must be per token, shaped like the mask {tuple(mask.shape)}")
    if not isinstance(metrics, dict):
        raise PluginError(f"{kind} {name!r} returned metrics of type {type(metrics).__name__}, not a dict")
    for key, value in metrics.items():
        if not (isinstance(value, (int, float)) or getattr(value, "numel", lambda: 0)() == 1):
            shape = tuple(getattr(value, "shape", ()))
            raise PluginError(f"{kind} {name!r} returned metric {key!r} of shape {shape or type(value).__name__}; "
                              f"a metric must be a scalar (a float or a 0-d tensor, e.g. ops.masked_mean(x, mask))")
