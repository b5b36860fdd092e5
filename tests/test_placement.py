"""Where the Ray launcher puts each rank: bundles of one placement group and each actor's
share of its slot (pure bookkeeping; the launchers' tests run it on a real cluster)."""

import pytest

from rlx.config import ConfigError
from rlx.launch.placement import Slot, parse_colocate, plan

ROLES = {"reward": (1, 0), "policy": (2, 1), "reference": (1, 1), "critic": (2, 1), "rollout": (1, 2)}


def test_every_rank_gets_a_slot_of_its_own_without_colocation():
    bundles, slots = plan(ROLES, [], gpus=True)
    assert bundles == [{"CPU": 1.0}, {"CPU": 1.0, "GPU": 1.0}, {"CPU": 1.0, "GPU": 1.0}, {"CPU": 1.0, "GPU": 1.0},
                       {"CPU": 1.0, "GPU": 1.0}, {"CPU": 1.0, "GPU": 1.0}, {"CPU": 1.0, "GPU": 2.0}]
    assert slots["policy"] == [Slot(1, 1.0, 1.0), Slot(2, 1.0, 1.0)]
    assert slots["rollout"] == [Slot(6, 1.0, 2.0)]  # a tensor-parallel engine takes its two GPUs
    assert slots["reward"] == [Slot(0, 1.0, 0.0)]  # rule rewards need no GPU


def test_colocated_roles_split_their_slots():
    groups = parse_colocate(["policy,reference", "critic,reward"], list(ROLES))
    bundles, slots = plan(ROLES, groups, gpus=True)
    assert len(bundles) == 5  # policy+reference: 2, critic+reward: 2, rollout: 1
    assert slots["policy"] == [Slot(0, 0.5, 0.5), Slot(1, 1.0, 1.0)]  # the reference shares rank 0's GPU
    assert slots["reference"] == [Slot(0, 0.5, 0.5)]
    assert slots["critic"][0] == Slot(2, 0.5, 0.5) and slots["reward"] == [Slot(2, 0.5, 0.0)]


def test_everything_on_the_same_devices():
    bundles, slots = plan(ROLES, parse_colocate(["all"], list(ROLES)), gpus=True)
    assert bundles == [{"CPU": 1.0, "GPU": 2.0}, {"CPU": 1.0, "GPU": 2.0}]
    assert {r: [s.bundle for s in v] for r, v in slots.items()} == {
        "policy": [0, 1], "reference": [0], "critic": [0, 1], "reward": [0], "rollout": [0]}
    on_first = [s for v in slots.values() for s in v if s.bundle == 0]
    assert sum(s.cpus for s in on_first) == pytest.approx(1.0)
    assert all(s.gpus == 0 for s in slots["reward"])


def test_cpu_clusters_share_logical_cpus():
    bundles, slots = plan({"policy": (1, 1), "reference": (1, 1)}, [["policy", "reference"]], gpus=False)
    assert bundles == [{"CPU": 1.0}] and slots["policy"] == [Slot(0, 0.5, 0.0)]


def test_bad_colocation_names_fail():
    with pytest.raises(ConfigError, match="unknown role 'actor'"):
        parse_colocate(["actor,reference"], [])
    with pytest.raises(ConfigError, match="policy is in two groups"):
        parse_colocate(["policy,reference", "policy,critic"], [])
    assert parse_colocate(["critic,reward"], ["policy", "reward"]) == [["reward"]]  # no critic in this run
