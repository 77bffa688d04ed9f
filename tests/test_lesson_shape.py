"""The lesson's shape, measured as ../shared/tools/lesson_metrics.py does: a main path (everything before the heading
'Going deeper') that reads in at most ten minutes at 200 words a minute with a code line counted as 6 words, code
cells of at most 30 lines, no assert in a lesson cell, the sections in their order, and the user's own calls in view."""

import ast
import json
import re

import pytest

from helpers import paths

NOTEBOOKS = sorted(paths.NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))
MAX_MINUTES = 10.0
MAX_CELL_LINES = 30
# 11 is the report: no pipeline of its own, so no load and no pipe(...) call
NO_PIPELINE = {"11"}
ORDER = ("The recipe", "## Parameters", "## Setup", "## 1.", "## Takeaways", "## Going deeper", "## Checks",
         "## Further reading")


def _lines(src: str) -> int:
    return len([ln for ln in src.splitlines() if ln.strip() and not ln.lstrip().startswith("#")])


def main_path(nb: dict) -> tuple[int, int]:
    """Markdown words and code lines before the first heading that starts 'Going deeper' (lesson_metrics.py)."""
    words = code = 0
    for c in nb["cells"]:
        src = "".join(c["source"])
        if c["cell_type"] == "markdown" and re.search(r"^#+\s*(\d+\.\s*)?going deeper", src, re.IGNORECASE | re.MULTILINE):
            break
        if c["cell_type"] == "markdown":
            words += len(re.findall(r"[A-Za-z0-9][\w'.-]*", src))
        elif c["cell_type"] == "code" and "parameters" not in c.get("metadata", {}).get("tags", []):
            code += _lines(src)
    return words, code


def minutes(nb: dict) -> float:
    words, code = main_path(nb)
    return round((words + 6 * code) / 200, 1)


def test_the_reading_time_counts_words_and_code():
    planted = {"cells": [{"cell_type": "markdown", "source": ["word " * 1000]},
                         {"cell_type": "code", "metadata": {}, "source": ["x = 1\n" * 100]},
                         {"cell_type": "markdown", "source": ["## Going deeper\n" + "word " * 5000]}]}
    assert minutes(planted) == 8.0  # (1000 + 600) / 200; Going deeper does not count
    planted["cells"][1]["source"] = ["x = 1\n" * 200]
    assert minutes(planted) > MAX_MINUTES


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_lesson_shape(path):
    nb = json.loads(path.read_text())
    assert minutes(nb) <= MAX_MINUTES, f"main path reads in {minutes(nb)} min (words, code lines {main_path(nb)})"
    code = [c for c in nb["cells"] if c["cell_type"] == "code"
            and "parameters" not in c.get("metadata", {}).get("tags", [])]
    sources = ["".join(c["source"]) for c in code]
    assert max(_lines(s) for s in sources) <= MAX_CELL_LINES, "a code cell is longer than 30 lines"
    asserts = [i for i, s in enumerate(sources)
               if any(isinstance(n, ast.Assert) for n in ast.walk(ast.parse(
                   "\n".join(ln for ln in s.splitlines() if not ln.lstrip().startswith(("%", "!"))))))]
    assert not asserts, "asserts belong in the Checks cell (claims.add / claims.evaluate), not in lesson cells"
    assert "claims.evaluate(" in sources[-1], "the Checks cell is the last code cell"
    text = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    at = [text.find(s) for s in ORDER]
    assert all(i >= 0 for i in at) and at == sorted(at), dict(zip(ORDER, at, strict=True))
    if path.stem[:2] not in NO_PIPELINE:
        every = "\n".join(sources)
        assert re.search(r"\.from_pretrained\(|\.from_config\(", every), "no visible from_pretrained / from_config"
        assert re.search(r"(^|\n)\s*(\w+\s*=\s*)?pipe\(", every), "no plain pipe(...) call"
    shown = re.compile(r"display\((image|grid|quality\.image_grid|\w*_image\b)")
    assert not any(shown.search(s) for s in sources), "show images with s.show(...): it judges and records them"
