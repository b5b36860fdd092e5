"""Where a training run's host time goes after its first step: a local plugin that runs
cProfile from the end of step 1 to the end of the run and prints the functions that took
longest (their own time and with what they call). Time the host spends waiting for the GPU
shows up in the call that waits (a ``.item()``, ``.tolist()``, an event's synchronize).

    PYTHONPATH=benchmarks rlx train ... --plugin step_profile:plugin [RLX_PROFILE_OUT=FILE]

The stats are printed on stdout and, with ``RLX_PROFILE_OUT``, saved for ``pstats``.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats

import pluggy

hookimpl = pluggy.HookimplMarker("rlx")


class StepProfile:
    def __init__(self):
        self.profile = None

    @hookimpl
    def on_step_end(self, step: int, metrics: dict[str, float]) -> None:
        if step == 1:
            self.profile = cProfile.Profile()
            self.profile.enable()

    @hookimpl
    def on_train_end(self, output_dir: str, metrics: dict[str, float]) -> None:
        if self.profile is None:
            return
        self.profile.disable()
        if os.environ.get("RLX_PROFILE_OUT"):
            self.profile.dump_stats(os.environ["RLX_PROFILE_OUT"])
        for order in ("cumulative", "tottime"):
            text = io.StringIO()
            pstats.Stats(self.profile, stream=text).sort_stats(order).print_stats(45)
            print(text.getvalue(), flush=True)


plugin = StepProfile()
