"""What an algorithm plugin registers: a frozen spec naming its parts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class AlgorithmSpec:
    """An algorithm is a combination of registered parts, chosen by name.

    ``loop`` picks the trainer: ``"offline"`` (SFT, reward models, DPO, KTO) or
    ``"online"`` (PPO, GRPO ...). ``data`` names the row format the offline loop reads:
    ``"sft"`` (prompt + response or messages), ``"pairs"`` (prompt, chosen, rejected)
    or ``"unpaired"`` (prompt, completion, desirable flag). ``head`` is ``"lm"`` for a
    causal LM and ``"value"`` for a model with a scalar head (reward models).
    """

    name: str
    description: str
    loop: Literal["offline", "online"]
    config: type = field(default=object)
    data: Literal["sft", "pairs", "unpaired", "prompts"] = "sft"
    head: Literal["lm", "value"] = "lm"
    estimator: str | None = None
    policy_loss: str | None = None
    value_loss: str | None = None
    preference_loss: str | None = None
    needs_reference: bool = False
    defaults: dict[str, Any] = field(default_factory=dict)  # dotted overrides of the run config


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
    """

    logratio: Any
    kl_ref_point: Any
    desirable: Any
    policy: Any = None
    reference: Any = None
    tokens: Any = None
    desirable_share: float = 0.5
