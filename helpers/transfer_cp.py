"""Notebook 16's context-parallel parity check: one denoiser step split with Ulysses over the ranks of a torchrun job,
against the same step in one process.

    torchrun --nproc-per-node 2 -m helpers.transfer_cp MODEL PROFILE DTYPE SEED HEIGHT WIDTH TOKENS OUT_JSON

Every rank builds the same seeded pipeline (helpers.pipelines), computes the unsplit step, then
`transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world_size))` and the split step; rank 0
writes {"drift", "degree", "backend"} (or {"error"}) to OUT_JSON. On CPU processes (gloo) diffusers needs the
device-count stand-in notebook 13 uses (helpers.parallel.cpu_device_count_shim). `run_split` launches it.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from helpers import compile_tools, parallel, params, pipelines


def split_step(model: str, profile: str, dtype: torch.dtype, seed: int, height: int, width: int,
               tokens: int) -> dict[str, Any]:
    """On this rank: the unsplit and the Ulysses-split step of the model's denoiser; their relative difference."""
    from diffusers import ContextParallelConfig

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    pipe = pipelines.build_pipeline(model, profile, dtype=dtype, device=device, seed=seed)
    inputs = pipelines.denoiser_inputs(pipe, height=height, width=width, max_sequence_length=tokens, seed=seed)
    net = pipelines.denoiser(pipe)
    shape = {"degree": dist.get_world_size(), "backend": dist.get_backend(),
             "text_tokens": inputs["encoder_hidden_states"].shape[1], "image_tokens": inputs["hidden_states"].shape[1]}
    with torch.inference_mode():
        reference = net(**inputs)[0].clone()
    try:
        with parallel.cpu_device_count_shim():
            net.enable_parallelism(config=ContextParallelConfig(ulysses_degree=dist.get_world_size()))
        with torch.inference_mode():
            out = net(**inputs)[0]
    except Exception as err:  # noqa: BLE001 the library's message is the result, with the shape it was given
        text = str(err).strip()
        return shape | {"error": f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"}
    return shape | {"drift": compile_tools.relative_error(out, reference)}


def main(argv: list[str]) -> int:
    """torchrun entry point: run split_step on every rank, rank 0 writes the result (or the error) as JSON."""
    model, profile, dtype_name, seed, height, width, tokens, out = argv
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    try:
        result = split_step(model, profile, params.DTYPES[dtype_name], int(seed), int(height), int(width),
                            int(tokens))
    except Exception as err:  # noqa: BLE001 the library's message is the result
        text = str(err).strip()
        result = {"error": f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"}
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()
    return 0


def run_split(model: str, profile: str, dtype_name: str, seed: int, height: int, width: int, tokens: int,
              degree: int = 2, timeout_s: float = 600) -> dict[str, Any]:
    """Launch main under `torchrun --nproc-per-node degree` and return what rank 0 wrote (or the launch error)."""
    with tempfile.TemporaryDirectory(prefix="nb16-cp-") as tmp:
        out = Path(tmp) / "split.json"
        try:
            parallel.torchrun(degree, "-m", "helpers.transfer_cp", model, profile, dtype_name, str(seed),
                              str(height), str(width), str(tokens), str(out), timeout_s=timeout_s)
        except (RuntimeError, OSError) as err:
            return {"error": str(err).strip().splitlines()[0]}
        return json.loads(out.read_text())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


def splitter(model: str, profile: str, dtype_name: str, seed: int, height: int, width: int, tokens: int,
             device: torch.device, degree: int = 2) -> Any:
    """A zero-argument callable running run_split for this model, or None where `degree` ranks cannot run here (a
    machine with fewer CUDA GPUs than ranks; CPU processes over gloo always can)."""
    if device.type == "cuda" and torch.cuda.device_count() < degree:
        return None
    return lambda: run_split(model, profile, dtype_name, seed, height, width, tokens, degree)
