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
