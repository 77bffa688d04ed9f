"""Build .whl/: the project's pinned wheels that the GPU host lacks, for its Python 3.12 on x86-64.

    .venv/bin/python tools/gpu_bundle.py            # what `make gpu-bundle` runs
    .venv/bin/python tools/gpu_bundle.py --list     # print the plan (bundled vs taken from the image), build nothing

The GPU host has no network and its own Python (3.12, torch 2.11 + CUDA 13.0, transformers 5.17,
huggingface_hub 1.33, no diffusers, bitsandbytes, papermill or ipykernel; see shared/device/README.md).
Everything the notebooks import beyond torch travels as wheels in .whl/ at the versions requirements.txt
pins, so the host runs the code this project tests. The exceptions come from the image, and MANIFEST.txt
says which: torch, triton and the CUDA libraries (the point of the host), and compiled packages the image
already has (numpy, pandas, matplotlib, pillow, ...) whose wheels would push the bundle past its size budget.

The set of wheels is the dependency closure of ROOTS as installed in this project's .venv (so every version
is the one `make venv` installs from requirements.txt), with environment markers evaluated for the host.
bitsandbytes is slimmed to its CPU and CUDA 13.0 libraries. .whl/REVISION records the commit the wheels
and the working tree belong to, since the host gets a copy of the tree without its git history.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / ".whl"
BUDGET_MIB = 40.0

# What the notebooks, the helpers and the GPU run script import at run time (tests and JupyterLab stay home).
ROOTS: tuple[str, ...] = (
    "diffusers", "transformers", "huggingface_hub", "peft", "accelerate", "tokenizers", "safetensors",
    "bitsandbytes", "torchao", "sentencepiece", "pandas", "matplotlib", "numpy", "pillow", "tqdm", "psutil",
    "papermill", "nbformat", "nbclient", "ipykernel", "ipython", "ipywidgets",
)
# Not bundled: scikit-learn (training and tests only) and torchmetrics (tests only): helpers.quality's judge, PSNR
# and SSIM are plain torch with the shipped judge files, so G0 judges the trained smoke model's digits on the host
# without them; the bundle is at its budget (with torchmetrics: 40.3 MiB).
# Never bundled: the host's torch stack is what it is there for.
HOST_STACK = re.compile(r"^(torch|triton|nvidia[-_].*|cuda[-_].*)$")
# Compiled packages the GPU image has (device tool's package list, read 2026-11-17) and that we take from it:
# their wheels are large (numpy 16 MB, matplotlib 8 MB, ...) and their APIs are stable across the versions at
# hand. MANIFEST.txt names each with our pin, so a version difference is visible; the rehearsal installs them
# from the registry at the image's versions where known.
FROM_IMAGE: tuple[str, ...] = (
    "numpy", "matplotlib", "pillow", "psutil", "contourpy", "kiwisolver", "fonttools", "cycler",
    "pyparsing", "python-dateutil", "six", "packaging", "pyyaml", "regex", "sentencepiece", "jinja2",
    "markupsafe", "filelock", "fsspec", "typing-extensions", "sympy", "mpmath", "networkx", "requests",
    "urllib3", "idna", "certifi", "charset-normalizer", "click", "pygments", "setuptools", "hf-xet",
    "attrs", "aiohttp", "pandas",
)
# Declared dependencies that nothing here imports on the host, left out to stay within the size budget (each is
# imported by its parent only if present, which the rehearsal checks): IPython's completer (jedi), the kernel's
# debugger (debugpy), and the widgets' browser assets (tqdm's bars in an executed notebook need only ipywidgets).
LEFT_OUT: dict[str, str] = {
    "jedi": "IPython imports it only for tab completion",
    "debugpy": "ipykernel imports it only to attach a debugger",
    "widgetsnbextension": "JupyterLab's widget assets, not imported by Python",
    "jupyterlab-widgets": "JupyterLab's widget assets, not imported by Python",
}
# Host environment for evaluating markers (Requires-Dist lines such as `; python_version < "3.13"`).
HOST_ENV = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
            "platform_python_implementation": "CPython", "implementation_name": "cpython", "extra": ""}
PLATFORMS = ("manylinux_2_39_x86_64", "manylinux_2_35_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64",
             "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux_2_12_x86_64", "manylinux1_x86_64")


def norm(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: tuple[str, ...]) -> dict[str, str]:
    """Installed version of every package in the dependency closure of roots, markers evaluated for the host."""
    seen: dict[str, str] = {}
    image = {norm(n) for n in FROM_IMAGE}
    todo = [norm(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in seen or HOST_STACK.match(name.replace("-", "_")):
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError as err:
            if name in image:  # needed on 3.12 only (papermill's aiohttp): the image has it
                seen[name] = "not in this venv"
                continue
            raise SystemExit(f"gpu-bundle: {name} is not installed in this venv; run `make venv` first") from err
        seen[name] = dist.version
        if name in image or name in LEFT_OUT:  # the host provides it, or it is left out: not its dependencies
            continue
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or Marker(str(req.marker)).evaluate(HOST_ENV):
                todo.append(norm(req.name))
    return dict(sorted(seen.items()))


def pins() -> dict[str, str]:
    """The versions requirements.txt pins, by normalised name."""
    out = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==([^\s;#]+)", line.strip())
        if m:
            out[norm(m.group(1))] = m.group(2)
    return out


def plan() -> tuple[dict[str, str], dict[str, str]]:
    """(bundled, from_image): name -> version, from the closure; every pinned root matches requirements.txt."""
    wanted, pinned = closure(ROOTS), pins()
    for name in map(norm, ROOTS):
        if name in pinned and wanted.get(name) != pinned[name]:
            raise SystemExit(f"gpu-bundle: .venv has {name} {wanted.get(name)} but requirements.txt pins "
                             f"{pinned[name]}; run `make venv`")
    image = {norm(n) for n in FROM_IMAGE}
    bundled = {n: v for n, v in wanted.items() if n not in image and n not in LEFT_OUT}
    return bundled, {n: v for n, v in wanted.items() if n in image}


def download(bundled: dict[str, str], dest: Path) -> None:
    """Fetch each wheel (no dependencies: the closure is already complete) for CPython 3.12 on x86-64."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "-d", str(dest)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd + [f"{n}=={v}" for n, v in bundled.items()], check=True)


def slim_bitsandbytes(wheel: Path) -> None:
    """Keep only the CPU and CUDA 13.0 native libraries of a bitsandbytes wheel (the host runs torch cu130)."""
    tmp = wheel.with_suffix(".slim")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            lib = re.search(r"libbitsandbytes_([a-z0-9_]+)\.so$", item.filename)
            if lib and not (lib.group(1).startswith("cuda130") or lib.group(1) == "cpu"):
                continue
            dst.writestr(item, src.read(item.filename))
    tmp.replace(wheel)


def revision() -> str:
    """The commit the rows will name: environment.git_revision (what runs write does not make it dirty)."""
    sys.path.insert(0, str(ROOT))
    from helpers import environment  # here: the plan (--list) needs no torch import

    return environment.git_revision()


def manifest(bundled: dict[str, str], from_image: dict[str, str], size_mib: float) -> str:
    """The text of MANIFEST.txt: what travels, what the host's image must provide, and the size."""
    lines = [f"# .whl/ built by tools/gpu_bundle.py at {revision()}: {len(bundled)} wheels, {size_mib:.1f} MiB",
             "# bundled (installed on the host with pip --no-index --no-deps --target):"]
    lines += [f"{n}=={v}" for n, v in bundled.items()]
    lines += ["# taken from the host's image (this venv's version shown; the host's may differ):"]
    lines += [f"# {n}=={v}" for n, v in from_image.items()]
    lines += ["# left out (declared by a bundled package, not imported on the host):"]
    lines += [f"# {n}: {why}" for n, why in LEFT_OUT.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Build .whl/ (or, with --list, print the plan) and check its size against the budget."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list", action="store_true", help="print what would be bundled and exit")
    args = ap.parse_args(argv)
    bundled, from_image = plan()
    if args.list:
        print(manifest(bundled, from_image, 0.0), end="")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        download(bundled, Path(tmp))
        wheels = sorted(Path(tmp).glob("*.whl"))
        got = {norm(w.name.split("-")[0]) for w in wheels}
        if missing := sorted(set(bundled) - got):
            raise SystemExit(f"gpu-bundle: no wheel was downloaded for {missing}")
        for w in wheels:
            if norm(w.name.split("-")[0]) == "bitsandbytes":
                slim_bitsandbytes(w)
        if OUT.exists():
            shutil.rmtree(OUT)
        OUT.mkdir()
        for w in wheels:
            shutil.copy2(w, OUT / w.name)
    size = sum(f.stat().st_size for f in OUT.glob("*.whl")) / 2**20
    (OUT / "MANIFEST.txt").write_text(manifest(bundled, from_image, size))
    (OUT / "REVISION").write_text(revision() + "\n")
    print(f"gpu-bundle: {len(bundled)} wheels, {size:.1f} MiB in {OUT.relative_to(ROOT)}/ "
          f"(budget {BUDGET_MIB:.0f} MiB); {len(from_image)} packages come from the host's image")
    if size > BUDGET_MIB:
        print(f"gpu-bundle: over the {BUDGET_MIB:.0f} MiB budget", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
