"""Notebook 15's recipe as source text, kept in one place: the cells tagged 'recipe' are the only copy.

A fresh process imports the cells as they ran in the notebook (`write_module`: the text Python compiled, so an
edited and re-run cell is what the new process gets); the README quotes them between `<!-- recipe:start -->` and
`<!-- recipe:end -->` (`readme_region` makes that text, `readme_block` reads it back, and a test holds the two
equal), so the function a reader copies is the one the notebook ran and measured.
"""

from __future__ import annotations

import json
import linecache
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from helpers import readme_region as regions

TAG = "recipe"
README_REGION = "recipe"
NOTEBOOK = "15_the_recipe"


def cell_source(fn: Callable[..., Any]) -> str:
    """The source of the notebook cell (or file) that defined fn, as Python compiled it."""
    filename = fn.__code__.co_filename
    lines = linecache.getlines(filename)
    if not lines:
        raise ValueError(f"no source is known for {fn.__name__} (defined in {filename!r})")
    return "".join(lines)


def write_module(functions: Sequence[Callable[..., Any]], folder: Path, name: str = TAG) -> Path:
    """Write the cells that defined functions, each cell once and in their order, as folder/<name>.py."""
    sources: list[str] = []
    for fn in functions:
        text = cell_source(fn).rstrip() + "\n"
        if text not in sources:
            sources.append(text)
    path = Path(folder) / f"{name}.py"
    path.write_text("\n\n".join(sources))
    return path


def tagged_source(notebook: Path, tag: str = TAG) -> str:
    """The source of a stored notebook's code cells tagged tag, in order, separated by two blank lines."""
    cells = json.loads(Path(notebook).read_text())["cells"]
    found = ["".join(c["source"]).rstrip() for c in cells
             if c["cell_type"] == "code" and tag in c.get("metadata", {}).get("tags", [])]
    if not found:
        raise ValueError(f"{notebook} has no code cell tagged {tag!r}")
    return "\n\n\n".join(found) + "\n"


def fenced(source: str) -> str:
    """source as one fenced python block, as the README quotes it."""
    return f"```python\n{source.rstrip()}\n```"


def readme_region(source: str) -> str:
    """The README's recipe region for source: the markers around one fenced python block."""
    start, end = regions.markers(README_REGION)
    return f"{start}\n{fenced(source)}\n{end}"


def readme_block(text: str) -> str | None:
    """The fenced python block between the README's recipe markers; None when the README has no such region."""
    start, end = regions.markers(README_REGION)
    if start not in text or end not in text:
        return None
    region = text.split(start, 1)[1].split(end, 1)[0]
    found = re.fullmatch(r"\s*```python\n(.*?)\n```\s*", region, re.DOTALL)
    if found is None:
        raise ValueError(f"the README's {start} region holds no single fenced python block")
    return found.group(1) + "\n"


def write_readme(readme: Path, notebook: Path) -> bool:
    """Rewrite the README's recipe region from the notebook's tagged cells; True when it changed."""
    return regions.write(readme, fenced(tagged_source(notebook)), regions.markers(README_REGION))


if __name__ == "__main__":  # python -m helpers.recipe_source: copy notebook 15's recipe cells into the README
    from helpers import paths

    print("README.md", "rewritten" if write_readme(paths.ROOT / "README.md", paths.NOTEBOOKS_DIR / f"{NOTEBOOK}.ipynb")
          else "unchanged")
