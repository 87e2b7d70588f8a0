"""The benchmark's table, and the machine it ran on."""

from __future__ import annotations

import platform

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
            lines.append(f"| {r['measurement']} | {r['seconds'] * 1000:.1f} ms | {ratio} |")
        return "\n".join(lines)


def cpu_name() -> str:
    """The processor's model name where Linux tells it, else the architecture."""
    return cpu_info().get("model name") or platform.machine()
