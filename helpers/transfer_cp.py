"""Notebook 16's context-parallel parity check: one denoiser step split with Ulysses over the ranks of a torchrun job,
against the same step in one process.

    torchrun --nproc-per-node 2 -m helpers.transfer_cp MODEL PROFILE DTYPE SEED HEIGHT WIDTH TOKENS OUT_JSON [WEIGHTS [PROMPT]]

Every rank builds the same pipeline (helpers.pipelines; WEIGHTS as the notebook's column has them: "random" by
default, or the trained smoke Flux's folder, as notebook 13 splits it), encodes PROMPT (the notebook's: Qwen-Image's
text length is the prompt's own), computes the unsplit step, then
`transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world_size))` and the split step; rank 0
writes {"drift", "degree", "backend", "weights", "dtype", tokens} (or {"error"}) to OUT_JSON. Where the plain config
refuses a sequence that does not divide by the degree (an odd text length over 2 ranks), the split is tried again on a
freshly built denoiser with `ulysses_anything=True` (diffusers 0.42 shards unevenly and gathers by size), the plain
error kept as "plain_error". On CPU processes (gloo) diffusers needs the device-count stand-in notebook 13 uses
(helpers.parallel.cpu_device_count_shim). `run_split` launches it.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from helpers import compile_tools, parallel, params, pipelines, text

NOT_DIVISIBLE = "divisible by mesh size"  # the plain config's refusal of an uneven split (transfer.NOT_DIVISIBLE)


def _split(net: torch.nn.Module, inputs: dict[str, Any], reference: torch.Tensor, **config: Any) -> dict[str, Any]:
    """enable_parallelism(ContextParallelConfig(ulysses_degree=world size, **config)) and the split step: its drift
    from the unsplit reference, or the library's error."""
    from diffusers import ContextParallelConfig

    try:
        with parallel.cpu_device_count_shim():
            net.enable_parallelism(config=ContextParallelConfig(ulysses_degree=dist.get_world_size(), **config))
        with torch.inference_mode():
            out = net(**inputs)[0]
    except Exception as err:  # noqa: BLE001 the library's message is the result, with the shape it was given
        return {"error": text.first_line(err)}
    return {"drift": compile_tools.relative_error(out, reference)}


def weights_label(weights: str) -> str:
    """'random', or the folder name / hub id the weights came from (e.g. 'flux-dev-smoke')."""
    return "random" if weights == "random" else Path(weights).name or weights


def split_step(model: str, profile: str, dtype: torch.dtype, seed: int, height: int, width: int,
               tokens: int, weights: str = "random", prompt: str = pipelines.PROMPT) -> dict[str, Any]:
    """On this rank: the unsplit and the Ulysses-split step of the model's denoiser; their relative difference. An
    uneven split the plain config refuses is tried again, on a rebuilt denoiser, with ulysses_anything=True."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    build = lambda: pipelines.build_pipeline(model, profile, weights=weights, dtype=dtype, device=device,
                                             seed=seed)
    pipe = build()
    inputs = pipelines.denoiser_inputs(pipe, height=height, width=width, max_sequence_length=tokens, seed=seed,
                                       prompt=prompt)
    shape = {"degree": dist.get_world_size(), "backend": dist.get_backend(), "weights": weights_label(weights),
             "dtype": next((k for k, v in params.DTYPES.items() if v == dtype), str(dtype)),
             "text_tokens": inputs["encoder_hidden_states"].shape[1], "image_tokens": inputs["hidden_states"].shape[1]}
    with torch.inference_mode():
        reference = pipelines.denoiser(pipe)(**inputs)[0].clone()
    result = _split(pipelines.denoiser(pipe), inputs, reference)
    if NOT_DIVISIBLE not in result.get("error", ""):
        return shape | result
    del pipe  # enable_parallelism is once per model: the retry splits a fresh one, the refused one freed first
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    retry = _split(pipelines.denoiser(build()), inputs, reference, ulysses_anything=True)
    return shape | {"plain_error": result["error"], "change": "ulysses_anything=True"} | retry


def main(argv: list[str]) -> int:
    """torchrun entry point: run split_step on every rank, rank 0 writes the result (or the error) as JSON."""
    model, profile, dtype_name, seed, height, width, tokens, out, *rest = argv
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    try:
        result = split_step(model, profile, params.DTYPES[dtype_name], int(seed), int(height), int(width),
                            int(tokens), *rest[:2])
    except Exception as err:  # noqa: BLE001 the library's message is the result
        result = {"error": text.first_line(err)}
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(result))
    dist.barrier()  # no rank tears down (where gloo may abort: run_split) before rank 0 has written the result
    dist.destroy_process_group()
    return 0


def run_split(model: str, profile: str, dtype_name: str, seed: int, height: int, width: int, tokens: int,
              degree: int = 2, timeout_s: float = 600, weights: str = "random",
              prompt: str = pipelines.PROMPT) -> dict[str, Any]:
    """Launch main under `torchrun --nproc-per-node degree` and return what rank 0 wrote (or the launch error)."""
    with tempfile.TemporaryDirectory(prefix="nb16-cp-") as tmp:
        out = Path(tmp) / "split.json"
        try:
            parallel.torchrun(degree, "-m", "helpers.transfer_cp", model, profile, dtype_name, str(seed),
                              str(height), str(width), str(tokens), str(out), str(weights), prompt, timeout_s=timeout_s)
        except (RuntimeError, OSError) as err:
            lines = str(err).strip().splitlines()
            if not out.is_file():
                return {"error": lines[0]}
            # the result was written and a rank died at teardown after it: gloo's threads can abort a process on
            # exit ("terminate called without an active exception", torch 2.13, CPU): the measurement stands
            abort = next((ln.strip() for ln in lines if "terminate called" in ln or "Signal " in ln), "")
            return json.loads(out.read_text()) | {"teardown_error": f"{lines[0]} {abort}".strip()}
        return json.loads(out.read_text())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


def splitter(model: str, profile: str, dtype_name: str, seed: int, height: int, width: int, tokens: int,
             device: torch.device, degree: int = 2, weights: str = "random", prompt: str = pipelines.PROMPT) -> Any:
    """A zero-argument callable running run_split for this model with the weights its column runs, or None where
    `degree` ranks cannot run here (a machine with fewer CUDA GPUs than ranks; CPU processes over gloo always can)."""
    if device.type == "cuda" and torch.cuda.device_count() < degree:
        return None
    return lambda: run_split(model, profile, dtype_name, seed, height, width, tokens, degree, weights=weights,
                             prompt=prompt)
