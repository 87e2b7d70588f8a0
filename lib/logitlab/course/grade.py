"""Grade a folder of returned notebooks: one row per student, one column per exercise.

::

    python -m logitlab.course.grade submissions/ --out grades.csv

Every ``*.ipynb`` under ``submissions/`` is one student's copy of one chapter (the student's name
is the file's name without ``.ipynb``; put each class's copies of one chapter in one folder).
Each exercise (the code cell calling ``ll.checks.check_*``) gets one of:

* ``passed``; ``failed: ...`` with the check's own explanation of the first wrong case;
* ``not attempted`` (the function still raises the placeholder's ``NotImplementedError``);
* ``error: ...`` (any other exception in that cell); ``timeout`` (the notebook, or the checking
  of its answers, ran out of time); ``missing`` (the student deleted the exercise's cell).

**The grader checks; the notebook only runs.** Nothing a notebook prints or patches counts.
For each exercise the grader takes from the notebook the source of the function it checks: the
imports, functions, classes and literal constants (``NAME = 1.5``) of the code cells before the
exercise, and the exercise's own cell up to its check call. That code runs in a *sandbox*, a
fresh Python process that imports the library anew and runs nothing else of the notebook. The
check itself runs in the grader's process, with the grader's library and torch, and calls the
student's function through a pipe: code in the sandbox can change only the values that come
back, which are plain data (numbers, strings, lists, tensors as raw bytes, in JSON; nothing is
unpickled). While the function runs, the library function the exercise asks for is out of reach
in the sandbox, as in a notebook (``checks.common.asks_for``). Before any of the student's code
runs there, the sandbox can open no new file (``RLIMIT_NOFILE`` leaves it its two pipes to the
grader, so no file, socket or pipe: not the answer key, not the other submissions), and an audit
hook (:func:`sys.addaudithook`) refuses new processes, ctypes, signals, changing resource
limits, loading modules, tracing, changes to the file system and the garbage collector's object
lists. The checks hand the function plain data (tensors, numbers, strings, lists, dicts,
generators), and what it changes in place, or a generator it draws from, is carried back. The
library stays readable in the sandbox, as it is for every student: an answer that copies it, or
rebuilds a library function the exercise asks for, is for the rubric to judge.

Every submission's answers are checked before any notebook runs. Then each notebook runs from
top to bottom in a fresh Jupyter kernel, every cell even after an error, to find what the check
alone cannot see: a cell that raises something other than the check's failure (``error: ...``),
or a notebook that runs out of time before the exercise's cell ends (``timeout``). That run can
only take points away: what it prints is never read. A notebook that is not valid JSON gets a
row saying so; one error never stops the whole run.

What isolation this is, and is not: the notebook runs in a child process with its own empty
scratch folder as working directory and home folder (a copy of the notebook in it), a time limit
(the process group is killed when it is over), a memory limit (``RLIMIT_AS`` on the process and
the kernel it starts) and the network switched off for the model hub and pip (environment
variables, not a firewall). The sandbox has the same time and memory limits. But both run as the
same user as the grader, and the notebook's run is not confined: a notebook that means harm can
read or write any file that user can, including the installed library that later gradings use.
The sandbox's limits are those of one process, not of an operating-system sandbox. For code from
people you do not trust, run the grader inside a container or a throwaway virtual machine, with
no answer key in it.
"""

from __future__ import annotations

import argparse
import ast
import base64
import contextlib
import csv
import io
import json
import os
import re
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

CHECK_CALL = re.compile(r"\bll\.checks\.(check_\w+)\(")
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PIP_NO_INDEX": "1",
           # a closed local port: any HTTP(S) request through the standard proxies fails at once
           "http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9",
           "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9", "no_proxy": ""}


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    if isinstance(source, list) and all(isinstance(line, str) for line in source):
        return "".join(source)
    return source if isinstance(source, str) else ""


def exercise_cells(nb: dict) -> dict[str, int]:
    """``{check name: index of the code cell that calls it}`` for a notebook read as JSON."""
    found = {}
    for index, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") == "code":
            for name in CHECK_CALL.findall(_source(cell)):
                found.setdefault(name, index)
    return found


# What crosses over from a notebook to the sandbox: source code, never objects.

def _python(source: str) -> str:
    """A cell's code with IPython's syntax (``%magic``, ``!command``) turned into plain calls."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:
        return source
    return TransformerManager().transform_cell(source)


def _is_definition(node: ast.stmt) -> bool:
    """An import, a function, a class, or ``NAME = literal``: what a later cell may rely on."""
    if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return True
    if isinstance(node, ast.Assign) and all(isinstance(target, ast.Name) for target in node.targets):
        try:
            ast.literal_eval(node.value)
            return True
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return False
    return False


def _calls_check(node: ast.AST, check: str) -> bool:
    func = getattr(node, "func", None)
    return (isinstance(node, ast.Call) and isinstance(func, ast.Attribute) and func.attr == check
            and isinstance(func.value, ast.Attribute) and func.value.attr == "checks"
            and isinstance(func.value.value, ast.Name) and func.value.value.id == "ll")


def exercise_code(nb: dict, check: str) -> tuple[list[str], int, str] | None:
    """What the sandbox runs for the exercise that ``check`` grades: ``(statements, own,
    argument)``, the definitions of the code cells before the exercise's (see
    :func:`_is_definition`) and then, from ``statements[own]`` on, every statement of the
    exercise's cell before its check call; and the source of the expression handed to the check.
    ``None`` if no cell calls the check; ``SyntaxError`` if the exercise's cell is not Python,
    ``ValueError`` if it does not call ``ll.checks.NAME(function)``."""
    index = exercise_cells(nb).get(check)
    if index is None:
        return None
    statements = []
    for cell in nb["cells"][:index]:
        if cell.get("cell_type") == "code":
            try:
                tree = ast.parse(_python(_source(cell)))
            except (SyntaxError, ValueError):
                continue  # that cell fails in the notebook too
            statements += [ast.unparse(node) for node in tree.body if _is_definition(node)]
    own = len(statements)
    for node in ast.parse(_python(_source(nb["cells"][index]))).body:
        call = next((n for n in ast.walk(node) if _calls_check(n, check)), None)
        if call is None:
            statements.append(ast.unparse(node))
        elif len(call.args) == 1 and not call.keywords:
            return statements, own, ast.unparse(call.args[0])
        else:
            break
    raise ValueError(f"the exercise's cell does not call ll.checks.{check}(your_function)")


def _imported(statements: list[str]) -> set[str]:
    """The modules ``statements`` import, anywhere (a function may import inside its body)."""
    names = set()
    try:
        tree = ast.parse("\n".join(statements))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return names
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)  # perhaps submodules
    return names


# The data that crosses over: JSON, with tensors as raw bytes. Decoding builds only plain types.

_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
    torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128)}


def _encode(x, args=()):
    """``x`` as JSON data. A tensor sharing memory with a tensor of ``args`` (a function that
    returns its input) is sent as a reference to it, so that the checks can tell."""
    if x is None or type(x) in (bool, int, float, str):
        return x
    if isinstance(x, torch.Tensor):
        x = x.detach()
        for i, a in enumerate(args):
            if (isinstance(a, torch.Tensor) and x.numel() and x.dtype == a.dtype and x.device == a.device
                    and x.data_ptr() == a.data_ptr()):
                return {"arg": [i, list(x.shape), list(x.stride())]}
        x = x.cpu()
        try:
            data = x.numpy().tobytes()  # in C order, whatever the strides
        except (TypeError, RuntimeError):  # a dtype numpy does not have (bfloat16)
            data = torch.empty(x.numel(), dtype=x.dtype).copy_(x.reshape(-1)).view(torch.uint8).numpy().tobytes()
        return {"tensor": [str(x.dtype).removeprefix("torch."), list(x.shape), base64.b64encode(data).decode()]}
    if isinstance(x, torch.Generator):
        return {"generator": _encode(x.get_state())}
    if isinstance(x, bool):
        return bool(x)
    for kind in (int, float, str):
        if isinstance(x, kind):
            return kind(x)
    if isinstance(x, (bytes, bytearray)):
        return {"bytes": base64.b64encode(bytes(x)).decode()}
    if isinstance(x, list):
        return [_encode(v, args) for v in x]
    if isinstance(x, tuple):
        return {"tuple": [_encode(v, args) for v in x]}
    if isinstance(x, (set, frozenset)):
        return {"set": [_encode(v, args) for v in x]}
    if isinstance(x, dict):
        return {"dict": [[_encode(k, args), _encode(v, args)] for k, v in x.items()]}
    if hasattr(x, "tolist") and hasattr(x, "dtype"):  # numpy
        return _encode(x.tolist(), args)
    return {"object": [type(x).__name__, repr(x)[:300]]}


class Unreadable:
    """A value the sandbox sent that is not plain data: only its type's name and repr are shown."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self):
        return self.text


def _name(text) -> str:
    return re.sub(r"\W", "_", str(text))[:80] or "object"


def _decode(x, args=()):
    """The inverse of :func:`_encode`; ``args`` are the tensors a reference may point to."""
    if isinstance(x, list):
        return [_decode(v, args) for v in x]
    if not isinstance(x, dict):
        return x
    [(kind, value)] = x.items()
    if kind == "tensor":
        dtype, shape, data = value
        raw = base64.b64decode(data)
        flat = torch.frombuffer(bytearray(raw), dtype=_DTYPES[dtype]) if raw else torch.empty(0, dtype=_DTYPES[dtype])
        return flat.reshape([int(n) for n in shape])
    if kind == "arg":
        index, shape, stride = value
        a = args[int(index)]
        shape, stride = [int(n) for n in shape], [int(n) for n in stride]
        return a if list(a.shape) == shape and list(a.stride()) == stride else a.as_strided(shape, stride, a.storage_offset())
    if kind == "generator":
        generator = torch.Generator(device="cpu")  # the checks hand their functions CPU generators
        generator.set_state(_decode(value))
        return generator
    if kind == "bytes":
        return base64.b64decode(value)
    if kind == "tuple":
        return tuple(_decode(v, args) for v in value)
    if kind == "set":
        return {_decode(v, args) for v in value}
    if kind == "dict":
        return {_decode(k, args): _decode(v, args) for k, v in value}
    if kind == "object":
        return type(_name(value[0]), (Unreadable,), {})(str(value[1]))
    raise ValueError(f"unknown kind of data {kind!r}")


def _write_back(old, new) -> None:
    """Leave the check's argument ``old`` as the student's function left its copy ``new``: the
    checks look for arguments changed in place, and a generator must move on."""
    if isinstance(old, torch.Generator) and isinstance(new, torch.Generator):
        old.set_state(new.get_state())
    elif isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor):
        with torch.no_grad():
            if old.shape == new.shape and old.dtype == new.dtype:
                if not torch.equal(old, new):
                    old.copy_(new)
            else:
                old.data = new
    elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            if isinstance(a, (torch.Tensor, torch.Generator, list, dict)):
                _write_back(a, b)
            else:
                old[i] = b
    elif isinstance(old, list) and isinstance(new, list):
        old[:] = new
    elif isinstance(old, dict) and isinstance(new, dict):
        old.clear()
        old.update(new)


# The sandbox's side: a fresh process, started by the grader, that answers its requests.

_REFUSED = frozenset({
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "subprocess.Popen",
    "pty.spawn", "os.kill", "os.killpg", "signal.pthread_kill", "sys.settrace", "sys.setprofile",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "os.remove", "os.rename", "os.rmdir",
    "os.mkdir", "os.chmod", "os.chown", "os.utime", "os.truncate", "os.link", "os.symlink", "os.mkfifo",
    "os.mknod", "os.setxattr", "os.removexattr", "os.chflags", "os.lchflags", "shutil.rmtree",
    "webbrowser.open", "os.startfile"})


def _audit_hook():
    """The sandbox's audit hook. A closure, so that nothing the student's code can reach refers to
    it; what it uses is bound here, so that patching builtins or modules cannot change it."""
    refused, startswith, getrlimit, nofile = _REFUSED, str.startswith, resource.getrlimit, resource.RLIMIT_NOFILE

    def hook(event, args):
        if (event in refused or startswith(event, "socket.") or (event == "import" and "_posixsubprocess" in args[0])
                # once the descriptors are locked: ctypes and resource limits (imports before may use them),
                # and loading any module (no file can be opened, but an extension already loaded could be)
                or (startswith(event, ("ctypes.", "resource.", "import")) and getrlimit(nofile)[1] <= 2)):
            raise PermissionError(f"the grader's sandbox does not allow {event}")

    return hook


def _lock_down(imports) -> None:
    """(In the sandbox, before any student code.) Import what the exercises import, then close
    every way out: no new file descriptor (only the two pipes, 0 and 1, stay), and the audit hook."""
    import importlib

    replies, quiet = os.dup(1), open(os.devnull, "w")
    for fd in (1, 2):  # what is printed from here on goes nowhere; fd 1 is the grader's pipe again below
        os.dup2(quiet.fileno(), fd)
    sys.stdout = sys.stderr = quiet
    sys.addaudithook(_audit_hook())
    for name in sorted(imports):
        with contextlib.suppress(BaseException):
            importlib.import_module(name)
    importlib.import_module(f"{__package__}.checks.common")  # what _call uses: no module loads after the lock
    for module, name in [("_posixsubprocess", "fork_exec"), ("subprocess", "_fork_exec")]:
        if module in sys.modules:  # it forks without an audit event
            setattr(sys.modules[module], name, None)
    os.dup2(replies, 1)
    os.close(replies)
    resource.setrlimit(resource.RLIMIT_NOFILE, (2, 2))


def _resolve(name: str):
    import importlib

    module, _, qualname = name.partition(":")
    found = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


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
    """Call the student's function as :func:`logitlab.course.checks.common.call` would, here."""
    from .checks.common import LibraryCalled, library_out_of_reach, own_work

    try:
        args = _decode(message["call"])
        forbidden = [_resolve(name) for name in message["forbidden"]]
        with own_work(*forbidden), library_out_of_reach():
            value = function(*args)
            return {"value": _encode(value, args), "args": _encode(args)}
    except LibraryCalled:
        return {"library": True}
    except BaseException as error:
        return {"raised": type(error).__name__, "message": _text(error)}


def _serve() -> None:
    """(The sandbox's main loop.) One JSON request per line on stdin, one reply per line on stdout."""
    requests, replies = open(0, "rb", closefd=False), open(1, "wb", buffering=0, closefd=False)
    _lock_down(json.loads(requests.readline())["imports"])
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


def _limits(memory_bytes):
    def apply():  # in the child, before it runs anything: its own process group, a memory cap
        os.setsid()
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))

    return apply


class Sandbox:
    """A fresh Python process for one submission's code: see the module's docstring."""

    LIMIT = 256 * 2**20  # bytes in one reply

    def __init__(self, scratch: Path, imports, memory_gb: float, deadline: float):
        import matplotlib

        scratch.mkdir(parents=True, exist_ok=True)
        self.deadline = deadline
        lib = str(Path(__file__).resolve().parents[2])
        boot = f"import sys; sys.path.insert(0, {lib!r}); from logitlab.course.grade import _serve; _serve()"
        env = {**os.environ, **OFFLINE, "HOME": str(scratch), "TMPDIR": str(scratch), "MPLBACKEND": "Agg",
               "MPLCONFIGDIR": matplotlib.get_configdir()}
        with open(scratch / "sandbox.log", "wb") as log:  # what the sandbox says before it is locked
            self.process = subprocess.Popen([sys.executable, "-I", "-B", "-c", boot], cwd=scratch, env=env,
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                            preexec_fn=_limits(int(memory_gb * 2**30)))
        os.set_blocking(self.process.stdin.fileno(), False)
        self.log, self.started = scratch / "sandbox.log", False
        self.ask({"imports": sorted(imports)})
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
                    raise self._ended() from None
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
        if "error" in reply:
            raise DefinitionError(str(reply["error"]))
        return Remote(self, argument)

    def call(self, args: tuple):
        from .checks import common

        forbidden = [f"{f.__module__}:{f.__qualname__}" for f in common._forbidden]
        reply = self.ask({"call": _encode(list(args)), "forbidden": forbidden})
        if "library" in reply:
            raise common.LibraryCalled()
        if "raised" in reply:
            name, message = _name(reply["raised"]), str(reply.get("message", ""))[:2000]
            raise NotImplementedError(message) if name == "NotImplementedError" else type(name, (Exception,), {})(message)
        try:
            for old, new in zip(args, _decode(reply["args"])):
                _write_back(old, new)
            return _decode(reply["value"], args)
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


class DefinitionError(Exception):
    """The exercise's code did not give a function to check (the message says why)."""


class Remote:
    """The student's function as the check sees it: each call runs in the sandbox."""

    def __init__(self, sandbox: Sandbox, name: str):
        self.sandbox, self.__name__ = sandbox, name

    def __call__(self, *args):
        return self.sandbox.call(args)


def _verdict(sandbox: Sandbox, check: str, statements: list[str], own: int, argument: str) -> str:
    from . import checks
    from .checks.common import CheckFailed

    if not check.startswith("check_") or not callable(getattr(checks, check, None)):
        return f"error: there is no check ll.checks.{check}"
    try:
        function = sandbox.define(statements, own, argument)
        with contextlib.redirect_stdout(io.StringIO()):  # the check's own "passed" line
            getattr(checks, check)(function)
        return "passed"
    except NotImplementedError:
        return "not attempted"
    except CheckFailed as failure:
        return f"failed: {str(failure).strip()}"
    except SandboxTimeout:
        return "timeout"
    except DefinitionError as error:
        return f"error: {error}"
    except Exception as error:
        text = str(error).strip().splitlines()
        return f"error: {type(error).__name__}: {text[0] if text else ''}"


def check_notebook(nb: dict, checks: list[str], scratch: Path, *, timeout: float = 600,
                   memory_gb: float = 8) -> dict[str, str]:
    """The grader's own verdict on each exercise of ``nb`` that ``checks`` names: ``passed``,
    ``failed: ...``, ``not attempted``, ``error: ...``, ``timeout`` or ``missing``. The checks run
    here; the student's functions run in a sandbox under ``scratch`` (see the module's docstring)."""
    deadline, verdicts, code = time.monotonic() + timeout, {}, {}
    for check in checks:
        try:
            found = exercise_code(nb, check)
        except SyntaxError as error:
            verdicts[check] = f"error: SyntaxError: {error.msg} (line {error.lineno} of the exercise's cell)"
            continue
        except ValueError as error:
            verdicts[check] = f"error: {error}"
            continue
        except Exception as error:  # a cell too deep for the parser, ...
            verdicts[check] = f"error: {type(error).__name__}"
            continue
        if found is None:
            verdicts[check] = "missing"
        else:
            code[check] = found
    from . import checks as library

    imports = set().union(*(_imported(statements) for statements, _, _ in code.values()))
    imports |= {f.__module__ for check in code for f in getattr(getattr(library, check, None), "asks_for", ())}
    sandbox = None
    try:
        for check, (statements, own, argument) in code.items():
            if time.monotonic() >= deadline:
                verdicts[check] = "timeout"
                continue
            try:
                if sandbox is None or not sandbox.alive:  # a fresh one after one that ended
                    sandbox = Sandbox(scratch / check, imports, memory_gb, deadline)
                verdicts[check] = _verdict(sandbox, check, statements, own, argument)
            except SandboxTimeout:
                verdicts[check] = "timeout"
            except ProcessEnded as error:
                verdicts[check] = f"error: {error}"
    finally:
        if sandbox is not None:
            sandbox.close()
    return {check: verdicts[check] for check in checks}


# The notebook's own run: it can only take points away.

def notebook_status(cell: dict, timed_out: bool) -> str | None:
    """What the notebook's own run of an exercise's cell takes away, if anything: ``error: ...``
    for an exception other than the check's (a failure, or the placeholder's
    ``NotImplementedError``, which the grader's own check reports), ``timeout`` or ``no result``
    when the cell did not finish. What the cell printed is never read."""
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            name, value = str(out.get("ename", "")), str(out.get("evalue") or "").strip()
            if name in ("CheckFailed", "NotImplementedError"):
                return None
            return f"error: {name}: {value.splitlines()[0] if value else ''}"
    if not cell.get("metadata", {}).get("execution", {}).get("iopub.status.idle"):
        return "timeout" if timed_out else "no result"
    return None


def run_in_child(notebook: Path, cell_timeout: int) -> None:
    """(Runs in the child process.) Execute ``notebook`` in place, saving it after every cell."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(notebook, as_version=4)
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(notebook.parent)}})
    client.on_cell_executed = lambda cell, cell_index, execute_reply: nbformat.write(nb, notebook)
    client.execute()
    nbformat.write(nb, notebook)


def read_submission(path: Path) -> tuple[dict | None, str]:
    """A returned notebook as JSON, or ``None`` and why not."""
    try:
        nb = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as error:
        return None, f"not a valid notebook (JSON): {error}"
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list) or not all(isinstance(c, dict) for c in nb["cells"]):
        return None, "not a valid notebook: no list of cells"
    return nb, ""


def run_submission(path: Path, scratch: Path, timeout: float, memory_gb: float) -> tuple[dict | None, str]:
    """Run one submission in ``scratch``; return (the executed notebook as JSON or None, a note)."""
    scratch.mkdir(parents=True)
    copy = scratch / "submission.ipynb"
    shutil.copy(path, copy)
    command = [sys.executable, "-m", "logitlab.course.grade", "--run-one", str(copy), "--cell-timeout", str(int(timeout))]
    # HOME is the scratch folder too, so that a notebook's files in ~ land there; the model cache
    # stays the grader's, so that no notebook dequantises the model again.
    import matplotlib

    from ..models import cache_dir

    env = {**os.environ, **OFFLINE, "HOME": str(scratch), "LOGITLAB_CACHE": str(cache_dir()),
           "MPLCONFIGDIR": matplotlib.get_configdir()}  # its font cache, not rebuilt per notebook
    child = subprocess.Popen(command, cwd=scratch, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, preexec_fn=_limits(int(memory_gb * 2**30)))
    try:
        log, note = child.communicate(timeout=timeout)[0], ""
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # the kernel too: it is in the child's process group
        log, note = child.communicate()[0], f"timed out after {timeout:.0f} s"
    executed = read_submission(copy)[0]
    if executed is None:
        return None, note or f"could not run: {_failure(child.returncode, log)}"
    return executed, note or _failure(child.returncode, log)


def _failure(returncode, log: bytes) -> str:
    if returncode == 0:
        return ""
    last = log.decode(errors="replace").strip().splitlines()[-1:] or [""]
    return f"the run ended with code {returncode}: {last[0][:200]}"


def grade_row(student: str, verdicts: dict | None, executed: dict | None, note: str, checks: list[str]) -> dict:
    """One row of the grade sheet: the grader's ``verdicts``, less what the notebook's own run
    (``executed``) takes away."""
    row = {"student": student}
    if verdicts is None or executed is None:
        return row | {check: "not graded" for check in checks} | {"passed": 0, "note": note}
    cells = exercise_cells(executed)
    for check in checks:
        row[check] = verdicts[check]
        if row[check] != "missing":
            index = cells.get(check)
            cell = executed["cells"][index] if index is not None else {}
            row[check] = notebook_status(cell, "timed out" in note) or row[check]
    missing = [c for c in checks if row[c] == "missing"]
    if missing:
        note = "; ".join(filter(None, [note, f"exercise cells deleted: {', '.join(missing)}"]))
    return row | {"passed": sum(row[c] == "passed" for c in checks), "note": note}


def grade(folder: Path, out: Path, *, timeout: float = 600, memory_gb: float = 8, checks: list[str] | None = None,
          keep: Path | None = None) -> list[dict]:
    """Grade every notebook under ``folder`` into the CSV ``out``; return the rows. The exercise
    columns are ``checks`` if given, else every check any submission calls, in notebook order.
    ``timeout`` (seconds) bounds the checking of one notebook's answers and, separately, its run;
    ``keep``, a folder, keeps each notebook as its run left it (to read what it printed)."""
    from tqdm.auto import tqdm

    submissions = sorted(folder.rglob("*.ipynb"))
    if not submissions:
        raise ValueError(f"no .ipynb notebook under {folder}")
    read = [read_submission(path) for path in submissions]
    columns = checks or list(dict.fromkeys(c for nb, _ in read if nb for c in exercise_cells(nb)))
    verdicts, runs = [], []
    with tempfile.TemporaryDirectory(prefix="logitlab-grade-") as root:
        # Every answer is checked before any notebook runs: no submission's code has run freely yet.
        for number, (nb, _) in enumerate(tqdm(read, desc="checking", unit="notebook")):
            start = time.monotonic()
            found = check_notebook(nb, columns, Path(root) / f"{number}-check", timeout=timeout,
                                   memory_gb=memory_gb) if nb else None
            verdicts.append((found, time.monotonic() - start))
        for number, (path, (nb, note)) in enumerate(tqdm(list(zip(submissions, read)), desc="running", unit="notebook")):
            start = time.monotonic()
            executed, note = run_submission(path, Path(root) / str(number), timeout, memory_gb) if nb else (None, note)
            runs.append((executed, note, time.monotonic() - start))
            if keep is not None and executed is not None:
                kept = keep / path.relative_to(folder)
                kept.parent.mkdir(parents=True, exist_ok=True)
                kept.write_text(json.dumps(executed, indent=1))
    rows = [grade_row(path.stem, found, executed, note, columns) | {"seconds": round(checking + running, 1)}
            for path, (found, checking), (executed, note, running) in zip(submissions, verdicts, runs)]
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["student", *columns, "passed", "seconds", "note"])
        writer.writeheader()
        writer.writerows(rows)
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m logitlab.course.grade", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, nargs="?", help="the returned notebooks (searched recursively)")
    parser.add_argument("--out", type=Path, default=Path("grades.csv"), help="the grade sheet (CSV)")
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds per notebook, for checking its answers and again for running it (default 600)")
    parser.add_argument("--memory-gb", type=float, default=8, help="memory per notebook in GiB (default 8)")
    parser.add_argument("--keep-executed", type=Path, metavar="FOLDER",
                        help="keep each notebook as its run left it, in FOLDER (what it printed is not graded)")
    parser.add_argument("--run-one", type=Path, help=argparse.SUPPRESS)  # the child's side
    parser.add_argument("--cell-timeout", type=int, default=600, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_one:
        return run_in_child(args.run_one, args.cell_timeout)
    if args.folder is None or not args.folder.is_dir():
        parser.error(f"folder must be a folder of returned notebooks, got {args.folder}")
    if args.timeout <= 0 or args.memory_gb <= 0:
        parser.error("--timeout and --memory-gb must be positive")
    try:
        rows = grade(args.folder, args.out, timeout=args.timeout, memory_gb=args.memory_gb, keep=args.keep_executed)
    except ValueError as error:
        parser.error(str(error))
    print(f"{len(rows)} notebooks graded into {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
