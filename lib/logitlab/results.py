"""The measurements the book ships, for the closing chapter ("Choosing a decoder").

Two files in ``logitlab/data``:

* ``bench_cpu.json``: one whole run of ``python -m logitlab.bench`` on the book's 2-core CPU,
  every row (measurement, median seconds, ratio, what the ratio is against) and the machine;
* ``gpu_pass_costs_h100.json``: the cost of a forward pass of SmolLM2-135M over n new tokens on
  an NVIDIA H100, in float32 and bfloat16, and the one-layer draft model's step over the
  target's (c), measured once with the book's own timing code;
* ``gpu_speed_h200.json``: ``ll.generate`` against the draft model and EAGLE's tree (exact, and
  with typical acceptance) on an NVIDIA H200, measured once with the bench's own pieces (the
  file's ``how`` says which); its ``measurements`` hold that machine's decode step, c and v(n).

A chapter reads them instead of re-running a bench of over an hour; each row says what it
measured, so the chapter can print where every number of its tables comes from.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

DATA = Path(__file__).parent / "data"


def bench_run(path: str | Path | None = None) -> dict:
    """The shipped bench run (or the JSON that ``python -m logitlab.bench --json`` wrote at
    ``path``): ``{"machine": ..., "rows": [{"measurement", "seconds", "ratio", "against"}, ...]}``."""
    return json.loads(Path(path or DATA / "bench_cpu.json").read_text())


def find_row(rows: list[dict], pattern: str) -> dict:
    """The one row whose measurement matches the regular expression ``pattern``; a
    ``ValueError`` when none or several do (a table must not pick a row by accident)."""
    hits = [r for r in rows if re.search(pattern, r["measurement"])]
    if len(hits) != 1:
        raise ValueError(f"pattern {pattern!r} matches {len(hits)} rows of the bench run, not one: "
                         + "; ".join(r["measurement"] for r in hits[:5]))
    return hits[0]


def split_label(measurement: str) -> tuple[str, str]:
    """A row's label as ``(method, settings)``: the text before its first " (" or ", ", and the rest."""
    cuts = [i for i in (measurement.find(" ("), measurement.find(", ")) if i > 0]
    cut = min(cuts, default=len(measurement))
    return measurement[:cut], measurement[cut:].lstrip(",").strip()


def reading(row: dict) -> tuple[str, str, str]:
    """``(speed, cost, relative to)`` of a row, every ratio read one way: a speed is the row's
    method over what it is compared with (above 1: faster); a cost is the row's time in units of
    something else (a decode step, one sample). A row with no ratio is a baseline.

    A row of several runs (``python -m logitlab.bench --runs N``) gives its median and, in
    brackets, the lowest and highest of its runs, read the same way.
    """
    against, ratio = row["against"], row["ratio"]
    if ratio is None:
        return "", "", ""
    runs = row.get("ratios") or []
    if against.startswith("slower than "):  # the row's time over the other's: its speed is the inverse
        ratio, runs = 1 / ratio, [1 / r for r in runs]
    spread = f" [{min(runs):.2f}-{max(runs):.2f}]" if len(runs) > 1 else ""
    for prefix in ("faster than ", "slower than "):
        if against.startswith(prefix):
            return f"{ratio:.2f}x{spread}", "", against[len(prefix):]
    if against == "Hugging Face's tokens/s":
        return f"{ratio:.2f}x{spread}", "", "Hugging Face"
    return "", f"{ratio:.2f}{spread}", against


def run_markdown(run: dict) -> str:
    """A bench run as the benchmarks page shows it: the machine, then one table per section of
    the run, in its order, each row's settings in a column of their own and every ratio read
    one way (:func:`reading`)."""
    sections = list(dict.fromkeys(r.get("section", "") for r in run["rows"]))
    parts = [f"Machine: {run['machine']}."]
    for section in sections:
        lines = ["| method | settings | median time | speed (above 1: faster) | cost | relative to |",
                 "|:---|:---|---:|---:|---:|:---|"]
        for r in run["rows"]:
            if r.get("section", "") == section:
                method, settings = split_label(r["measurement"])
                speed, cost, relative = reading(r)
                lines.append(f"| {method} | {settings} | {r['seconds'] * 1000:.1f} ms | {speed} | {cost} | {relative} |")
        parts.append((f"### {section}\n\n" if section else "") + "\n".join(lines))
    return "\n\n".join(parts) + "\n"


# The shipped run's tables sit between these two lines of the benchmarks page (MyST comments).
PAGE_BEGIN, PAGE_END = "% BEGIN the shipped bench run", "% END the shipped bench run"


def write_into_page(page: str | Path, run: dict | None = None) -> None:
    """Replace the tables between ``PAGE_BEGIN`` and ``PAGE_END`` in ``page`` (the benchmarks
    page) with ``run_markdown(run)`` (default: the shipped run), after a new bench run is shipped."""
    page = Path(page)
    text = page.read_text()
    start, end = text.index(PAGE_BEGIN) + len(PAGE_BEGIN), text.index(PAGE_END)
    page.write_text(text[:start] + "\n\n" + run_markdown(run or bench_run()) + "\n" + text[end:])


def gpu_pass_costs() -> dict:
    """The H100 measurements: ``pass_seconds[dtype][n]`` (n as a string) and ``c_draft_model_float32``."""
    return json.loads((DATA / "gpu_pass_costs_h100.json").read_text())


def gpu_speed() -> dict:
    """The H200 run: ``info`` (device, versions), ``settings``, ``measurements`` (``decode_step_ms``,
    ``c_draft_model``, ``v_n``) and ``rows`` (one per contender and temperature, with
    ``ratio_over_ll_generate``, and for a drafter ``tokens_per_target_call``, ``alpha``,
    ``verify_call_ms``)."""
    return json.loads((DATA / "gpu_speed_h200.json").read_text())
