"""The sandbox contains hostile tool calls: each returns an error result within its limits,
the caller carries on, and nothing is written outside the sandbox's own folder."""

import dataclasses
import os
import tempfile
import time
from pathlib import Path

import pytest

from e2e import snapshot
from rlx.sandbox import Limits, SandboxResult, run_code, run_function
from rlx.tools import CALCULATOR_LIMITS, arithmetic, calculator

# generous time for a loaded machine; the infinite loop alone runs to its (short) limit
LIMITS = Limits(seconds=10.0, memory_mb=256, output_bytes=2048, file_mb=8)


@pytest.fixture
def run_folder(tmp_path):
    """A run's output folder, as hostile code would find it."""
    folder = tmp_path / "run"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "metrics.jsonl").write_text('{"step": 1}\n')
    return folder


def test_code_runs_in_its_own_empty_folder_with_a_scrubbed_environment(monkeypatch):
    monkeypatch.setenv("RLX_SECRET_TOKEN", "hunter2")
    result = run_code("import os, json\n"
                      "open('notes.txt', 'w').write('kept inside')\n"
                      "print(json.dumps({'cwd': os.getcwd(), 'files': sorted(os.listdir('.')), 'env': dict(os.environ),"
                      " 'read': open('notes.txt').read()}))", LIMITS)
    assert result.ok, result.error
    seen = __import__("json").loads(result.stdout)
    assert Path(seen["cwd"]).name.startswith("rlx-sandbox-") and seen["files"] == ["notes.txt"]
    assert seen["read"] == "kept inside"
    assert "RLX_SECRET_TOKEN" not in seen["env"] and seen["env"]["HOME"] == seen["cwd"]
    assert not Path(seen["cwd"]).exists()  # removed afterwards


def test_a_function_runs_by_name_and_returns_its_value():
    result = run_function(arithmetic, "2 ** 10 - 24")
    assert result == SandboxResult(True, 1000, "", "", "", result.seconds)
    with pytest.raises(TypeError, match="by name"):
        run_function(lambda: 1)


def escape_target(name: str) -> Path:
    return Path(tempfile.gettempdir()) / f"rlx-escape-{os.getpid()}-{name}"


HOSTILE = {
    "infinite loop": ("while True:\n    pass", "timed out after 1.5 s"),
    "huge output": ("while True:\n    print('spam' * 100)", "output over the limit of 2048 bytes"),
    "memory bomb": ("blocks = []\nwhile True:\n    blocks.append(bytearray(10 ** 7))",
                    "MemoryError: over the memory limit (256 MiB)"),
    "fill the disk": ("with open('big', 'wb') as f:\n    for _ in range(64):\n        f.write(bytes(2 ** 20))",
                      "OSError: [Errno 27] File too large"),
    "write to /tmp": ("open({tmp!r}, 'w').write('x')", "writing {tmp!r} is refused"),
    "overwrite run file": ("open({run!r} + '/metrics.jsonl', 'a').write('{{}}')", "writing "),
    "create in run folder": ("import pathlib; pathlib.Path({run!r}, 'checkpoints', 'evil').write_text('x')",
                             "writing "),
    "delete run file": ("import os; os.remove({run!r} + '/metrics.jsonl')", "os.remove on "),
    "move run folder": ("import os; os.rename({run!r}, 'stolen')", "os.rename on "),
    "symlink out": ("import os; os.symlink({tmp!r}, 'link'); open('link', 'w').write('x')", "writing 'link'"),
    "folder descriptor": ("import os, sys; fd = os.open(os.path.dirname(os.__file__), os.O_RDONLY)\n"
                          "os.open('evil.pth', os.O_WRONLY | os.O_CREAT, dir_fd=fd)", "reading "),
    "read run file": ("print(open({run!r} + '/metrics.jsonl').read())", "reading "),
    "shell": ("import os; os.system('touch ' + {tmp!r})", "os.system is refused"),
    "subprocess": ("import subprocess; subprocess.run(['touch', {tmp!r}])", "_posixsubprocess is refused"),
    "network": ("import socket; socket.create_connection(('127.0.0.1', 9))", "socket.__new__ is refused"),
    "native code": ("import ctypes", "importing ctypes is refused"),
    "hard exit": ("import os; os._exit(7)", "exited with status 7 without a result"),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_code_is_contained(name, run_folder):
    code, message = HOSTILE[name]
    tmp = str(escape_target(name.replace(" ", "-")))
    before = snapshot(run_folder)
    limits = dataclasses.replace(LIMITS, seconds=1.5) if name == "infinite loop" else LIMITS
    started = time.monotonic()
    result = run_code(code.format(tmp=tmp, run=str(run_folder)), limits)
    assert time.monotonic() - started < limits.seconds + 2
    assert not result.ok and message.format(tmp=tmp) in result.error, result.error
    assert len(result.stdout) + len(result.stderr) <= 2 * LIMITS.output_bytes
    assert snapshot(run_folder) == before and not os.path.lexists(tmp)


@pytest.mark.parametrize("expression, answer", [
    ("2 + 3 * 4", "14"), ("(1 + 2) / 4", "0.75"), ("sqrt(16) + 2 ** -1", "4.5"), ("-7 // 2 % 5", "1"),
    ("1 / 0", "error: ZeroDivisionError: division by zero"),
    ("__import__('os').system('ls')", "error: ValueError: not arithmetic: \"__import__('os').system('ls')\""),
    ("(1).__class__", "error: ValueError: not arithmetic: '1 .__class__'"),
])
def test_calculator(expression, answer):
    assert calculator(expression, dataclasses.replace(CALCULATOR_LIMITS, seconds=10.0)) == answer  # a busy machine


def test_calculator_survives_an_expression_that_never_ends():
    started = time.monotonic()
    assert calculator("9 ** 9 ** 9 ** 9", Limits(seconds=1.0)) == "error: timed out after 1.0 s"
    assert time.monotonic() - started < 3


def test_namespaces_hide_processes_make_the_file_system_read_only_and_cut_the_network(tmp_path):
    """The kernel's layer on its own: a plain process (no audit policy) under ``_isolated``."""
    import subprocess
    import sys

    from rlx.sandbox import _isolated, kernel_isolation

    folder, outside = tmp_path / "box", tmp_path / "outside.txt"
    folder.mkdir()
    code = ("import socket, sys\n"
            "import os\n"
            "open('inside.txt', 'w').write('ok')\n"
            "print(os.getpid(), len([p for p in os.listdir('/proc') if p.isdigit()]))\n"
            f"for attempt in (lambda: open({str(outside)!r}, 'w'),\n"
            "                lambda: socket.create_connection(('127.0.0.1', 9))):\n"
            "    try:\n        attempt()\n    except OSError as e:\n        print(e.errno)\n")
    run = subprocess.run(_isolated(str(folder), [sys.executable, "-I", "-c", code]), capture_output=True, text=True,
                         cwd=folder, timeout=60)
    if kernel_isolation():
        # process 1 of its own namespace, alone in it; then EROFS and ENETUNREACH
        assert run.stdout.split() == ["1", "1", "30", "101"], run.stderr
        assert (folder / "inside.txt").read_text() == "ok" and not outside.exists()
    else:  # the machine refuses the namespaces: the sandbox rightly runs on the policy alone
        assert run.returncode != 0
