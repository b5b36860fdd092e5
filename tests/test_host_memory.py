"""The allocator setting that lets CPU steps reuse freed memory instead of faulting it in again."""

import subprocess
import sys

import pytest

STEPS = """
import resource, sys
import torch
if sys.argv[1] == "keep":
    from rlx.host_memory import keep_freed_memory
    assert keep_freed_memory()
def step():
    held = [torch.ones(mib << 18) for mib in (1, 2, 4, 8, 16) * 4]  # 124 MiB of float32, as a step's activations
    del held
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc setting")
def test_later_steps_reuse_freed_memory_instead_of_faulting_it_in():
    def faults(mode):
        return int(subprocess.run([sys.executable, "-c", STEPS, mode], capture_output=True, text=True,
                                  check=True).stdout)

    default, kept = faults("default"), faults("keep")
    # Ten steps of 124 MiB (31,744 pages each). Seen here: 35,837-67,294 faults by default,
    # 256-4,352 with the blocks kept (the spread is the process's address layout).
    assert kept < 31_744 / 4
    assert default > 4 * kept


def test_a_training_run_sets_it(tmp_path, tiny_model_dir, monkeypatch):
    from e2e import train

    from rlx import run

    calls = []
    monkeypatch.setattr(run, "keep_freed_memory", lambda: calls.append(True))
    train("sft", tmp_path / "run", **{"model.path": tiny_model_dir, "training.max_steps": 1})
    assert calls == [True]


HUGE = """
import sys
from rlx.host_memory import huge_pages_for_large_tensors
if sys.argv[1] == "huge":
    assert huge_pages_for_large_tensors()
import torch
held = torch.ones(64 << 18)  # 64 MiB
rollup = open("/proc/self/smaps_rollup").read().splitlines()
print(next(int(line.split()[1]) for line in rollup if line.startswith("AnonHugePages")))
"""


def _transparent_huge_pages() -> str:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read()
    except OSError:
        return ""


@pytest.mark.skipif("[madvise]" not in _transparent_huge_pages(),
                    reason="the kernel gives huge pages on request only when its setting is madvise")
def test_large_tensors_get_huge_pages_when_asked_before_torch_loads(monkeypatch):
    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)

    def huge_kib(mode):
        return int(subprocess.run([sys.executable, "-c", HUGE, mode], capture_output=True, text=True,
                                  check=True).stdout)

    assert huge_kib("default") == 0
    assert huge_kib("huge") >= 32 << 10  # most of the 64 MiB tensor


def test_the_command_line_asks_for_huge_pages_before_torch_loads(monkeypatch):
    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)
    code = ("import os, sys; sys.argv = ['rlx', 'algos', 'list']\n"
            "from rlx_cli import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(os.environ.get('THP_MEM_ALLOC_ENABLE'), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split()[-2] == "1"
