"""The bibliography: each key defined once, and every key the book cites defined.

The book build (with warnings as errors) would stop on both, but only at its end, after every
chapter has run; this finds them in a second."""

import json
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEY = re.compile(r"^@\w+\{([^,\s]+),", re.MULTILINE)
CITE = re.compile(r"\{cite(?::[pt])?\}`([^`]+)`")


def cited_keys() -> set[str]:
    texts = [p.read_text() for p in (ROOT / "book").glob("*.md")]
    for path in (ROOT / "chapters").glob("*.ipynb"):
        texts += ["".join(c["source"]) for c in json.loads(path.read_text())["cells"]]
    return {key.strip() for text in texts for group in CITE.findall(text) for key in group.split(",")}


def test_every_key_is_defined_once_and_every_citation_has_one():
    keys = KEY.findall((ROOT / "book" / "references.bib").read_text())
    assert len(keys) > 50
    twice = [k for k, n in Counter(keys).items() if n > 1]
    assert not twice, f"defined more than once in references.bib: {twice}"
    missing = sorted(cited_keys() - set(keys))
    assert not missing, f"cited but not in references.bib: {missing}"


def test_the_citation_pattern_finds_the_forms_the_book_uses():
    text = "a {cite}`a2020x` b {cite:t}`b2021y` c {cite:p}`c2022z, d2023w`"
    assert {k.strip() for g in CITE.findall(text) for k in g.split(",")} == {"a2020x", "b2021y", "c2022z", "d2023w"}
