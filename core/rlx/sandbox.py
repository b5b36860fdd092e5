"""Run a tool call or a model's code in a separate, limited Python process.

``run_code(source)`` runs Python source; ``run_function(fn, *args)`` calls a function
that the child can import by name (``module.function``; it is sent by reference). Each
call gets a fresh interpreter (``python -I``) in its own empty temporary folder, which
is its working folder, HOME and TMPDIR and is deleted afterwards, with an environment
holding nothing of the run's. The call returns a ``SandboxResult``; nothing the child
does raises in the caller.

Hard limits (the kernel or this process enforce them): wall time (the whole process
group is killed), address space (``RLIMIT_AS``: allocations beyond it raise
MemoryError), CPU time and file size (``RLIMIT_CPU``, ``RLIMIT_FSIZE``), and the
combined size of stdout and stderr (the process is killed when it goes over).

Where the machine allows user namespaces (``kernel_isolation()``), the child also runs
in namespaces of its own: no network, no other processes in sight, and every mount
read-only but its folder.

A policy inside the child (a ``sys.addaudithook`` hook, ``rlx.sandbox_child``) refuses
writes outside its folder, reads outside its folder and the Python installation, new
processes, sockets and ctypes. It stops ordinary code, whether buggy or naively
hostile; it is not a security boundary against code written to defeat it (Python
cannot fully sandbox itself; PEP 578), and reads are refused by it alone. For code
from an adversary, run the whole tool server in a container or VM as well.
docs/sandbox.md says the same with examples.

The result comes back as JSON on a pipe of its own: nothing the child sends is
unpickled here.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pickle
import selectors
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

_CHILD = "from rlx.sandbox_child import main; main()"
_MAX_RESULT = 16 * 1024 * 1024  # bytes of JSON result read back at most

# Run in new user, mount, network and process-id namespaces (``unshare``), this makes every mount
# read-only but the sandbox's folder, keeping the flags a user namespace locks, then
# starts the child there. Exit status 97: a mount could not be changed.
_READ_ONLY = r"""
folder=$1; shift
while read -r _ target _ options _; do
  keep=""
  IFS=,
  for option in $options; do
    case $option in nosuid|nodev|noexec|noatime|nodiratime|relatime|strictatime) keep="$keep,$option";; esac
  done
  unset IFS
  mount -o "remount,bind,ro$keep" "$(printf %b "$target")" || exit 97
done < /proc/self/mounts
mount --bind "$folder" "$folder" && mount -o remount,bind,rw "$folder" && cd "$folder" || exit 97
exec "$@"
"""
_MOUNTS_FAILED = 97


@dataclass(frozen=True)
class Limits:
    seconds: float = 5.0  # wall time of the whole call, interpreter start included
    memory_mb: int = 512  # address space; the interpreter itself takes about 30 MiB
    output_bytes: int = 64 * 1024  # stdout and stderr together
    file_mb: int = 16  # largest file the code may write in its folder


@dataclass
class SandboxResult:
    """``ok`` when the code ran to its end; else ``error`` says why (the exception, or the
    limit it hit). ``value`` is a function's return value (through JSON)."""

    ok: bool
    value: Any = None
    error: str = ""
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0


def run_code(source: str, limits: Limits = Limits()) -> SandboxResult:
    """Run Python ``source`` as a script in a sandbox."""
    return _run("code", source, limits, ())


def run_function(fn: Callable, *args, limits: Limits = Limits(), **kwargs) -> SandboxResult:
    """``fn(*args, **kwargs)`` in a sandbox. ``fn`` must be importable by name in a fresh
    interpreter (a module-level function of an installed module); arguments and the
    return value must be picklable and JSON, respectively."""
    try:
        payload = pickle.dumps((fn, args, kwargs))
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        raise TypeError(f"run_function sends {fn!r} by name and its arguments pickled, which failed: {e}; "
                        f"use a module-level function of an installed module, or run_code") from None
    return _run("function", payload, limits, _package_root(fn))


def _run(kind: str, payload, limits: Limits, import_roots: tuple[str, ...]) -> SandboxResult:
    # imported here: a sandboxed function's module may import this one, and the child refuses
    # the native module behind subprocess
    import subprocess

    started = time.monotonic()
    folder = tempfile.mkdtemp(prefix="rlx-sandbox-")
    request = pickle.dumps((dataclasses.asdict(limits), _package_root(_run) + import_roots, kind, payload))
    env = {"PATH": "/usr/bin:/bin", "HOME": folder, "TMPDIR": folder, "LANG": "C.UTF-8"}
    result_read, result_write = os.pipe()
    argv = [sys.executable, "-I", "-c", _CHILD, folder, str(result_write)]
    try:
        process = subprocess.Popen(_isolated(folder, argv) if kernel_isolation() else argv, cwd=folder,
                                   env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   pass_fds=(result_write,), start_new_session=True)
    except BaseException:
        os.close(result_read)
        shutil.rmtree(folder, ignore_errors=True)
        raise
    finally:
        os.close(result_write)  # the child holds its own copy
    try:
        try:
            process.stdin.write(request)
            process.stdin.close()
        except BrokenPipeError:  # the child is gone already; its exit status tells why
            pass
        streams, error = _collect(process, result_read, limits, started + limits.seconds)
    finally:
        _kill(process)
        os.close(result_read)
        shutil.rmtree(folder, ignore_errors=True)
    stdout, stderr = (streams[k][:limits.output_bytes].decode(errors="replace") for k in ("stdout", "stderr"))
    seconds = time.monotonic() - started
    if error:
        return SandboxResult(False, error=error, stdout=stdout, stderr=stderr, seconds=seconds)
    try:
        answer = json.loads(streams["result"])
        return SandboxResult(bool(answer["ok"]), answer["value"], str(answer["error"]), stdout, stderr, seconds)
    except (ValueError, KeyError, TypeError):
        status = process.returncode
        how = f"was killed by {signal.Signals(-status).name}" if status < 0 else f"exited with status {status}"
        if status == _MOUNTS_FAILED and kernel_isolation():
            how += " (its file system could not be made read-only)"
        return SandboxResult(False, error=f"the process {how} without a result", stdout=stdout, stderr=stderr,
                             seconds=seconds)


@functools.cache
def kernel_isolation() -> bool:
    """Whether sandboxed processes run in namespaces of their own: no network, no other
    processes in sight, and a file system that is read-only except their folder. Needs
    ``unshare`` and user namespaces (some machines forbid them); tried once per process."""
    import subprocess

    if shutil.which("unshare") is None:
        return False
    with tempfile.TemporaryDirectory(prefix="rlx-sandbox-") as folder:
        try:
            probe = subprocess.run(_isolated(folder, ["true"]), capture_output=True, timeout=30, cwd=folder)
        except (OSError, subprocess.TimeoutExpired):
            return False
    return probe.returncode == 0


def _isolated(folder: str, argv: list[str]) -> list[str]:
    """``argv`` run in new namespaces, with every mount read-only but ``folder``."""
    return [shutil.which("unshare") or "unshare", "--user", "--map-root-user", "--mount", "--net", "--pid", "--fork",
            "--mount-proc", "--propagation", "private", "sh", "-c", _READ_ONLY, "sh", folder, *argv]


def _collect(process, result_fd: int, limits: Limits, deadline: float) -> tuple[dict[str, bytes], str]:
    """Read stdout, stderr and the result until all close; an error when a limit is hit first."""
    buffers = {"stdout": bytearray(), "stderr": bytearray(), "result": bytearray()}
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ, "stdout")
        selector.register(process.stderr, selectors.EVENT_READ, "stderr")
        selector.register(result_fd, selectors.EVENT_READ, "result")
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return buffers, f"timed out after {limits.seconds} s"
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                buffers[key.data] += chunk
                if len(buffers["stdout"]) + len(buffers["stderr"]) > limits.output_bytes:
                    return buffers, f"output over the limit of {limits.output_bytes} bytes"
                if len(buffers["result"]) > _MAX_RESULT:
                    return buffers, f"result over {_MAX_RESULT} bytes"
    return buffers, ""


def _kill(process) -> None:
    """End the child and anything it started (its own process group), and reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
    for stream in (process.stdin, process.stdout, process.stderr):
        stream.close()


def _package_root(fn: Callable) -> tuple[str, ...]:
    """The folder from which ``fn``'s top-level package imports (none for built-in modules):
    the child may read it and imports from it."""
    module = sys.modules.get(fn.__module__)
    if getattr(module, "__file__", None) is None:
        return ()
    return (str(Path(module.__file__).resolve().parents[module.__name__.count(".")]),)
