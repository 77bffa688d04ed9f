"""The environment card's git revision: clean after a rerun that only rewrote results, dirty after a code change."""

import subprocess

from helpers import environment, paths


def _git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_git_revision_ignores_run_outputs_but_not_code(tmp_path, monkeypatch):
    for rel in ("helpers/code.py", "data/results/cpu/nb.jsonl", "figures/cpu/plot.png", "README.md"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("v1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    monkeypatch.setattr(paths, "ROOT", tmp_path)
    clean = environment.git_revision()
    assert len(clean) == 12 and "+" not in clean
    for rel in ("data/results/cpu/nb.jsonl", "figures/cpu/plot.png", "README.md"):  # what a run rewrites
        (tmp_path / rel).write_text("v2\n")
    assert environment.git_revision() == clean
    (tmp_path / "helpers/code.py").write_text("v2\n")
    assert environment.git_revision() == clean + "+dirty"
