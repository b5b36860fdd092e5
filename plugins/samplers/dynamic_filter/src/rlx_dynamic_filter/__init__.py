"""Dynamic sampling (Yu et al. 2025, DAPO).

A prompt's group is kept only when the mean of its scores lies strictly inside
(low, high), default (0, 1): a group that is all correct or all wrong has zero
group-relative advantage and teaches nothing. The online loop replaces rejected
prompts with new ones for at most ``max_rounds`` extra generation rounds and logs the
pass rate. Enable with ``--set algorithm.sampler=dynamic_filter``; options go in
``algorithm.sampler_options`` ({low, high, max_rounds}).
"""

from dataclasses import dataclass

from rlx import hookimpl
from rlx.config import build, opt


@dataclass
class DynamicFilterOptions:
    low: float = opt(0.0, "keep groups whose mean score is above this")
    high: float = opt(1.0, "keep groups whose mean score is below this")
    max_rounds: int = opt(3, "extra generation rounds to replace rejected groups")


@dataclass
class DynamicFilter:
    low: float
    high: float
    max_rounds: int

    def keep(self, groups: list[list[float]]) -> list[bool]:
        return [self.low < sum(g) / len(g) < self.high for g in groups]


def dynamic_filter(options: dict) -> DynamicFilter:
    o = build(DynamicFilterOptions, options, "algorithm.sampler_options")
    return DynamicFilter(o.low, o.high, o.max_rounds)


@hookimpl
def register_samplers(register):
    register("dynamic_filter", dynamic_filter)
