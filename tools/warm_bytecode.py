"""Write the bytecode (.pyc) of the modules the notebooks import, once, right after `make venv` installs the pins.

`make venv` installs with `pip install --no-compile`: pip would otherwise compile every file of every package
(transformers alone ships thousands of model files no notebook imports), which took 88 s of the 138 s install on
the 2-core AMD EPYC (2026-11-28). This script imports what a notebook imports, with bytecode writing switched on
by the Makefile (`env -u PYTHONDONTWRITEBYTECODE`), so those modules load from .pyc in every later process; a
module first imported elsewhere is compiled there.
"""

import importlib
import pkgutil

import helpers


def main() -> None:
    """Import every helpers module, the pipelines and the libraries the levers call."""
    for module in pkgutil.iter_modules(helpers.__path__):
        importlib.import_module(f"helpers.{module.name}")
    for name in ("accelerate.utils", "bitsandbytes", "peft", "torch._inductor.compile_fx", "torchao.quantization",
                 "papermill", "matplotlib.pyplot", "IPython.display"):
        importlib.import_module(name)
    from diffusers import Flux2Pipeline, FluxPipeline, QwenImagePipeline, StableDiffusionXLPipeline  # noqa: F401


if __name__ == "__main__":
    main()
