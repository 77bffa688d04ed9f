"""tools/gpu_tree.py: the size the device tool copies, and the executed copies moved aside and back intact."""

import importlib.util
import subprocess

import pytest

from helpers import paths

_spec = importlib.util.spec_from_file_location("gpu_tree", paths.ROOT / "tools" / "gpu_tree.py")
gpu_tree = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_tree)

MIB = 2**20


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    for rel, size in {"data/results/h100/executed/00.ipynb": 3 * MIB, "data/gpu-check/h100/executed/12.ipynb": MIB,
                      "data/results/h100/00.jsonl": MIB, ".whl/x-1-py3-none-any.whl": 2 * MIB,
                      "ignored/big.bin": 8 * MIB}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"x" * size)
    (root / ".gitignore").write_text(".whl/\nignored/\n")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "data"], cwd=root, check=True)  # .gitignore stays untracked, not ignored
    return root


def test_size_counts_the_tree_and_the_carried_bundle_not_ignored_files(repo):
    assert gpu_tree.copy_mib(repo) == pytest.approx(7, abs=0.01)  # 3 + 1 + 1 in the tree, 2 carried; not ignored/


def test_aside_then_back_restores_every_executed_copy(repo, tmp_path):
    dest = tmp_path / "aside"
    assert gpu_tree.aside(repo, dest) == ["data/gpu-check/h100/executed", "data/results/h100/executed"]
    assert gpu_tree.copy_mib(repo) == pytest.approx(3, abs=0.01)  # what a lease's command copies
    assert (repo / "data/results/h100/00.jsonl").exists()  # rows stay
    with pytest.raises(SystemExit, match="not empty"):
        gpu_tree.aside(repo, dest)  # a second aside would mix two trees' copies
    gpu_tree.back(repo, dest)
    assert (repo / "data/results/h100/executed/00.ipynb").stat().st_size == 3 * MIB and not dest.exists()


def test_back_refuses_to_overwrite_a_copy_merged_meanwhile(repo, tmp_path):
    dest = tmp_path / "aside"
    gpu_tree.aside(repo, dest)
    (repo / "data/results/h100/executed").mkdir(parents=True)
    (repo / "data/results/h100/executed/00.ipynb").write_text("merged before back")  # the planted mistake
    with pytest.raises(SystemExit, match="nothing moved"):
        gpu_tree.back(repo, dest)
    assert (dest / "data/results/h100/executed/00.ipynb").exists()  # nothing lost
