"""The torchrun entry point of notebook 13: one denoiser step, single-process and split over the ranks, as rows.

Run as `torchrun --nproc-per-node N -m helpers.parallel_worker JOB` (helpers.parallel.launch does it), or as
`... -m helpers.parallel_worker --script SCRIPT ARGS` to run a notebook's script on CPU processes (run_script). Every rank
builds the same seeded pipeline; rank 0 times the single-process step, then all ranks run each strategy together,
split by the notebook's own script (its `split_transformer`, the job's "script"); rank 0 writes the rows through the
notebook's result writer (same run id), the other ranks write nothing.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import os
import pickle
import runpy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from helpers import compile_tools, measure, parallel, pipelines, workloads
from helpers.results import ResultWriter


def step_inputs(pipe: Any, run: Any, text_tokens: int) -> dict[str, Any]:
    """The first step's denoiser inputs at the run's resolution, with the prompt padded to text_tokens."""
    s = run.settings
    return pipelines.denoiser_inputs(pipe, height=s.height, width=s.width, guidance=s.guidance, seed=run.seed,
                                     max_sequence_length=text_tokens)


def geometry_of(pipe: Any, inputs: dict[str, Any], dtype: torch.dtype) -> parallel.Geometry:
    """The Geometry of a pipeline's denoiser at these inputs."""
    return parallel.flux_geometry(pipelines.denoiser(pipe).config, image_tokens=inputs["hidden_states"].shape[1],
                                  text_tokens=inputs["encoder_hidden_states"].shape[1], dtype=dtype)


def prepare(run: Any, text_tokens: int, device: torch.device
            ) -> tuple[Any, dict[str, Any], parallel.Geometry]:
    """The seeded pipeline on device, the first step's denoiser inputs and its denoiser's Geometry."""
    pipe = pipelines.build_pipeline(run.model, run.profile, weights=run.weights, dtype=run.dtype, device=device,
                                    seed=run.seed)
    inputs = step_inputs(pipe, run, text_tokens)
    return pipe, inputs, geometry_of(pipe, inputs, run.dtype)


def split_copies(denoiser: torch.nn.Module, strategies: list[str]) -> Iterator[tuple[str, torch.nn.Module]]:
    """(strategy, the model to split) for each strategy: a fresh copy for each but the last, which gets the denoiser
    itself (enable_parallelism may be called once per model; on an 80 GB GPU Flux-1-Dev has room for one copy)."""
    for i, strategy in enumerate(strategies):
        yield strategy, copy.deepcopy(denoiser) if i < len(strategies) - 1 else denoiser


def shape_fields(g: parallel.Geometry, world_size: int, backend: str) -> dict[str, Any]:
    """The row fields that say what was split: tokens, heads, head size, layers, element size, ranks, backend."""
    return {"image_tokens": g.image_tokens, "text_tokens": g.text_tokens, "heads": g.heads, "head_dim": g.head_dim,
            "attention_layers": g.layers, "out_channels": g.out_channels, "element_bytes": g.element_bytes,
            "world_size": world_size, "backend": backend, "threads_per_process": torch.get_num_threads()}


def record_single_step(writer: ResultWriter, step: Any, device: torch.device, fields: dict[str, Any]) -> None:
    """Time the unsplit denoiser step and record it as the single-process row."""
    s = writer.run.settings
    timing = measure.time_callable(step, device, repeats=s.repeats, warmup=s.warmup)
    writer.record(parallel.SINGLE_SCENARIO, timing=timing, strategy="none", degree=1, **fields)


def run_script(script: str, args: list[str]) -> int:
    """Run a notebook's torchrun script as __main__ on this rank, unchanged, with the CPU stand-ins in place where
    there is no accelerator (diffusers' context parallelism needs them there; parallel.cpu_shims)."""
    sys.argv = [script, *args]
    shims = parallel.cpu_shims() if torch.accelerator.device_count() == 0 else contextlib.nullcontext([])
    with shims:
        runpy.run_path(script, run_name="__main__")
    return 0


def main(argv: list[str]) -> int:
    """Run the job pickled at argv[0] on this rank; or, as `--script SCRIPT ARGS...`, a script (run_script)."""
    if argv and argv[0] == "--script":
        return run_script(argv[1], argv[2:])
    job: dict[str, Any] = pickle.loads(Path(argv[0]).read_bytes())
    run = job["run"]
    dist.init_process_group("nccl" if run.is_cuda else "gloo")
    rank, degree = dist.get_rank(), dist.get_world_size()
    # LOCAL_RANK: this process's GPU on its own node (the global rank counts every node's processes)
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if run.is_cuda else torch.device("cpu")
    if run.is_cuda:
        torch.cuda.set_device(device)
    split_transformer = runpy.run_path(job["script"])["split_transformer"]  # the notebook's own recipe
    writer = None
    if rank == 0:
        writer = ResultWriter(run, job["card"])
        writer.run_id = job["run_id"]  # the notebook's run: its own rows and these read back together
    s = run.settings
    pipe, inputs, geometry = prepare(run, job["text_tokens"], device)
    single = workloads.denoiser_call(pipe, inputs)
    reference = workloads.first_output(single())
    shape = shape_fields(geometry, degree, dist.get_backend())
    if writer is not None:  # the other ranks wait at the barrier while rank 0 times the step alone
        record_single_step(writer, single, device, shape)
    dist.barrier()

    for strategy, net in split_copies(pipelines.denoiser(pipe), job["strategies"]):
        with parallel.cpu_device_count_shim() as device_shim:
            split_transformer(net, strategy, degree)
        with parallel.cpu_lse_attention() if strategy == "ring" and not run.is_cuda else contextlib.nullcontext("") as lse_shim:
            step = workloads.denoiser_call(pipe, inputs, module=net)
            with parallel.count_collectives() as count:
                out = workloads.first_output(step())
            timing = measure.time_callable(step, device, repeats=s.repeats, warmup=s.warmup)
        expected = parallel.analytic_bytes(strategy, geometry, degree)
        if writer is not None:
            writer.record(parallel.scenario(strategy, degree), timing=timing, strategy=strategy, degree=degree,
                          rel_error=compile_tools.relative_error(out, reference),
                          parity_max_abs=float((out.float() - reference.float()).abs().max()),
                          bytes_sent_per_step=count.total, bytes_by_collective=count.sent,
                          calls_by_collective=count.calls, analytic_bytes=expected,
                          shims=[x for x in (device_shim, lse_shim) if x], **shape)
        del net, step, out  # this strategy's copy goes before the next is made
        gc.collect()
        if run.is_cuda:
            torch.cuda.empty_cache()
        dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
