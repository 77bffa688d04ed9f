"""What the device tool copies to the GPU host, and how to keep it under its 64 MiB limit.

The device tool copies the working tree (tracked files and untracked files git does not ignore) plus the carried
`.whl/`, 64 MiB at most. The executed notebooks under data/ (copies of real runs, images embedded) are not needed on
the host and grow with every run, so before a lease they are moved aside, outside the tree, and put back after it:

    python tools/gpu_tree.py size    # MiB the device tool would copy, with .whl/ carried
    python tools/gpu_tree.py aside   # data/**/executed/ -> ../gpu-aside/ (refused if something is already aside)
    python tools/gpu_tree.py back    # ../gpu-aside/ -> data/**/executed/ (run it before merging the archives)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT_MIB = 64.0  # the device tool's limit on the working tree and the carried paths together
ASIDE = ROOT.parent / "gpu-aside"  # outside the tree, so the device tool never copies it


def copied_files(root: Path = ROOT) -> list[Path]:
    """The files the device tool copies: tracked and untracked-not-ignored files present in the tree."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, check=True).stdout.decode()
    return [root / p for p in sorted(set(out.split("\0"))) if p and (root / p).is_file()]


def copy_mib(root: Path = ROOT, carry: tuple[str, ...] = (".whl",)) -> float:
    """MiB the device tool copies: the tree's files plus the carried folders."""
    size = sum(p.stat().st_size for p in copied_files(root))
    size += sum(p.stat().st_size for c in carry for p in (root / c).rglob("*") if p.is_file())
    return size / 2**20


def executed_dirs(root: Path = ROOT) -> list[Path]:
    """The folders of executed notebook copies under data/ (not needed on the GPU host)."""
    return sorted(p for p in (root / "data").rglob("executed") if p.is_dir())


def aside(root: Path = ROOT, dest: Path = ASIDE) -> list[str]:
    """Move every executed/ folder under data/ to dest (same relative paths); refused if dest holds anything."""
    if dest.exists() and any(dest.iterdir()):
        raise SystemExit(f"gpu_tree: {dest} is not empty: run `python tools/gpu_tree.py back` first")
    moved = []
    for d in executed_dirs(root):
        target = dest / d.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(d), str(target))
        moved.append(str(d.relative_to(root)))
    return moved


def back(root: Path = ROOT, src: Path = ASIDE) -> list[str]:
    """Put back what aside moved; refused, moving nothing, where a file of the same name is in the tree again."""
    if not src.exists():
        return []
    files = [p for p in src.rglob("*") if p.is_file()]
    clash = [str(p.relative_to(src)) for p in files if (root / p.relative_to(src)).exists()]
    if clash:
        raise SystemExit(f"gpu_tree: these are in the tree and aside too, nothing moved: {clash}")
    for p in files:
        target = root / p.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(p), str(target))
    shutil.rmtree(src)
    return sorted({str(p.parent.relative_to(src)) for p in files})


def main(argv: list[str]) -> int:
    """`size`, `aside` or `back`."""
    what = argv[0] if argv else "size"
    if what == "aside":
        print("\n".join(f"aside: {d}" for d in aside()) or "aside: nothing to move")
    elif what == "back":
        print("\n".join(f"back: {d}" for d in back()) or "back: nothing aside")
    elif what != "size":
        print("usage: python tools/gpu_tree.py size|aside|back", file=sys.stderr)
        return 2
    size = copy_mib()
    print(f"gpu_tree: the device tool would copy {size:.1f} MiB with .whl/ carried (limit {LIMIT_MIB:.0f} MiB)"
          + ("" if size <= LIMIT_MIB else ": run `python tools/gpu_tree.py aside` before the lease"))
    return 0 if size <= LIMIT_MIB or what == "back" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
