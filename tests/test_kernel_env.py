"""helpers.kernel_env: the kernels that write executed copies draw no progress bars (a stored bar reads "0%")."""

import os

import nbformat
import papermill
import pytest

from helpers import kernel_env

SOURCE = "from tqdm.auto import tqdm\ntotal = sum(tqdm(range(3)))\nprint('sum', total)"


@pytest.mark.parametrize("quiet", [True, False])
def test_quiet_progress_stores_no_bar(tmp_path, monkeypatch, quiet):
    monkeypatch.delenv("IPYTHONDIR", raising=False)  # the kernel papermill starts inherits this environment
    if quiet:
        monkeypatch.setenv("IPYTHONDIR", kernel_env.quiet_progress(os.environ)["IPYTHONDIR"])
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(SOURCE)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "bar.ipynb"
    nbformat.write(nb, path)
    papermill.execute_notebook(str(path), str(path), kernel_name="python3", progress_bar=False)
    outputs = nbformat.read(path, as_version=4).cells[0].outputs
    texts = [o.get("text", "") or str(o.get("data", {}).get("text/plain", "")) for o in outputs]
    assert any("sum 3" in t for t in texts), texts  # the cell itself ran the same
    bars = [t for t in texts if "it/s" in t or "0/3" in t or "3/3" in t]
    assert (not bars) if quiet else bars, texts  # without the startup file the bar is stored (planted case)
