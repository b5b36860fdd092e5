"""What runs inside a sandbox process (see ``rlx.sandbox``): limits, the audit policy, the call.

Started as ``python -I -c "from rlx.sandbox_child import main; main()" FOLDER RESULT_FD``
(inside ``unshare`` where the machine allows it). It reads one pickled request from
stdin: ``(limits, import_roots, kind, payload)``, where ``limits`` holds
``rlx.sandbox.Limits``' fields as a dict, ``import_roots`` are folders to import from
besides Python's own paths, and ``kind`` is ``"code"`` (payload: source text) or
``"function"`` (payload: the pickled ``(function, args, kwargs)``, unpickled only once
the policy is on, since unpickling imports the function's module). It writes one JSON
line to RESULT_FD: ``{"ok": bool, "value": ..., "error": str}``.

Imports are kept to modules that open no processes, sockets or native libraries, so
that nothing of the kind is already loaded when the policy starts refusing it.
"""

from __future__ import annotations

import json
import os
import pickle
import resource
import sys

# refused outright: new processes, signals to others, sockets, and native-code back doors
_REFUSED_EVENTS = {
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "subprocess.Popen",
    "pty.spawn", "os.kill", "os.killpg", "socket.__new__", "socket.connect", "socket.bind", "os.link",
}
_REFUSED_IMPORTS = {"ctypes", "_ctypes", "_posixsubprocess", "cffi", "_cffi_backend", "_xxsubinterpreters",
                    "_testcapi", "_testinternalcapi", "mmap"}
# events whose path arguments (by position) are written: all must lie inside the folder
_WRITES = {"os.remove": (0,), "os.rename": (0, 1), "os.rmdir": (0,), "os.mkdir": (0,), "os.chmod": (0,),
           "os.chown": (0,), "os.symlink": (1,), "os.truncate": (0,), "os.utime": (0,), "os.setxattr": (0,),
           "os.removexattr": (0,), "os.chflags": (0,), "shutil.rmtree": (0,), "sqlite3.connect": (0,)}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")


def main() -> None:
    folder, result_fd = os.path.realpath(sys.argv[1]), int(sys.argv[2])
    limits, import_roots, kind, payload = pickle.loads(sys.stdin.buffer.read())
    sys.stdin.close()
    result = os.fdopen(result_fd, "w")
    sys.dont_write_bytecode = True  # imports would try to write __pycache__ outside the folder

    megabytes = 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_mb"] * megabytes,) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_mb"] * megabytes,) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    cpu = int(limits["seconds"]) + 2  # a backstop: the parent kills the process at its wall-time limit
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    sys.path += [root for root in import_roots if root not in sys.path]
    readable = tuple(os.path.realpath(p) for p in sys.path if p) + (folder,)  # Python's own files and the folder
    sys.addaudithook(_policy(folder, readable))

    try:
        if kind == "code":
            exec(compile(payload, "<sandbox>", "exec"), {"__name__": "__main__"})
            line = _answer(True)
        else:
            fn, args, kwargs = pickle.loads(payload)
            line = _answer(True, fn(*args, **kwargs))
    except MemoryError:
        line = _answer(False, error=f"MemoryError: over the memory limit ({limits['memory_mb']} MiB)")
    except SystemExit as e:  # exit() and sys.exit(0) end the code without an error
        line = _answer(not e.code, error="" if not e.code else f"SystemExit: {e.code}")
    except BaseException as e:
        line = _answer(False, error=f"{type(e).__name__}: {e}")
    sys.stdout.flush()
    sys.stderr.flush()
    result.write(line + "\n")
    result.close()


def _answer(ok: bool, value=None, error: str = "") -> str:
    """The result line; a value that is not JSON raises TypeError, which ``main`` reports."""
    return json.dumps({"ok": ok, "value": value, "error": error}, allow_nan=False)


def _policy(folder: str, read_roots: tuple[str, ...]):
    """The audit hook: writes only inside ``folder``, reads only there and under ``read_roots``."""

    def inside(path, roots) -> bool:
        if isinstance(path, int):  # an open descriptor: it was checked when it was opened
            return True
        real = os.path.realpath(os.fsdecode(path))
        return real in _DEVICES or any(real == root or real.startswith(root + os.sep) for root in roots)

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool(flags & _WRITE_FLAGS)
            # a folder opened outside would give a dir_fd that relative paths escape through
            roots = (folder,) if writes or _is_folder(path) else read_roots
            if path is not None and not inside(path, roots):
                raise PermissionError(f"sandbox: {'writing' if writes else 'reading'} {path!r} is refused "
                                      f"(outside its folder)")
        elif event in _WRITES:
            for i in _WRITES[event]:
                if i < len(args) and args[i] is not None and not inside(args[i], (folder,)):
                    raise PermissionError(f"sandbox: {event} on {args[i]!r} is refused (outside its folder)")
        elif event in ("os.listdir", "os.scandir"):
            if args[0] is not None and not inside(args[0], read_roots):
                raise PermissionError(f"sandbox: listing {args[0]!r} is refused (outside its folder)")
        elif event in _REFUSED_EVENTS:
            raise PermissionError(f"sandbox: {event} is refused")
        elif event == "import" and args[0].partition(".")[0] in _REFUSED_IMPORTS:
            raise PermissionError(f"sandbox: importing {args[0]} is refused")

    return hook


def _is_folder(path) -> bool:
    return not isinstance(path, int) and path is not None and os.path.isdir(path)
