"""The process a student's answers run in while the grader checks them, and the grader's handle on it.

The grader (:mod:`logitlab.course.grade`) takes from a notebook the source of the function an
exercise asks for and sends it here; the check runs in the grader's own process and calls the
function through a pipe, one JSON request per line, getting back plain data
(:mod:`logitlab.course.wire`). Code here can change only the values that come back.

Three guards, from the outside in:

* **the jail** (:mod:`logitlab.course.jail`): the process runs in its own PID, network and
  mount namespaces, sees read-only only what Python and the library need, writes only its scratch
  folder, and dies with everything it started when the grader ends it;
* **the lock**, before any of the student's code runs: it can open no new file descriptor (only
  its two pipes stay), and an audit hook (:func:`sys.addaudithook`) refuses new processes and
  threads, ctypes, signals, resource limits, loading modules, changing the trace, reading or
  replacing a function's code object, and the garbage collector's object lists;
* **the tracer**: from the lock on, any function of the library that starts running (reached by
  any name, from any of the student's code), other than those the exercise allows and this
  sandbox's own, ends the process at once with :data:`LIBRARY_RAN`, after saying which function it
  was. Nothing in the process can undo that.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from .wire import decode, encode, safe_name, write_back

PACKAGE = Path(__file__).resolve().parents[1]  # the library's folder
LIBRARY_RAN = 86  # the sandbox's exit status when the library's code ran inside a student's function

_REFUSED = frozenset({
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "subprocess.Popen",
    "pty.spawn", "os.kill", "os.killpg", "signal.pthread_kill", "sys.settrace", "sys.setprofile",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "os.remove", "os.rename", "os.rmdir",
    "os.mkdir", "os.chmod", "os.chown", "os.utime", "os.truncate", "os.link", "os.symlink", "os.mkfifo",
    "os.mknod", "os.setxattr", "os.removexattr", "os.chflags", "os.lchflags", "shutil.rmtree",
    "webbrowser.open", "os.startfile", "code.__new__", "function.__new__"})
# Attributes that hand out code objects: with one, a student could run the library's code under
# a name and globals of their own, which the tracer would not recognise.
_CODE_ATTRIBUTES = frozenset({"__code__", "f_code", "gi_code", "cr_code", "ag_code"})


def _audit_hook(inside: list):
    """The sandbox's audit hook. A closure, so that nothing the student's code can reach refers to
    it; what it uses is bound here, so that patching builtins or modules cannot change it. While
    ``inside[0]`` (the tracer at work, never the student's code) code objects may be read."""
    refused, startswith, getrlimit, nofile = _REFUSED, str.startswith, resource.getrlimit, resource.RLIMIT_NOFILE
    code_attributes = _CODE_ATTRIBUTES

    def hook(event, args):
        if inside[0]:
            return
        if (event in refused or startswith(event, "socket.") or (event == "import" and "_posixsubprocess" in args[0])
                or (event in ("object.__getattr__", "object.__setattr__") and args[1] in code_attributes)
                # once the descriptors are locked: ctypes and resource limits (imports before may use them),
                # and loading any module (no file can be opened, but an extension already loaded could be)
                or (startswith(event, ("ctypes.", "resource.", "import")) and getrlimit(nofile)[1] <= 2)):
            raise PermissionError(f"the grader's sandbox does not allow {event}")

    return hook


def _refuse_threads():
    """A thread would run without the tracer: no new ones (3.11 has no audit event for them)."""
    def refused(*args, **kwargs):
        raise PermissionError("the grader's sandbox does not allow new threads")

    import _thread
    import threading

    _thread.start_new_thread = threading._start_new_thread = refused


def _tracer(allowed_codes, inside: list, replies: int):
    """The library tracer (:func:`logitlab.course.checks.common.library_tracer`), always armed,
    that reports the first library function to run and ends the process."""
    from .checks.common import library_tracer

    write, exit_ = os.write, os._exit

    def ran(name):
        with contextlib.suppress(BaseException):
            write(replies, json.dumps({"library": name}).encode() + b"\n")
        exit_(LIBRARY_RAN)

    trace = library_tracer(allowed_codes, [True], ran, exempt=frozenset({"logitlab", __name__, decode.__module__}))

    def guarded(frame, event, arg):  # the tracer may read code objects, which the hook refuses to others
        inside[0] = True
        try:
            return trace(frame, event, arg)
        except BaseException:  # a tracer that fails is switched off by Python: end the process instead
            exit_(LIBRARY_RAN + 1)
        finally:
            inside[0] = False

    return guarded


def _resolve(name: str):
    import importlib
    import inspect

    module, _, qualname = name.partition(":")
    found = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return inspect.unwrap(found)


def _lock_down(imports, allowed) -> None:
    """(In the sandbox, before any student code.) Import what the exercises import, then close
    every way out: the tracer, the audit hook, no new threads, and no new file descriptor (only
    the two pipes, 0 and 1, stay)."""
    import importlib

    replies, quiet = os.dup(1), open(os.devnull, "w")
    for fd in (1, 2):  # what is printed from here on goes nowhere; fd 1 is the grader's pipe again below
        os.dup2(quiet.fileno(), fd)
    sys.stdout = sys.stderr = quiet
    inside = [False]
    allowed_codes = frozenset(_resolve(name).__code__ for name in allowed)
    tracer = _tracer(allowed_codes, inside, 1)
    sys.addaudithook(_audit_hook(inside))
    for name in sorted(imports):  # a library module among them runs its body: before the tracer
        with contextlib.suppress(BaseException):
            importlib.import_module(name)
    inside[0] = True  # the hook refuses sys.settrace to everyone else
    sys.settrace(tracer)
    inside[0] = False
    _refuse_threads()
    sys.gettrace = lambda: None  # the tracer stays out of reach
    for module, name in [("_posixsubprocess", "fork_exec"), ("subprocess", "_fork_exec")]:
        if module in sys.modules:  # it forks without an audit event
            setattr(sys.modules[module], name, None)
    os.dup2(replies, 1)
    os.close(replies)
    resource.setrlimit(resource.RLIMIT_NOFILE, (2, 2))


def _define(message: dict):
    """Run an exercise's statements in a fresh namespace; return (the function, the reply)."""
    import builtins

    namespace, errors = {"__name__": "__main__", "__builtins__": builtins}, []
    for number, statement in enumerate(message["define"]):
        try:
            exec(compile(statement, "<notebook>", "exec"), namespace)
        except BaseException as error:  # the notebook's run reports it too
            if number >= message["own"]:  # the exercise's cell: why its function may be missing
                errors.append(f"{type(error).__name__}: {_text(error)}")
    try:
        return eval(message["argument"], namespace), {"defined": True}
    except BaseException as error:
        return None, {"error": errors[0] if errors else f"{type(error).__name__}: {_text(error)}"}


def _text(error: BaseException) -> str:
    try:
        text = str(error)[:2000]
    except BaseException:
        return ""
    return text + (" (the grader runs your code with no access to files)" if "Too many open files" in text else "")


def _call(function, message: dict) -> dict:
    """Call the student's function on the check's arguments; what it returns and what it left in
    its arguments go back. The tracer is on all the while."""
    try:
        args = decode(message["call"])
        value = function(*args)
        return {"value": encode(value, args), "args": encode(args)}
    except BaseException as error:
        return {"raised": type(error).__name__, "message": _text(error)}


def serve() -> None:
    """(The sandbox's main loop.) One JSON request per line on stdin, one reply per line on stdout."""
    requests, replies = open(0, "rb", closefd=False), open(1, "wb", buffering=0, closefd=False)
    first = json.loads(requests.readline())
    _lock_down(first["imports"], first["allowed"])
    replies.write(b'{"ready": true}\n')
    function = None
    for line in requests:
        message = json.loads(line)
        if "define" in message:
            function, reply = _define(message)
        else:
            reply = _call(function, message)
        try:
            data = json.dumps(reply).encode()
        except BaseException as error:
            data = json.dumps({"raised": type(error).__name__, "message": _text(error)}).encode()
        replies.write(data + b"\n")


# The grader's side.

class SandboxTimeout(BaseException):
    """The sandbox ran out of time (a BaseException: a check's ``except Exception`` lets it through)."""


class ProcessEnded(Exception):
    """The process running the student's code ended, or answered out of turn."""


class DefinitionError(Exception):
    """The exercise's code did not give a function to check (the message says why)."""


def limits(memory_bytes):
    """What a child runs before anything else: its own process group, a memory cap."""
    def apply():
        os.setsid()
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))

    return apply


def function_name(function) -> str:
    """``module:qualname``, as the sandbox resolves it."""
    import inspect

    function = inspect.unwrap(function)
    return f"{function.__module__}:{function.__qualname__}"


class Sandbox:
    """A fresh Python process for one submission's code: see the module's docstring. ``jailed``
    runs it through :mod:`logitlab.course.jail`; ``allowed``, the library functions the
    submission's exercises allow (``module:qualname``)."""

    LIMIT = 256 * 2**20  # bytes in one reply

    def __init__(self, scratch: Path, imports, allowed, memory_gb: float, deadline: float, *, jailed: bool = True):
        scratch.mkdir(parents=True, exist_ok=True)
        self.deadline = deadline
        boot = f"import sys; sys.path.insert(0, {str(PACKAGE.parent)!r}); from logitlab.course.sandbox import serve; serve()"
        env = {"HOME": str(scratch), "TMPDIR": str(scratch), "MPLBACKEND": "Agg", "PATH": "/usr/bin:/bin",
               "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "LANG": "C.UTF-8"}
        command = [sys.executable, "-I", "-B", "-c", boot]
        if jailed:
            command = jailed_python(command, scratch, env)
        with open(scratch / "sandbox.log", "wb") as log:  # what the sandbox says before it is locked
            self.process = subprocess.Popen(command, cwd=scratch, env=env, stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=log,
                                            preexec_fn=limits(int(memory_gb * 2**30)))
        os.set_blocking(self.process.stdin.fileno(), False)
        self.log, self.started = scratch / "sandbox.log", False
        self.ask({"imports": sorted(imports), "allowed": sorted(allowed)})
        self.started = True

    def ask(self, message: dict) -> dict:
        """Send one request, wait (until the deadline) for its reply."""
        data, reply = json.dumps(message).encode() + b"\n", bytearray()
        w, r = self.process.stdin.fileno(), self.process.stdout.fileno()
        while data or not reply.endswith(b"\n"):
            wait = self.deadline - time.monotonic()
            if wait <= 0:
                self.close()
                raise SandboxTimeout()
            readable, writable, _ = select.select([r], [w] if data else [], [], wait)
            if writable:
                try:
                    data = data[os.write(w, data[:1 << 16]):]
                except BlockingIOError:
                    pass
                except BrokenPipeError:
                    data = b""  # it has ended: read what it said last
            if readable:
                chunk = os.read(r, 1 << 20)
                if not chunk or len(reply) + len(chunk) > self.LIMIT:
                    raise self._ended()
                reply += chunk
        try:
            answer = json.loads(reply)
        except (ValueError, RecursionError):
            raise self._ended() from None
        if not isinstance(answer, dict):
            raise self._ended()
        return answer

    def _ended(self) -> ProcessEnded:
        self.close()
        if not self.started:  # the library did not import, ...: say why
            last = self.log.read_bytes().decode(errors="replace").strip().splitlines()[-1:] or [""]
            return ProcessEnded(f"the grader's sandbox did not start: {last[0][:200]}")
        return ProcessEnded("the process running your code ended or answered out of turn")

    def define(self, statements: list[str], own: int, argument: str) -> "Remote":
        reply = self.ask({"define": statements, "own": own, "argument": argument})
        if "library" in reply:
            raise DefinitionError(f"your code ran the library's own code ({reply['library']}) while it was defined")
        if "error" in reply:
            raise DefinitionError(str(reply["error"]))
        return Remote(self, argument)

    def call(self, args: tuple):
        from .checks.common import LibraryCalled

        reply = self.ask({"call": encode(list(args))})
        if "library" in reply:  # the tracer's report; the process has ended
            self.close()
            raise LibraryCalled(str(reply["library"])[:200])
        if "raised" in reply:
            name, message = safe_name(reply["raised"]), str(reply.get("message", ""))[:2000]
            raise NotImplementedError(message) if name == "NotImplementedError" else type(name, (Exception,), {})(message)
        try:
            for old, new in zip(args, decode(reply["args"])):
                write_back(old, new)
            return decode(reply["value"], args)
        except Exception as error:  # not the data it should be
            raise ProcessEnded(f"the sandbox sent back something unreadable ({type(error).__name__})") from None

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                pipe.close()


def jailed_python(command: list[str], scratch: Path, env: dict, *readable: Path) -> list[str]:
    """``command``, a process of this Python, in the jail (:mod:`logitlab.course.jail`): it reads
    Python, its packages, the library (the teacher's guide's rubrics hidden) and ``readable``, and
    writes only ``scratch``."""
    from . import jail

    return jail.command(command, scratch=scratch, readable=[*jail.python_paths(), PACKAGE, *readable],
                        hidden=[PACKAGE / "data" / "exercises.yml"], env=env)


class Remote:
    """The student's function as the check sees it: each call runs in the sandbox."""

    def __init__(self, sandbox: Sandbox, name: str):
        self.sandbox, self.__name__ = sandbox, name

    def __call__(self, *args):
        return self.sandbox.call(args)
