"""Grade a folder of returned notebooks: one row per student, one column per exercise.

::

    python -m logitlab.grade submissions/ --out grades.csv

Every ``*.ipynb`` under ``submissions/`` is one student's copy of one chapter (the student's name
is the file's name without ``.ipynb``; put each class's copies of one chapter in one folder). Each
notebook runs from top to bottom in a fresh Jupyter kernel, every cell even after an error, and
each exercise's check cell (the one calling ``ll.checks.check_*``) gets one of:

* ``passed``; ``failed: ...`` with the check's own explanation of the first wrong case;
* ``not attempted`` (the cell still raises the placeholder's ``NotImplementedError``);
* ``error: ...`` (any other exception in that cell); ``timeout`` (the notebook ran out of time
  before the cell finished); ``missing`` (the student deleted the exercise's cell).

A notebook that is not valid JSON gets a row saying so; one error never stops the whole run.

What isolation this is, and is not: each notebook runs in a child process with its own empty
scratch folder as working directory and home folder (a copy of the notebook in it), a time limit (the process
group is killed when it is over), a memory limit (``RLIMIT_AS`` on the process and the kernel it
starts) and the network switched off for the model hub and pip (environment variables, not a
firewall). It cannot see the other submissions or overwrite their results, which only this
process writes. But it runs as the same user as the grader: a notebook that means harm can read
or write any file that user can. For code from people you do not trust, run the grader inside a
container or a throwaway virtual machine.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHECK_CALL = re.compile(r"\bll\.checks\.(check_\w+)\(")
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PIP_NO_INDEX": "1",
           # a closed local port: any HTTP(S) request through the standard proxies fails at once
           "http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9",
           "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9", "no_proxy": ""}


def exercise_cells(nb: dict) -> dict[str, int]:
    """``{check name: index of the code cell that calls it}`` for a notebook read as JSON."""
    found = {}
    for index, cell in enumerate(nb.get("cells", [])):
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else source
        if cell.get("cell_type") == "code":
            for name in CHECK_CALL.findall(source):
                found.setdefault(name, index)
    return found


def cell_status(cell: dict, check: str, timed_out: bool) -> str:
    """What one exercise cell of an executed notebook says about its check."""
    outputs = cell.get("outputs", [])
    for out in outputs:
        if out.get("output_type") == "error":
            name, value = out.get("ename", ""), (out.get("evalue") or "").strip()
            if name == "NotImplementedError":
                return "not attempted"
            if name == "CheckFailed":
                return f"failed: {value}"
            return f"error: {name}: {value.splitlines()[0] if value else ''}"
    text = "".join("".join(o.get("text", "")) for o in outputs if o.get("output_type") == "stream")
    if re.search(rf"{check}: .*passed", text):
        return "passed"
    if timed_out and not cell.get("metadata", {}).get("execution", {}).get("iopub.status.idle"):
        return "timeout"
    return "no result"


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


def _limits(memory_bytes):
    def apply():  # in the child, before it runs anything: its own process group, a memory cap
        os.setsid()
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))

    return apply


def run_submission(path: Path, scratch: Path, timeout: float, memory_gb: float) -> tuple[dict | None, str]:
    """Run one submission in ``scratch``; return (the executed notebook as JSON or None, a note)."""
    try:
        json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as error:
        return None, f"not a valid notebook (JSON): {error}"
    scratch.mkdir(parents=True)
    copy = scratch / "submission.ipynb"
    shutil.copy(path, copy)
    command = [sys.executable, "-m", "logitlab.grade", "--run-one", str(copy), "--cell-timeout", str(int(timeout))]
    from .models import cache_dir

    # HOME is the scratch folder too, so that a notebook's files in ~ land there; the model cache
    # stays the grader's, so that no notebook dequantises the model again.
    import matplotlib

    env = {**os.environ, **OFFLINE, "HOME": str(scratch), "LOGITLAB_CACHE": str(cache_dir()),
           "MPLCONFIGDIR": matplotlib.get_configdir()}  # its font cache, not rebuilt per notebook
    child = subprocess.Popen(command, cwd=scratch, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, preexec_fn=_limits(int(memory_gb * 2**30)))
    try:
        log, note = child.communicate(timeout=timeout)[0], ""
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # the kernel too: it is in the child's process group
        log, note = child.communicate()[0], f"timed out after {timeout:.0f} s"
    try:
        return json.loads(copy.read_text()), note or _failure(child.returncode, log)
    except ValueError:
        return None, note or f"could not run: {_failure(child.returncode, log)}"


def _failure(returncode, log: bytes) -> str:
    if returncode == 0:
        return ""
    last = log.decode(errors="replace").strip().splitlines()[-1:] or [""]
    return f"the run ended with code {returncode}: {last[0][:200]}"


def grade_row(student: str, executed: dict | None, note: str, checks: list[str]) -> dict:
    """One row of the grade sheet."""
    row = {"student": student}
    if executed is None:
        return row | {check: "not graded" for check in checks} | {"passed": 0, "note": note}
    cells = exercise_cells(executed)
    for check in checks:
        index = cells.get(check)
        row[check] = "missing" if index is None else cell_status(executed["cells"][index], check, "timed out" in note)
    missing = [c for c in checks if row[c] == "missing"]
    if missing:
        note = "; ".join(filter(None, [note, f"exercise cells deleted: {', '.join(missing)}"]))
    return row | {"passed": sum(row[c] == "passed" for c in checks), "note": note}


def grade(folder: Path, out: Path, *, timeout: float = 600, memory_gb: float = 8, checks: list[str] | None = None) -> list[dict]:
    """Grade every notebook under ``folder`` into the CSV ``out``; return the rows. The exercise
    columns are ``checks`` if given, else every check any submission calls, in notebook order."""
    from tqdm.auto import tqdm

    submissions = sorted(folder.rglob("*.ipynb"))
    if not submissions:
        raise ValueError(f"no .ipynb notebook under {folder}")
    results = []
    with tempfile.TemporaryDirectory(prefix="logitlab-grade-") as root:
        for number, path in enumerate(tqdm(submissions, desc="grading", unit="notebook")):
            start = time.monotonic()
            executed, note = run_submission(path, Path(root) / str(number), timeout, memory_gb)
            results.append((path.stem, executed, note, time.monotonic() - start))
    columns = checks or list(dict.fromkeys(c for _, nb, _, _ in results if nb for c in exercise_cells(nb)))
    rows = [grade_row(student, nb, note, columns) | {"seconds": round(s, 1)} for student, nb, note, s in results]
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["student", *columns, "passed", "seconds", "note"])
        writer.writeheader()
        writer.writerows(rows)
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m logitlab.grade", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, nargs="?", help="the returned notebooks (searched recursively)")
    parser.add_argument("--out", type=Path, default=Path("grades.csv"), help="the grade sheet (CSV)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per notebook (default 600)")
    parser.add_argument("--memory-gb", type=float, default=8, help="memory per notebook in GiB (default 8)")
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
        rows = grade(args.folder, args.out, timeout=args.timeout, memory_gb=args.memory_gb)
    except ValueError as error:
        parser.error(str(error))
    print(f"{len(rows)} notebooks graded into {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
