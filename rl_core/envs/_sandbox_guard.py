"""Runs *inside* the sandbox's child process, before the model's code (never imported).

``python -I -S _sandbox_guard.py '<limits json>'`` sets the resource limits,
installs an audit hook, then runs ``main.py`` of the current directory and,
after it in the same namespace, the checker read from stdin (read first, so
the model's code cannot read it back). Limits are set here rather than in a
``preexec_fn`` because the parent is threaded, where ``preexec_fn`` may
deadlock; nothing untrusted runs before this point, so it is as strong.

The audit hook refuses: sockets (a second line behind the network
namespace, and the only line where none is available), starting processes,
loading native code with ctypes, signalling other processes, and writing,
deleting or renaming files outside the sandbox folder. It is a guard against
what a model writes, not a security boundary against a hostile native
exploit; the resource limits and the namespace are the hard walls.
"""

import json
import os
import resource
import sys
import traceback

_NETWORK = (
    "socket.__new__",
    "socket.connect",
    "socket.bind",
    "socket.getaddrinfo",
    "socket.sendto",
)
_PROCESSES = (
    "subprocess.Popen",
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "os.forkpty",
    "pty.spawn",
    "ctypes.dlopen",
    "ctypes.dlsym",
)
_PATH_EVENTS = {  # event -> indexes of its path arguments
    "os.remove": (0,),
    "os.rmdir": (0,),
    "os.mkdir": (0,),
    "os.rename": (0, 1),
    "os.link": (0, 1),
    "os.symlink": (1,),
    "os.chmod": (0,),
    "os.chown": (0,),
    "os.truncate": (0,),
    "os.utime": (0,),
    "shutil.rmtree": (0,),
    "shutil.copyfile": (1,),
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def main() -> int:
    limits = json.loads(sys.argv[1])
    checker = sys.stdin.read()
    sys.stdin.close()
    _set_limits(limits)
    os.environ.pop("PWD", None)  # bwrap's --chdir sets it; the environment stays the four
    home = os.path.realpath(os.getcwd())
    sys.addaudithook(_hook(home))
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        with open("main.py", encoding="utf-8") as f:
            source = f.read()
        exec(compile(source, "main.py", "exec"), namespace)
    except SystemExit as exc:
        if checker and exc.code not in (None, 0):
            return _exit_code(exc.code)
        if not checker:
            return _exit_code(exc.code)
    except MemoryError:
        print(
            f"MemoryError: the memory limit ({limits['memory_bytes']} bytes) was hit",
            file=sys.stderr,
        )
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    if checker:
        exec(compile(checker, "<checker>", "exec"), namespace)
    return 0


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _set_limits(limits: dict[str, int]) -> None:
    mem, cpu = limits["memory_bytes"], limits["cpu_s"]
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # soft: SIGXCPU, hard: SIGKILL
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"], limits["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"], limits["open_files"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # Counted per user (per user namespace under bwrap); root is exempt, hence the
    # pids cgroup the worker adds when it runs as root (pids_cgroup.py).
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"], limits["processes"]))


def _hook(home: str):  # type: ignore[no-untyped-def]
    def inside(path: object) -> bool:
        if isinstance(path, int):  # a file descriptor already open
            return True
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, str):
            return True  # path-like objects are converted and audited again as str
        full = os.path.realpath(path)
        return full == home or full.startswith(home + os.sep)

    def hook(event: str, args: tuple[object, ...]) -> None:
        if event in _NETWORK:
            raise PermissionError("network access is disabled in the sandbox")
        if event in _PROCESSES:
            raise PermissionError(f"{event} is not allowed in the sandbox")
        if event == "import" and args[0] in ("ctypes", "_ctypes"):
            raise PermissionError("ctypes is not allowed in the sandbox")
        if event == "os.kill" and args[0] != os.getpid():
            raise PermissionError("signalling other processes is not allowed in the sandbox")
        if event == "open":
            path, mode, flags = args
            writing = (mode is not None and any(c in str(mode) for c in "wax+")) or (
                mode is None and isinstance(flags, int) and flags & _WRITE_FLAGS
            )
            if writing and not inside(path):
                raise PermissionError(f"writing {path!r} outside the sandbox folder is not allowed")
        elif event in _PATH_EVENTS:
            for i in _PATH_EVENTS[event]:
                if i < len(args) and not inside(args[i]):
                    raise PermissionError(f"{event} on {args[i]!r} outside the sandbox folder")

    return hook


if __name__ == "__main__":
    sys.stdout.reconfigure(encoding="utf-8", errors="replace")  # type: ignore[union-attr]
    sys.exit(main())
