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
