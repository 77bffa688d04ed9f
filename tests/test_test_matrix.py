"""tools/test_matrix.py: each run is ok, refused in the setup cell, or failed, told apart from papermill's error;
the table names every setting and lists the messages."""

import argparse
import importlib.util
import sys

import nbformat
import pytest

from helpers import paths

_spec = importlib.util.spec_from_file_location("matrix_tool", paths.ROOT / "tools" / "test_matrix.py")
matrix = sys.modules.setdefault("matrix_tool", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(matrix)

SETUP = """from pathlib import Path
from helpers import params
if X == 4:
    Path(RESULTS_DIR).mkdir(parents=True)
    (Path(RESULTS_DIR) / "row.jsonl").write_text("{}\\n")
    raise params.ParameterError("X=4 is refused after a row was written")
params.check_choice("X", X, (1, 2, 3))"""
LATER = """from helpers import params
assert X != 2, "two is unlucky"
if X == 3:
    raise params.ParameterError("X=3 refused halfway")"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A notebook with the collection's skeleton: a parameters cell, a setup cell that validates X, a later cell."""
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    first = nbformat.v4.new_code_cell('PROFILE = "auto"\nX = 1\nRESULTS_DIR = ""\nFIGURES_DIR = ""')
    first.metadata["tags"] = ["parameters"]
    nb.cells = [first, nbformat.v4.new_code_cell(SETUP), nbformat.v4.new_code_cell(LATER)]
    path = tmp_path_factory.mktemp("nb") / "tiny.ipynb"
    nbformat.write(nb, path)
    return path


@pytest.mark.notebook
@pytest.mark.parametrize(("x", "status", "message"), [
    (1, "ok", ""),
    (9, "refused", "ParameterError: X=9 is not allowed; choose one of: 1, 2, 3"),
    (2, "failed", "AssertionError: two is unlucky"),
    (3, "failed", "ParameterError: X=3 refused halfway"),
    (4, "failed", "refused in the setup cell but wrote ['row.jsonl']"),
])
def test_run_cell_tells_ok_refused_and_failed_apart(tiny, tmp_path, x, status, message):
    out = matrix.run_cell(tiny, {"X": x}, tmp_path)
    assert out["status"] == status and message in out["message"], out
    if status == "failed" and x in (2, 3):
        assert not out["message"].startswith("setup cell"), "a later cell's error must not read as the setup cell's"


def test_seeds_settings_and_table():
    assert matrix.parse_seeds("0-2,7,1") == [0, 1, 2, 7] and matrix.parse_seeds("5") == [5]
    cols = matrix.settings([0, 1])
    assert [c.label for c in cols] == ["seed 0", "seed 1", "MODEL=sdxl", "DTYPE=fp32", "DTYPE=fp16", "DTYPE=bf16"]
    outcomes = {("00_a", "seed 0"): matrix.Outcome("ok", seconds=10),
                ("00_a", "seed 1"): matrix.Outcome("failed", "cell 5: AssertionError: a | b", 20),
                ("00_a", "MODEL=sdxl"): matrix.Outcome("refused", "ParameterError: MODEL='sdxl' is not allowed", 3),
                ("00_a", "DTYPE=bf16"): matrix.Outcome("ok", seconds=10, shared_with="seed 0")}
    table = matrix.markdown_table(["00_a"], cols, outcomes, 33.0, "header")
    assert "| notebook | seed 0 | seed 1 | MODEL=sdxl | DTYPE=fp32 | DTYPE=fp16 | DTYPE=bf16 | run time (s) |" in table
    assert "| 00_a | ok | **FAILED** (f1) | refused (r1) | not run | not run | ok = seed 0 | 33 |" in table
    assert "- f1: cell 5: AssertionError: a \\| b" in table and "- r1: ParameterError: MODEL='sdxl'" in table
    assert "2 ok, 1 refused in the setup cell, 1 failed; wall time 33 s" in table


def test_axes_pick_columns_and_refuse_unknown():
    assert matrix.parse_axes("dtype, seeds") == ("seeds", "dtype")
    assert [c.label for c in matrix.settings([3], ("dtype",))] == ["DTYPE=fp32", "DTYPE=fp16", "DTYPE=bf16"]
    assert [c.label for c in matrix.settings([3], ("seeds", "model"))] == ["seed 3", "MODEL=sdxl"]
    for bad in ("dtypes", "", "seeds,size"):
        with pytest.raises(argparse.ArgumentTypeError, match="choose from seeds, model, dtype"):
            matrix.parse_axes(bad)
