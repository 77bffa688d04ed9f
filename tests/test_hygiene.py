"""Stored notebooks: no outputs, a parameters cell, ordered names, the template's sections, the right kernel."""

import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from papermill.translators import PythonTranslator

from helpers import paths

NOTEBOOKS = sorted(paths.NOTEBOOKS_DIR.glob("*.ipynb"))
SECTIONS = ("The recipe", "TL;DR", "What you will learn", "Runs on", "## Parameters", "## Setup", "## 1.", "## Takeaways",
            "## Going deeper", "## Checks", "## Further reading")


def test_names_are_ordered_and_contiguous():
    assert NOTEBOOKS, "no notebooks found"
    numbers = []
    for nb in NOTEBOOKS:
        m = re.fullmatch(r"(\d\d)_[a-z0-9_]+\.ipynb", nb.name)
        assert m, f"{nb.name}: names are NN_lowercase_words.ipynb"
        numbers.append(int(m.group(1)))
    assert numbers == list(range(len(numbers))), f"numbers must run 00, 01, ... without gaps: {numbers}"


def noisy_imports_before_helpers(setup: str) -> list[str]:
    """Lines of a setup cell that import a library's names before helpers, whose import quiets their notices."""
    lines = setup.splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith("from helpers import")), len(lines))
    return [line for line in lines[:first]
            if re.match(r"(from (diffusers|transformers|torchao|peft|bitsandbytes)\b.* import )", line)]


def test_the_import_order_check_flags_a_model_import_before_helpers():
    planted = "import torch\nfrom diffusers import FluxTransformer2DModel\n\nfrom helpers import session\n"
    assert noisy_imports_before_helpers(planted) == ["from diffusers import FluxTransformer2DModel"]
    assert noisy_imports_before_helpers("import diffusers\nfrom helpers import session\nfrom diffusers import X\n") == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_hygiene(path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), "outputs stored"
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    tagged = [i for i, c in enumerate(nb["cells"]) if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged 'parameters'"
    assert nb["cells"][tagged[0]] is code[0], "the parameters cell is the first code cell"
    params = "".join(code[0]["source"])
    for name in ("PROFILE", "MODEL", "WEIGHTS", "SEED", "RESULTS_DIR", "FIGURES_DIR", "GPU_MEMORY_GIB"):
        assert re.search(rf"^{name} = ", params, re.MULTILINE), f"parameters cell lacks {name}"
    # papermill's parser skips (with a warning) any line it cannot read, e.g. an apostrophe in a comment;
    # a skipped line is a parameter papermill cannot override
    parsed = {p.name for p in PythonTranslator.inspect(nbformat.from_dict({**code[0], "source": params}))}
    assigned = set(re.findall(r"^([A-Z_][A-Z0-9_]*) = ", params, re.MULTILINE))
    assert parsed == assigned, f"papermill cannot read these parameter lines: {sorted(assigned - parsed)}"
    text = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    assert text.startswith(f"# {path.stem[:2]} · "), "title '# NN · ...' first"
    missing = [s for s in SECTIONS if s not in text]
    assert not missing, f"template sections missing: {missing}"
    setup = "".join(code[1]["source"])
    assert f'session.start("{path.stem}"' in setup, "the setup cell starts the session under the file's own name"
    assert not noisy_imports_before_helpers(setup), "import helpers before diffusers' names (it quiets their notices)"
    measuring = re.compile(r"time\.perf_counter|time\.time\(|time\.monotonic|cuda\.Event|cuda\.synchronize|"
                           r"memory_allocated|FlopCounterMode|torch\.profiler|psutil")
    assert not any(measuring.search("".join(c["source"])) for c in code), "measuring code belongs in helpers/"


def _nbstripout_verify(paths_: list[Path]) -> subprocess.CompletedProcess:
    """Run nbstripout's own check (cell ids kept: ours are stable) on paths_; rc 1 when any would change."""
    return subprocess.run([sys.executable, "-m", "nbstripout", "--verify", "--keep-id", *map(str, paths_)],
                          check=False, capture_output=True, text=True)


def test_notebooks_are_stripped_by_nbstripout(tmp_path):
    done = _nbstripout_verify(NOTEBOOKS)
    assert done.returncode == 0, f"run `nbstripout --keep-id notebooks/*.ipynb`: {done.stdout}{done.stderr}"
    # the check can fail: a notebook with an output and an execution count is caught
    nb = json.loads(NOTEBOOKS[0].read_text())
    code = next(c for c in nb["cells"] if c["cell_type"] == "code")
    code["execution_count"] = 1
    code["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["planted\n"]}]
    planted = tmp_path / NOTEBOOKS[0].name
    planted.write_text(json.dumps(nb))
    assert _nbstripout_verify([planted]).returncode != 0, "nbstripout --verify missed a stored output"


def test_percent_script_round_trip_is_lossless(tmp_path):
    # the way notebooks are edited (CONTRIBUTING.md): jupytext to a percent script and back with --update
    import jupytext
    for path in NOTEBOOKS:
        nb = jupytext.read(path)
        text = jupytext.writes(nb, fmt="py:percent")
        back = jupytext.reads(text, fmt="py:percent")
        assert [c.source for c in back.cells] == [c.source for c in nb.cells], path.name
        assert [c.cell_type for c in back.cells] == [c.cell_type for c in nb.cells], path.name
        tags = [c.metadata.get("tags", []) for c in nb.cells]
        assert [c.metadata.get("tags", []) for c in back.cells] == tags, path.name


def test_readme_starts_with_the_three_commands_and_shows_the_lab_screenshot():
    readme = (paths.ROOT / "README.md").read_text()
    first_block = readme.split("```")[1].splitlines()
    commands = [ln.split("#")[0].strip() for ln in first_block[1:] if ln.strip()]
    assert sorted(commands) == ["make lab", "make reproduce", "make test"], commands
    assert "figures/jupyterlab_notebook00.png" in readme.split("## ")[0], "the screenshot sits by the quickstart"
    assert (paths.FIGURES_DIR / "jupyterlab_notebook00.png").stat().st_size > 10_000
    assert "make test" in (paths.ROOT / ".ci" / "run").read_text(), ".ci/run must call the README's test command"


def test_the_helpers_tests_and_tools_pass_ruff(tmp_path):
    """ruff (pinned in requirements.txt, configured in pyproject.toml) finds nothing; a planted unused import fails."""
    root = paths.NOTEBOOKS_DIR.parent
    ruff = [sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise"]
    found = subprocess.run([*ruff, "helpers", "tests", "tools"], cwd=root, capture_output=True, text=True,
                           check=False)
    assert found.returncode == 0, found.stdout + found.stderr
    planted = tmp_path / "planted.py"
    planted.write_text("import os\n")
    caught = subprocess.run([*ruff, "--config", str(root / "pyproject.toml"), str(planted)], capture_output=True,
                            text=True, check=False)
    assert caught.returncode == 1 and "F401" in caught.stdout
