"""The operating-system sandbox that a student's code runs in while it is graded.

Each run (the process that answers the checks' calls, or a notebook's own run) is started
inside Linux namespaces by bubblewrap (``bwrap``, Debian's package ``bubblewrap``), which a
normal user can run on most Linux systems:

* a new **PID namespace**: when the run's first process ends, or the grader kills it, every
  process it started dies with it (nothing it forks can outlive it and rewrite the grades later);
* a new **network namespace** with only its own loopback: no network at all;
* a **file system of its own**, made of read-only views of what Python and the library need (the
  system's ``/usr`` and ``/etc``, the Python installation, its site-packages, the library, and for
  a notebook's run the model cache), a private ``/tmp``, and one writable folder, the run's
  scratch folder. Nothing else exists there: not the answer key (the chapters and the teacher's
  guide's rubrics, hidden even where they sit inside the library), not the other submissions, not
  the grade sheet;
* no capabilities, and new user, IPC, UTS and cgroup namespaces.

It cannot stop a run from using all of its time or memory (the grader's limits do), nor from
reading what the library and Python installation hold (the library is public anyway).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

# The system folders a Python process needs, read-only (on a merged-/usr system /bin, /lib, ...
# are symbolic links into /usr, and are made as links).
SYSTEM = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt"]

INSTALL = "install Debian's bubblewrap (apt-get install bubblewrap) or your system's package of it"


class JailUnavailable(RuntimeError):
    """bubblewrap is missing, or cannot make namespaces here (the message says which, and what to do)."""


@functools.cache
def check() -> None:
    """Raise :class:`JailUnavailable` unless a jailed ``true`` runs here (once per process)."""
    if shutil.which("bwrap") is None:
        raise JailUnavailable(f"the grader runs students' code in a sandbox made by bubblewrap (bwrap), which is not "
                              f"installed: {INSTALL}")
    probe = command(["true"], scratch=Path("/"), readable=[], writable=False)
    result = subprocess.run(probe, capture_output=True, text=True)
    if result.returncode != 0:
        raise JailUnavailable(
            f"bubblewrap could not make a sandbox here ({result.stderr.strip()[:300]}): the system must allow "
            "unprivileged user namespaces (on Ubuntu 24.04, an AppArmor profile for bwrap; in Docker, "
            "--security-opt seccomp=unconfined or grading outside the container)")


def python_paths() -> list[Path]:
    """The folders this Python's installation and its packages live in, which a jailed Python needs
    to read: the prefixes, and every folder of ``sys.path`` except the current one (which may be
    the book's checkout, with the answer key)."""
    here = Path.cwd().resolve()
    found = [Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix), Path(sys.executable).resolve().parent]
    for entry in sys.path:
        path = Path(entry).resolve() if entry else here
        if path != here and path.exists():
            found.append(path if path.is_dir() else path.parent)
    return found


def _outermost(paths) -> list[Path]:
    """``paths`` without those inside another (binding a folder binds what it holds)."""
    paths = sorted({Path(p) for p in paths}, key=lambda p: len(p.parts))
    kept = []
    for path in paths:
        if not any(path == k or k in path.parents for k in kept):
            kept.append(path)
    return kept


def command(argv: list[str], *, scratch: Path, readable: list[Path], hidden: list[Path] = (),
            writable: bool = True, env: dict[str, str] | None = None) -> list[str]:
    """``argv`` run in the jail: ``readable`` folders or files visible read-only (beside the
    system's), ``hidden`` files inside them replaced by an empty one, ``scratch`` the one writable
    folder and the working directory, ``env`` the whole environment (nothing else is inherited)."""
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for name in SYSTEM:
        if os.path.islink(name):
            args += ["--symlink", os.readlink(name), name]
        elif os.path.isdir(name):
            args += ["--ro-bind", name, name]
    for path in _outermost(p for p in readable if Path(p).exists()):
        if not str(path).startswith(tuple(s + "/" for s in SYSTEM)):
            args += ["--ro-bind", str(path), str(path)]
    for path in hidden:
        if Path(path).exists():
            args += ["--ro-bind", "/dev/null", str(path)]
    if writable:
        args += ["--bind", str(scratch), str(scratch)]
    args += ["--chdir", str(scratch), "--clearenv"]
    for key, value in (env or {}).items():
        args += ["--setenv", key, value]
    return args + ["--", *argv]
