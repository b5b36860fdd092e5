"""Shared pieces for the tests of rlx and of its plugins; import them into a test module.

``from rlx.testing import QUIET, one_thread`` gives a module one intra-op torch thread
(autouse) and the settings that keep test runs silent. Importing this module points
``RLX_CACHE`` at a fresh temporary folder unless it is set, so built-in models made by
tests never land in ``~/.cache``.
"""

import os
import tempfile

import pytest

os.environ.setdefault("RLX_CACHE", tempfile.mkdtemp(prefix="rlx-test-cache-"))

QUIET = {"logging.progress": False, "logging.tensorboard": False}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: the tiny models gain nothing from a second one, and two
    threads on two cores slow down many times over whenever anything else runs."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
