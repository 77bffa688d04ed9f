"""The torchrun entry point of notebook 13: one denoiser step, single-process and split over the ranks, as rows.

Run as `torchrun --nproc-per-node N -m helpers.parallel_worker JOB` (helpers.parallel.launch does it). Every rank
builds the same seeded pipeline; rank 0 times the single-process step, then all ranks run each strategy together;
rank 0 writes the rows through the notebook's result writer (same run id), the other ranks write nothing.
"""

from __future__ import annotations

import contextlib
import copy
import pickle
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from diffusers import ContextParallelConfig

from helpers import compile_tools, measure, parallel, pipelines, workloads
from helpers.results import ResultWriter


def split_denoiser(transformer: torch.nn.Module, strategy: str, degree: int) -> None:
    """The diffusers calls a user makes: Ulysses (all-to-all) or ring (K/V all-gather) over `degree` ranks."""
    if strategy == "ulysses":
        config = ContextParallelConfig(ulysses_degree=degree)
    else:
        config = ContextParallelConfig(ring_degree=degree)
        if next(transformer.parameters()).is_cuda:  # ring merges partial results by their log-sum-exp, which
            transformer.set_attention_backend("_native_cudnn")  # native SDPA does not return (the docs' choice)
    transformer.enable_parallelism(config=config)


def prepare(run: Any, text_tokens: int, device: torch.device, *, keep_copy: bool = True
            ) -> tuple[Any, dict[str, Any], torch.nn.Module | None, parallel.Geometry]:
    """The seeded pipeline on device, the first step's denoiser inputs, an untouched copy of its denoiser (to split;
    None unless keep_copy) and its Geometry."""
    s = run.settings
    pipe = pipelines.build_pipeline(run.model, run.profile, weights=run.weights, dtype=run.dtype, device=device,
                                    seed=run.seed)
    inputs = pipelines.denoiser_inputs(pipe, height=s.height, width=s.width, guidance=s.guidance, seed=run.seed,
                                       max_sequence_length=text_tokens)
    net = pipelines.denoiser(pipe)
    pristine = copy.deepcopy(net) if keep_copy else None
    geometry = parallel.flux_geometry(net.config, image_tokens=inputs["hidden_states"].shape[1],
                                      text_tokens=inputs["encoder_hidden_states"].shape[1], dtype=run.dtype)
    return pipe, inputs, pristine, geometry


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


def main(argv: list[str]) -> int:
    """Run the job pickled at argv[0] on this rank."""
    job: dict[str, Any] = pickle.loads(Path(argv[0]).read_bytes())
    run = job["run"]
    dist.init_process_group("nccl" if run.is_cuda else "gloo")
    rank, degree = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", rank) if run.is_cuda else torch.device("cpu")
    if run.is_cuda:
        torch.cuda.set_device(device)
    writer = None
    if rank == 0:
        writer = ResultWriter(run, job["card"])
        writer.run_id = job["run_id"]  # the notebook's run: its own rows and these read back together
    s = run.settings
    pipe, inputs, pristine, geometry = prepare(run, job["text_tokens"], device)
    single = workloads.denoiser_call(pipe, inputs)
    reference = workloads.first_output(single())
    shape = shape_fields(geometry, degree, dist.get_backend())
    if writer is not None:  # the other ranks wait at the barrier while rank 0 times the step alone
        record_single_step(writer, single, device, shape)
    dist.barrier()

    for strategy in job["strategies"]:
        net = copy.deepcopy(pristine)  # enable_parallelism may be called once per model
        with parallel.cpu_device_count_shim() as device_shim:
            split_denoiser(net, strategy, degree)
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
        dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
