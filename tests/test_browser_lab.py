"""JupyterLab as a learner uses it, in headless Chromium: open notebook 00, set the smoke profile in its
parameters cell, Run > Run All Cells, and check what rendered (no errors, the results table, the plot, the
progress bar of the denoising loop). A screenshot of the finished notebook lands in build/test-artifacts/
(and, with UPDATE_SCREENSHOT=1, in figures/jupyterlab_notebook00.png).

Chromium comes from `make browser-deps` (Debian's package); without it, and without root and apt-get to
install it, the tests skip saying so, unless REQUIRE_BROWSER_TEST=1, which turns that skip into a failure.
BROWSER_TEST_NOTEBOOK=<path> runs the main test on another notebook file (used to prove it fails on errors).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

import nbformat
import pytest

from helpers import paths
from tests import lab_driver

pytestmark = pytest.mark.browser

NOTEBOOK_00 = paths.NOTEBOOKS_DIR / "00_setup_and_baseline.ipynb"
ARTIFACTS = paths.ROOT / "build" / "test-artifacts"
PUBLISHED_SCREENSHOT = paths.FIGURES_DIR / "jupyterlab_notebook00.png"
RUN_TIMEOUT_S = 420  # the smoke profile takes about a minute on 2 CPU cores
PLOT_SECTION = "3. Where the time goes"  # 00's per-component plot
DENOISING_SECTION = "1. Load the pipeline and make an image"  # where notebook 00 runs the pipeline with its bar


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium driven by Playwright; installs Debian's chromium if it can, skips if it cannot."""
    path, why = lab_driver.ensure_chromium()
    if path is None:
        if os.environ.get("REQUIRE_BROWSER_TEST") == "1":
            pytest.fail(f"REQUIRE_BROWSER_TEST=1 but {why}")
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=list(lab_driver.CHROMIUM_ARGS))
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def lab_root(tmp_path_factory) -> Path:
    """The server's root: a scratch folder the notebooks are copied into (JupyterLab saves what it opens)."""
    return tmp_path_factory.mktemp("lab-root")


@pytest.fixture(scope="module")
def lab(lab_root, tmp_path_factory):
    """A JupyterLab server on loopback for this module; always shut down, kernels included."""
    server = lab_driver.LabServer(lab_root, tmp_path_factory.mktemp("lab-state"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


def check_notebook_in_lab(browser, server: lab_driver.LabServer, notebook: Path, out_dir: Path, *,
                          screenshot: Path, **expect) -> tuple[lab_driver.LabRun, list[str]]:
    """Copy notebook into the server's root, run it from the UI on the smoke profile writing into out_dir,
    and return what rendered and the problems found (expect: the flags of lab_driver.problems)."""
    shutil.copy(notebook, server.root_dir / notebook.name)
    lines = ['PROFILE = "smoke"', f'RESULTS_DIR = "{out_dir / "results"}"',
             f'FIGURES_DIR = "{out_dir / "figures"}"']
    run = lab_driver.run_in_lab(browser, server, notebook.name, parameter_lines=lines,
                                timeout_s=RUN_TIMEOUT_S, screenshot=screenshot)
    (screenshot.with_suffix(".json")).write_text(json.dumps(asdict(run), indent=1))
    return run, lab_driver.problems(run, **expect)


def test_notebook00_runs_clean_in_jupyterlab(browser, lab, tmp_path):
    notebook = Path(os.environ.get("BROWSER_TEST_NOTEBOOK") or NOTEBOOK_00).resolve()
    spec = lab.api("api/kernelspecs")["kernelspecs"].get("python3")
    assert spec, "JupyterLab has no python3 kernel: `make venv` registers it in .venv"
    assert Path(spec["spec"]["argv"][0]).parent == Path(sys.executable).parent, (
        f"the python3 kernel runs {spec['spec']['argv'][0]}, not this environment's {sys.executable}")

    shot = ARTIFACTS / "jupyterlab_notebook00.png"
    # the skeleton keeps the results table in "Going deeper" (its "### Results"); 00's plot is in its section 3
    run, found = check_notebook_in_lab(browser, lab, notebook, tmp_path, screenshot=shot,
                                       results_section="Going deeper", need_plot=False)
    if not any(o.images for o in run.section_outputs(PLOT_SECTION)):
        found.append(f"no plot (<img>) rendered in the '## {PLOT_SECTION}' outputs")
    print(lab_driver.summary(run))
    assert not found, (f"{notebook.name} in JupyterLab: " + "\n- ".join(["", *found])
                       + f"\n(screenshot: {shot}, page dump: {shot.with_suffix('.json')})")

    kind, where = run.progress_bar(DENOISING_SECTION)
    assert kind == "widget", (f"the denoising loop's progress bar in '## {DENOISING_SECTION}' rendered as "
                              f"{kind or 'nothing'} ({where}), not as an ipywidgets bar: is ipywidgets / "
                              "jupyterlab_widgets installed in .venv?")
    bars = [o.text for o in run.section_outputs(DENOISING_SECTION) if o.progress]
    assert any("2/2" in t for t in bars), f"the bar should count the smoke profile's 2 steps: {bars}"
    rows = [json.loads(line) for f in (tmp_path / "results").glob("*/*.jsonl") for line in f.read_text().splitlines()]
    assert rows and {r["profile"] for r in rows} == {"smoke"}, "the typed PROFILE = \"smoke\" did not take effect"
    assert run.kernel_name == "Python 3 (fast-diffusion)", f"notebook ran on kernel {run.kernel_name!r}"
    assert list((tmp_path / "results").glob(f"*/{notebook.stem}.jsonl")), (
        "no result rows in the temporary RESULTS_DIR: the parameters typed into the cell did not take effect")
    if os.environ.get("UPDATE_SCREENSHOT") == "1":
        PUBLISHED_SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, PUBLISHED_SCREENSHOT)


def planted_copy_of_00(path: Path) -> Path:
    """A temporary copy of notebook 00 with one cell planted right after its setup cell that raises."""
    nb = nbformat.read(NOTEBOOK_00, as_version=4)
    setup = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "session.start(" in c.source)
    nb.cells.insert(setup + 1, nbformat.v4.new_code_cell('raise RuntimeError("planted")'))
    nbformat.write(nb, path)
    return path


def test_checker_reports_a_planted_error(browser, lab, tmp_path):
    """Negative control: the same driving and checks, on a copy of 00 that raises, must report the error."""
    nb = planted_copy_of_00(tmp_path / "planted_error.ipynb")
    run, found = check_notebook_in_lab(browser, lab, nb, tmp_path, screenshot=ARTIFACTS / "planted_error.png")
    errors = [f for f in found if f.startswith("error output in")]
    assert len(errors) == 1 and "RuntimeError" in errors[0] and "planted" in errors[0], found
    assert "'raise RuntimeError(\"planted\")'" in errors[0], errors[0]
    assert any("did not run" in f for f in found), f"the cells after the error should stay unrun: {found}"
    assert any("no HTML table" in f for f in found) and any("no plot" in f for f in found), found
    code = run.code_cells()
    assert code[0].prompt == "[1]:" and code[1].prompt == "[2]:", "the cells before the plant ran"
    assert not run.progress_bar()[0], "Run All should have stopped at the plant, before the pipeline ran"


def test_make_lab_serves_the_notebooks_in_order_with_the_project_kernel(tmp_path):
    """`make lab`, the learner's command (LAB_ARGS only adds --no-browser, loopback and a token): its file
    browser is notebooks/, listing 00..NN in order, and the default kernel is the project's python3."""
    server = lab_driver.LabServer(paths.NOTEBOOKS_DIR, tmp_path / "state", make_target="lab")
    try:
        server.start()
        listing = [f["name"] for f in server.api("api/contents")["content"] if f["type"] == "notebook"]
        expected = sorted(p.name for p in paths.NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))
        assert sorted(listing) == expected and len(expected) >= 12, listing
        specs = server.api("api/kernelspecs")
        assert specs["default"] == "python3", specs["default"]
        spec = specs["kernelspecs"]["python3"]["spec"]
        assert spec["display_name"] == "Python 3 (fast-diffusion)", spec["display_name"]
        assert Path(spec["argv"][0]).parent == (paths.ROOT / ".venv" / "bin"), spec["argv"][0]
    finally:
        server.stop()
