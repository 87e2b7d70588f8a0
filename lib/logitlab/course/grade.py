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
exercise, and the exercise's own cell up to its check call. That code runs in a sandbox
(:mod:`logitlab.course.sandbox`: a fresh Python process in an operating-system jail, locked before
the student's code runs, with the library's code traced); the check runs in the grader's process,
with its random cases drawn from a seed drawn at grading time that no notebook sees, and calls
the student's function through a pipe. The grade sheet is written by the grader alone, after
every sandbox has ended.

Notebooks are graded in parallel, one worker process per core. With ``--run``, each notebook
then also runs from top to bottom in a fresh Jupyter kernel, jailed in the same way, to find
what the check alone cannot see: a cell that raises something other than the check's failure
(``error: ...``), or a notebook that runs out of time before the exercise's cell ends
(``timeout``). That run can only take points away: what it prints is never read. A notebook
that is not valid JSON gets a row saying so; one error never stops the whole run.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from .chapters import listen_in_slices
from .gradebook import counted_checks, exercise_points, known_checks, write_sheet
from .sandbox import (DefinitionError, ProcessEnded, Sandbox, SandboxTimeout, function_name, jailed_python,
                      limits)

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


def _verdict(sandbox: Sandbox, check: str, statements: list[str], own: int, argument: str, seed: int | None) -> str:
    from . import checks
    from .checks.common import CheckFailed, hidden_cases

    if not check.startswith("check_") or not callable(getattr(checks, check, None)):
        return f"error: there is no check ll.checks.{check}"
    try:
        function = sandbox.define(statements, own, argument)
        with contextlib.redirect_stdout(io.StringIO()), (hidden_cases(seed) if seed is not None else contextlib.nullcontext()):
            getattr(checks, check)(function)  # the check's own "passed" line goes nowhere
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


def _exercises(nb: dict, checks: list[str]) -> tuple[dict, dict]:
    """``(verdicts, code)``: what each check grades in ``nb`` (:func:`exercise_code`), or the
    verdict already known (``missing``, an error in the cell)."""
    verdicts, code = {}, {}
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
    return verdicts, code


def check_notebook(nb: dict, checks: list[str], scratch: Path, *, timeout: float = 600, memory_gb: float = 8,
                   seed: int | None = None, jailed: bool = True) -> dict[str, str]:
    """The grader's own verdict on each exercise of ``nb`` that ``checks`` names: ``passed``,
    ``failed: ...``, ``not attempted``, ``error: ...``, ``timeout`` or ``missing``. The checks run
    here, with their random cases drawn from ``seed`` if given (``hidden_cases``); the student's
    functions run in a sandbox under ``scratch`` (see :mod:`logitlab.course.sandbox`), jailed
    unless ``jailed`` is false."""
    from . import checks as library

    deadline = time.monotonic() + timeout
    verdicts, code = _exercises(nb, checks)
    imports = set().union(*(_imported(statements) for statements, _, _ in code.values()))
    allowed = {function_name(f) for check in code for f in getattr(getattr(library, check, None), "allows", ())}
    sandbox = None
    try:
        for check, (statements, own, argument) in code.items():
            if time.monotonic() >= deadline:
                verdicts[check] = "timeout"
                continue
            try:
                if sandbox is None or not sandbox.alive:  # a fresh one after one that ended
                    sandbox = Sandbox(scratch / check, imports, allowed, memory_gb, deadline, jailed=jailed)
                verdicts[check] = _verdict(sandbox, check, statements, own, argument, seed)
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
    # Without it, a widget cell's reply could be missed until the cell's timeout: the run would
    # then be cut off there and the later exercises of an honest notebook marked "timeout".
    client.on_notebook_start = lambda notebook: [listen_in_slices(channel) for channel in
                                                 (client.kc.shell_channel, client.kc.iopub_channel)]
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


def _notebook_env(scratch: Path, jailed: bool) -> dict[str, str]:
    """The environment of a notebook's run: HOME and the temporary folder in its scratch folder
    (a notebook's files in ~ land there), the network off for the model hub and pip, the grader's
    model cache (read-only in the jail: no notebook dequantises the model again) and a copy of
    matplotlib's font list (not rebuilt per notebook)."""
    import matplotlib

    from ..models import cache_dir

    fonts = scratch / ".matplotlib"
    fonts.mkdir()
    for cached in Path(matplotlib.get_cachedir()).glob("fontlist-*.json"):
        shutil.copy(cached, fonts)
    env = {**OFFLINE, "HOME": str(scratch), "TMPDIR": str(scratch), "LOGITLAB_CACHE": str(cache_dir()),
           "MPLCONFIGDIR": str(fonts), "MPLBACKEND": "Agg"}
    if not jailed:
        return {**os.environ, **env}
    return {**env, "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "LANG": "C.UTF-8"}


def run_submission(path: Path, scratch: Path, timeout: float, memory_gb: float, jailed: bool = True) -> tuple[dict | None, str]:
    """Run one submission in ``scratch`` (jailed, see :mod:`logitlab.course.jail`, unless ``jailed``
    is false); return (the executed notebook as JSON or None, a note)."""
    scratch.mkdir(parents=True)
    copy = scratch / "submission.ipynb"
    shutil.copy(path, copy)
    env = _notebook_env(scratch, jailed)
    command = [sys.executable, "-m", "logitlab.course.grade", "--run-one", str(copy), "--cell-timeout", str(int(timeout))]
    if jailed:
        command = jailed_python(command, scratch, env, Path(env["LOGITLAB_CACHE"]))  # the model, read-only
    child = subprocess.Popen(command, cwd=scratch, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, preexec_fn=limits(int(memory_gb * 2**30)))
    try:
        log, note = child.communicate(timeout=timeout)[0], ""
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # the kernel too: its process group, and the jail's namespace
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
    (``executed``, None where it was not run) takes away."""
    row = {"student": student}
    if verdicts is None:
        return row | {check: "not graded" for check in checks} | {"passed": 0, "note": note}
    cells = exercise_cells(executed) if executed is not None else {}
    for check in checks:
        row[check] = verdicts[check]
        if row[check] != "missing" and executed is not None:
            index = cells.get(check)
            cell = executed["cells"][index] if index is not None else {}
            row[check] = notebook_status(cell, "timed out" in note) or row[check]
    missing = [c for c in checks if row[c] == "missing"]
    if missing:
        note = "; ".join(filter(None, [note, f"exercise cells deleted: {', '.join(missing)}"]))
    return row | {"passed": sum(row[c] == "passed" for c in checks), "note": note}


# A class at once: one worker process per core, each grading whole notebooks.

def _start_worker() -> None:
    torch.set_num_threads(1)  # one core per worker: the workers fill the machine


def _check_job(job) -> tuple[dict | None, float]:
    nb, columns, scratch, timeout, memory_gb, seed, jailed = job
    start = time.monotonic()
    found = check_notebook(nb, columns, scratch, timeout=timeout, memory_gb=memory_gb, seed=seed,
                           jailed=jailed) if nb else None
    return found, time.monotonic() - start


def _run_job(job) -> tuple[dict | None, str, float]:
    path, nb, note, scratch, timeout, memory_gb, jailed = job
    start = time.monotonic()
    executed, note = run_submission(path, scratch, timeout, memory_gb, jailed) if nb else (None, note)
    return executed, note, time.monotonic() - start


def _in_parallel(function, jobs: list, workers: int, desc: str) -> list:
    """``[function(job) for job in jobs]``, on ``workers`` processes (here, for one), in order."""
    from concurrent.futures import ProcessPoolExecutor
    import multiprocessing

    from tqdm.auto import tqdm

    if workers == 1:
        return [function(job) for job in tqdm(jobs, desc=desc, unit="notebook")]
    # spawn, not fork: a forked copy of a process that has run torch's thread pools can hang
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_start_worker) as pool:
        return list(tqdm(pool.map(function, jobs), total=len(jobs), desc=desc, unit="notebook"))


def grade(folder: Path, out: Path, *, timeout: float = 600, memory_gb: float = 8, checks: list[str] | None = None,
          keep: Path | None = None, run: bool = False, workers: int | None = None, seed: int | None = None,
          jailed: bool = True, counted=None, roster=None) -> list[dict]:
    """Grade every notebook under ``folder`` into the CSV ``out`` (:func:`gradebook.write_sheet`:
    each exercise's verdict and points, the total of the ``counted`` ones, a ``roster``'s names);
    return the rows. The exercise columns are ``checks`` if given, else every exercise's check any
    submission calls, in notebook order.
    Every notebook's answers are checked first, ``workers`` notebooks at a time (default: one per
    core), with the checks' random cases drawn from ``seed`` (default: a new secret one per run);
    ``run`` then runs each notebook, which can only take points away. ``timeout`` (seconds)
    bounds the checking of one notebook's answers and, separately, its run; ``keep``, a folder,
    keeps each notebook as its run left it. ``jailed`` false grades without the operating-system
    sandbox (trusted notebooks only). The sheet is written once every sandbox has ended."""
    import secrets

    from . import jail

    submissions = sorted(folder.rglob("*.ipynb"))
    if not submissions:
        raise ValueError(f"no .ipynb notebook under {folder}")
    if jailed:
        jail.check()
    workers = workers or os.cpu_count() or 1
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive number of processes, got {workers!r}")
    seed = secrets.randbelow(2**62) if seed is None else seed
    read = [read_submission(path) for path in submissions]
    known = set(known_checks())
    columns = checks or list(dict.fromkeys(c for nb, _ in read if nb for c in exercise_cells(nb) if c in known))
    if not columns:
        raise ValueError(f"no notebook under {folder} calls the check of an exercise")
    points = exercise_points(columns)
    counted_checks(columns, points, counted)  # a wrong choice stops the grading before it starts
    with tempfile.TemporaryDirectory(prefix="logitlab-grade-") as root:
        verdicts = _in_parallel(_check_job, [(nb, columns, Path(root) / f"{n}-check", timeout, memory_gb, seed, jailed)
                                             for n, (nb, _) in enumerate(read)], workers, "checking")
        if run:
            runs = _in_parallel(_run_job, [(path, nb, note, Path(root) / str(n), timeout, memory_gb, jailed)
                                           for n, (path, (nb, note)) in enumerate(zip(submissions, read))], workers, "running")
        else:
            runs = [(None, note, 0.0) for _, note in read]
        for path, (executed, _, _) in zip(submissions, runs):
            if keep is not None and executed is not None:
                kept = keep / path.relative_to(folder)
                kept.parent.mkdir(parents=True, exist_ok=True)
                kept.write_text(json.dumps(executed, indent=1))
    rows = [grade_row(path.stem, found, executed, note, columns) | {"seconds": round(checking + running, 1)}
            for path, (found, checking), (executed, note, running) in zip(submissions, verdicts, runs)]
    write_sheet(rows, columns, points, out, counted=counted, roster=roster)
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m logitlab.course.grade", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, nargs="?", help="the returned notebooks (searched recursively)")
    parser.add_argument("--out", type=Path, default=Path("grades.csv"), help="the grade sheet (CSV)")
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds per notebook, for checking its answers and again for running it (default 600)")
    parser.add_argument("--memory-gb", type=float, default=8, help="memory per notebook in GiB (default 8)")
    parser.add_argument("--run", action="store_true",
                        help="also run every notebook from top to bottom (slow; it can only take points away)")
    parser.add_argument("--workers", type=int, help="notebooks graded at once (default: one per core)")
    parser.add_argument("--seed", type=int, help="the checks' hidden seed (default: a new secret one; give one to repeat a grading)")
    parser.add_argument("--no-jail", action="store_true",
                        help="grade without the operating-system sandbox (bubblewrap): for trusted notebooks only")
    parser.add_argument("--keep-executed", type=Path, metavar="FOLDER",
                        help="with --run: keep each notebook as its run left it, in FOLDER (what it printed is not graded)")
    marks = parser.add_argument_group("where the grades go (points: the teacher's guide's, all or nothing per check)")
    marks.add_argument("--chapter", help="the chapter graded (e.g. 01_logits_and_temperature): its exercises are the "
                       "columns, even one whose cell a student deleted (default: the checks the notebooks call)")
    marks.add_argument("--count", metavar="CHECKS", help="the exercises that count, e.g. check_softmax,check_top_k (default: all)")
    marks.add_argument("--roster", type=Path, help="a CSV naming each notebook's student (columns: file, name, id, sis_id, "
                       "login, section, email; see logitlab.course.gradebook.read_roster)")
    marks.add_argument("--assignment", help="the assignment's name in Canvas or Moodle (default: the folder's name)")
    marks.add_argument("--assignment-id", help="an existing Canvas assignment's id (the number in its address)")
    marks.add_argument("--canvas", type=Path, metavar="CSV", help="also write a Canvas gradebook import file")
    marks.add_argument("--moodle", type=Path, metavar="CSV", help="also write a Moodle grade import file")
    marks.add_argument("--moodle-identifier", default="username", choices=["username", "email", "idnumber"],
                       help="the Moodle column that identifies a student (default: username)")
    marks.add_argument("--gradescope", type=Path, metavar="JSON",
                       help="write Gradescope's results.json (one notebook: what run_autograder calls)")
    parser.add_argument("--run-one", type=Path, help=argparse.SUPPRESS)  # the child's side
    parser.add_argument("--cell-timeout", type=int, default=600, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run_one:
        return run_in_child(args.run_one, args.cell_timeout)
    if args.folder is None or not args.folder.is_dir():
        parser.error(f"folder must be a folder of returned notebooks, got {args.folder}")
    if args.timeout <= 0 or args.memory_gb <= 0:
        parser.error("--timeout and --memory-gb must be positive")
    from .jail import JailUnavailable

    try:
        from .gradebook import chapter_points

        checks = list(chapter_points(args.chapter)) if args.chapter else None
        rows = grade(args.folder, args.out, checks=checks, timeout=args.timeout, memory_gb=args.memory_gb, keep=args.keep_executed,
                     run=args.run, workers=args.workers, seed=args.seed, jailed=not args.no_jail,
                     counted=args.count, roster=args.roster)
        for note in export(rows, args):
            print(note)
    except JailUnavailable as error:
        parser.exit(2, f"{parser.prog}: error: {error}; or pass --no-jail to grade trusted notebooks without it\n")
    except ValueError as error:
        parser.error(str(error))
    print(f"{len(rows)} notebooks graded into {args.out}")


def export(rows: list[dict], args) -> list[str]:
    """Write the exports the command line asks for; return what they have to say (students left out, ...)."""
    from .gradebook import checks_of, write_canvas, write_moodle
    from .gradescope import write_gradescope

    columns = checks_of(rows)
    points = exercise_points(columns)
    assignment = args.assignment or args.folder.resolve().name
    notes = []
    if args.gradescope:
        write_gradescope(rows, counted_checks(columns, points, args.count), points, args.gradescope)
    if args.canvas:
        notes += write_canvas(rows, columns, points, args.canvas, assignment=assignment, assignment_id=args.assignment_id,
                              counted=args.count, roster=args.roster).notes
    if args.moodle:
        notes += write_moodle(rows, columns, points, args.moodle, assignment=assignment, identifier=args.moodle_identifier,
                              counted=args.count, roster=args.roster).notes
    return notes


if __name__ == "__main__":
    main(sys.argv[1:])
