"""The benchmark's table, and the machine it ran on."""

from __future__ import annotations

import platform
import re
import statistics

from ..fast_cpu import cpu_info


class Table:
    """Rows of (what, seconds, ratio, what the ratio is against), each in the section of the
    bench that was running when it was added (``section``, set by ``run_sections``)."""

    def __init__(self, rows: list[dict] | None = None):
        self.rows = list(rows or [])
        self.section = ""

    def add(self, name: str, seconds: float, ratio: float | None = None, against: str = "") -> None:
        self.rows.append({"measurement": name, "seconds": seconds, "ratio": ratio, "against": against,
                          "section": self.section})

    def markdown(self) -> str:
        lines = ["| measurement | median time | ratio |", "|:---|---:|---:|"]
        for r in self.rows:
            against = r["against"]
            # 0.8x "faster" is slower, 0.8x "slower" is faster, and 1.00x is neither: say which.
            for word, other in (("faster", "slower"), ("slower", "faster")):
                if r["ratio"] is None or not against.startswith(f"{word} than "):
                    continue
                if round(r["ratio"], 2) == 1:
                    against = f"(as fast as {against[len(word) + 6:]})"
                elif r["ratio"] < 1:
                    against = f"({other} than {against[len(word) + 6:]})"
            ratio = f"{r['ratio']:.2f}x {against}".strip() if r["ratio"] is not None else ""
            if r.get("ratios") and r["ratio"] is not None:
                ratio += f" [{min(r['ratios']):.2f}-{max(r['ratios']):.2f} over {len(r['ratios'])} runs]"
            lines.append(f"| {r['measurement']} | {r['seconds'] * 1000:.1f} ms | {ratio} |")
        return "\n".join(lines)


def combine_runs(runs: list[list[dict]]) -> list[dict]:
    """The rows of several runs of the same bench as one row each: the median time and ratio,
    with every run's ratio in ``ratios`` and time in ``seconds_runs`` (in run order), so that a
    reader sees the spread. Rows are matched by their place in the run; their labels must agree
    once the measured details in brackets (acceptance, tokens per call, a chosen gamma) are
    removed, else ``ValueError``. The label shown is the first run's."""
    if not runs or any(len(rows) != len(runs[0]) for rows in runs):
        raise ValueError(f"runs must be one or more runs with the same rows; got {[len(r) for r in runs]} rows")
    combined = []
    for same in zip(*runs):
        labels = {(r.get("section", ""), _without_details(r["measurement"])) for r in same}
        if len(labels) != 1:
            raise ValueError(f"runs must measure the same rows in the same order; these differ: {sorted(labels)}")
        ratios = [r["ratio"] for r in same]
        seconds = [r["seconds"] for r in same]
        combined.append(dict(same[0], seconds=statistics.median(seconds), seconds_runs=seconds,
                             ratio=None if None in ratios else statistics.median(ratios),
                             ratios=None if None in ratios else ratios))
    return combined


def _without_details(label: str) -> str:
    """A row's label without what it measured: bracketed details and the numbers in them."""
    while True:
        shorter = re.sub(r"\s*\([^()]*\)", "", label)
        if shorter == label:
            return re.sub(r"gamma=\d+", "gamma", label)
        label = shorter


def cpu_name() -> str:
    """The processor's model name where Linux tells it, else the architecture."""
    return cpu_info().get("model name") or platform.machine()
