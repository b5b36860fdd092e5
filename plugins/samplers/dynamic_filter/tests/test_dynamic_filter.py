import pytest

from rlx.config import ConfigError
from rlx.plugins import build_host


def test_keeps_only_groups_strictly_inside_the_bounds():
    sampler = build_host().get("register_samplers", "dynamic_filter")({})
    assert sampler.keep([[1, 1, 1], [0, 0, 0], [1, 0, 0], [0.5, 0.5]]) == [False, False, True, True]
    assert sampler.max_rounds == 3


def test_options_are_checked():
    factory = build_host().get("register_samplers", "dynamic_filter")
    assert factory({"low": 0.2, "high": 0.8}).keep([[0.1], [0.5], [0.9]]) == [False, True, False]
    with pytest.raises(ConfigError, match="algorithm.sampler_options.max_round"):
        factory({"max_round": 2})
