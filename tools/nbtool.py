"""Convert notebooks to and from a plain 'percent' script, so they can be written and reviewed as text.

    python tools/nbtool.py to-ipynb notebooks/src.py notebooks/NN_name.ipynb
    python tools/nbtool.py to-py notebooks/NN_name.ipynb /tmp/NN_name.py
    python tools/nbtool.py strip notebooks/*.ipynb        # drop outputs and execution counts

Cells start with '# %%' (code), '# %% [markdown]' (markdown, every line prefixed '# ') and may carry
tags: '# %% tags=["parameters"]'. Only the .ipynb files are committed.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import nbformat

HEADER = re.compile(r"^# %%(?P<md> \[markdown\])?(?: tags=(?P<tags>\[.*\]))?\s*$")
KERNEL = {"display_name": "Python 3 (fast-diffusion)", "language": "python", "name": "python3"}


def to_ipynb(src: Path, dst: Path) -> None:
    """Write the notebook described by the percent script src to dst, without outputs."""
    cells, kind, tags, buf = [], None, [], []

    def flush() -> None:
        text = "\n".join(buf).strip("\n")
        if kind is None:
            return
        if kind == "markdown":
            text = "\n".join(line[2:] if line.startswith("# ") else line.lstrip("#") for line in text.split("\n"))
            cell = nbformat.v4.new_markdown_cell(text)
        else:
            cell = nbformat.v4.new_code_cell(text)
        if tags:
            cell.metadata["tags"] = tags
        cells.append(cell)

    for line in src.read_text().split("\n"):
        m = HEADER.match(line)
        if m:
            flush()
            kind = "markdown" if m.group("md") else "code"
            tags = json.loads(m.group("tags")) if m.group("tags") else []
            buf = []
        else:
            buf.append(line)
    flush()
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = KERNEL
    nb.metadata["language_info"] = {"name": "python"}
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"c{i:03d}"
    nbformat.validate(nb)
    dst.write_text(nbformat.writes(nb) + "\n")


def to_py(src: Path, dst: Path) -> None:
    """Write the percent script of notebook src to dst."""
    nb = nbformat.read(src, as_version=4)
    out = []
    for cell in nb.cells:
        tags = cell.metadata.get("tags", [])
        suffix = f" tags={json.dumps(tags)}" if tags else ""
        if cell.cell_type == "markdown":
            out.append(f"# %% [markdown]{suffix}")
            out += [("# " + line).rstrip() for line in cell.source.split("\n")]
        else:
            out.append(f"# %%{suffix}")
            out += cell.source.split("\n")
        out.append("")
    dst.write_text("\n".join(out))


def strip(path: Path) -> None:
    """Remove outputs and execution counts from a stored notebook."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        cell.metadata.pop("execution", None)
        cell.metadata.pop("papermill", None)
    nb.metadata.pop("papermill", None)
    path.write_text(nbformat.writes(nb) + "\n")


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "to-ipynb":
        to_ipynb(Path(args[0]), Path(args[1]))
    elif cmd == "to-py":
        to_py(Path(args[0]), Path(args[1]))
    elif cmd == "strip":
        for a in args:
            strip(Path(a))
    else:
        sys.exit(__doc__)
