"""Context parallelism with diffusers on torch.distributed: checks, CPU shims, counted and analytic bytes, a scaling model.

Notebook 13 launches `python -m helpers.parallel_worker` under torchrun; the worker uses what is here. Nothing here
times anything (that is `helpers.measure`); the byte counter reads the sizes of the tensors the collectives are handed.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from diffusers import FluxTransformer2DModel

from helpers import compile_tools, paths, pipelines, report, results
from helpers.params import ParameterError

SINGLE_SCENARIO = "denoiser step: single process"
XDIT_SOURCE = "xDiT flux performance doc"
DIFFUSERS_CP_SOURCE = "diffusers distributed-inference doc"
STRATEGIES: tuple[str, ...] = ("ulysses", "ring")
# NVIDIA H100 SXM: NVLink 4 at 900 GB/s bidirectional per GPU, i.e. 450 GB/s each way.
NVLINK_H100_BYTES_PER_S: float = 450e9
NVLINK_SOURCE = "https://www.nvidia.com/en-us/data-center/h100/"
SCALING_GPUS: tuple[int, ...] = (2, 4, 8)


@dataclass(frozen=True)
class Geometry:
    """What decides a Flux denoiser step's traffic: tokens, heads, head size, attention layers, element size."""

    batch: int
    image_tokens: int
    text_tokens: int
    heads: int
    head_dim: int
    layers: int
    out_channels: int
    element_bytes: int

    @property
    def tokens(self) -> int:
        """The joint sequence (text + image) every attention layer of Flux attends over."""
        return self.image_tokens + self.text_tokens


def flux_geometry(config: Any, *, image_tokens: int, text_tokens: int, dtype: torch.dtype, batch: int = 1) -> Geometry:
    """The Geometry of a FluxTransformer2DModel config (a model's .config or a loaded config dict) at a sequence."""
    return Geometry(batch=batch, image_tokens=image_tokens, text_tokens=text_tokens,
                    heads=config["num_attention_heads"], head_dim=config["attention_head_dim"],
                    layers=config["num_layers"] + config["num_single_layers"],
                    out_channels=config["patch_size"] ** 2 * (config.get("out_channels") or config["in_channels"]),
                    element_bytes=torch.finfo(dtype).bits // 8)


def profile_geometry(profile: str, *, height: int, width: int, text_tokens: int, dtype: torch.dtype) -> Geometry:
    """The Geometry of the shipped Flux config of a profile at a resolution, read before anything is built.

    Flux packs 2x2 latent pixels of the VAE's 8x-downsampled latent into one token: (height/16) x (width/16)."""
    config = FluxTransformer2DModel.load_config(pipelines.config_dir("flux-dev", profile) / "transformer")
    return flux_geometry(config, image_tokens=(height // 16) * (width // 16), text_tokens=text_tokens, dtype=dtype)


def scenario(strategy: str, degree: int) -> str:
    """Row name of a denoiser step split by strategy over degree ranks."""
    return f"denoiser step: {strategy}-{degree}"


def analytic_bytes(strategy: str, g: Geometry, n: int) -> dict[str, int]:
    """Bytes one rank sends per denoiser step, by part: the attention layers' exchange and the final output gather.

    Each rank holds S/n tokens of q, k, v (B x S/n x H x D each). Ulysses: per layer an all-to-all of q, k, v before
    attention and of the output after it, each rank keeping 1/n of its shard and sending (n-1)/n: 4 (n-1)/n B S/n H D.
    Ring (all-gather of k and v): per layer each rank sends its k and v shard to the n-1 others: (n-1) 2 B S/n H D.
    Both: the model's output (B x image tokens/n x out channels) is all-gathered once: (n-1) B S_img/n C."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r}; allowed: {STRATEGIES}")
    shard = g.batch * g.tokens // n * g.heads * g.head_dim * g.element_bytes
    if strategy == "ulysses":
        attention = g.layers * 4 * shard * (n - 1) // n
    else:
        attention = g.layers * 2 * shard * (n - 1)
    output = (n - 1) * g.batch * g.image_tokens // n * g.out_channels * g.element_bytes
    return {"attention": attention, "output gather": output, "total": attention + output}


def formula(strategy: str) -> str:
    """The analytic volume of a strategy as a readable formula."""
    core = "4 * (n-1)/n * B*S/n*H*D" if strategy == "ulysses" else "2 * (n-1) * B*S/n*H*D"
    return f"layers * {core} * bytes + (n-1) * B*S_img/n*C * bytes"


def available_ranks(device: torch.device) -> tuple[int, str]:
    """How many ranks this machine can run one per device: its GPUs on CUDA, else its CPU cores (gloo processes)."""
    if device.type == "cuda":
        return torch.cuda.device_count(), "GPUs"
    return os.cpu_count() or 1, "CPU cores (one gloo process each)"


def check_degree(degree: Any, available: int, what: str) -> int:
    """Return degree if it is an int >= 2 and at most the devices (or CPU processes) available, else raise."""
    if not (isinstance(degree, int) and not isinstance(degree, bool) and degree >= 2):
        raise ParameterError(f"DEGREE={degree!r} must be None or an integer >= 2 (the processes to split over)")
    if degree > available:
        allowed = f"choose an integer from 2 to {available}" if available >= 2 else "no split is possible here"
        raise ParameterError(f"DEGREE={degree} is larger than the {available} {what} available; {allowed}, "
                             f"or None")
    return degree


def resolve_degree(degree: Any, profile: str, available: int, what: str) -> tuple[int | None, str]:
    """DEGREE as given (checked) or, for None, from the profile: smoke 2, full all GPUs; None with why when < 2."""
    if degree is not None:
        return check_degree(degree, available, what), "chosen explicitly"
    wanted = 2 if profile == "smoke" else available
    if wanted < 2 or available < 2:
        return None, (f"context parallelism needs 2 or more {what.split(' ')[0]}; this machine has {available} "
                      f"(the GPU machines lent to this project have one GPU each)")
    return wanted, f"{profile} profile: {wanted} {what}"


def check_divisible(g: Geometry, degree: int, strategies: list[str]) -> None:
    """Raise unless the image and text tokens (and, for Ulysses, the heads) split evenly over degree ranks."""
    bad = [f"{name} = {count}" for name, count in (("image tokens", g.image_tokens), ("text tokens", g.text_tokens))
           if count % degree]
    if "ulysses" in strategies and g.heads % degree:
        bad.append(f"attention heads = {g.heads} (Ulysses splits the heads)")
    if bad:
        raise ParameterError(f"the sequence does not split over DEGREE={degree} ranks: {', '.join(bad)} "
                             f"not divisible by {degree}; choose TEXT_TOKENS (and a resolution) divisible by it")


# --- shims for a CPU-only machine (each a no-op where an accelerator exists) ---

@contextlib.contextmanager
def cpu_device_count_shim() -> Iterator[str]:
    """Inside the block, torch.accelerator.device_count() answers 1 where it would answer 0 (a CPU-only machine).

    diffusers 0.42's `_resolve_parallel_config` places each rank on `rank % torch.accelerator.device_count()`, which
    divides by zero without an accelerator; with the shim every rank is on `cpu:0`. Yields what it did."""
    real = torch.accelerator.device_count
    if real() > 0:
        yield ""
        return
    torch.accelerator.device_count = lambda: 1  # type: ignore[assignment]
    try:
        yield "torch.accelerator.device_count() read as 1 during enable_parallelism (no accelerator here)"
    finally:
        torch.accelerator.device_count = real  # type: ignore[assignment]


def _cpu_flash_forward_op(original: Any) -> Any:
    """diffusers' native attention forward op, answering return_lse=True on CPU tensors with PyTorch's CPU flash
    kernel, which returns the log-sum-exp; every other call goes to original."""
    def forward_op(ctx: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
                   scale: float | None = None, enable_gqa: bool = False, return_lse: bool = False,
                   _save_ctx: bool = True, _parallel_config: Any = None) -> Any:
        if not return_lse or query.device.type != "cpu" or attn_mask is not None:
            return original(ctx, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse,
                            _save_ctx=_save_ctx, _parallel_config=_parallel_config)
        q, k, v = (x.transpose(1, 2) for x in (query, key, value))  # (B, S, H, D) -> (B, H, S, D)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal,
                                                                                scale=scale)
        return out.transpose(1, 2), lse.transpose(1, 2)  # back to (B, S, H, D) and (B, S, H), as diffusers expects
    return forward_op


@contextlib.contextmanager
def cpu_lse_attention() -> Iterator[str]:
    """Inside the block, diffusers' native attention backend returns the log-sum-exp on CPU, which ring attention needs.

    diffusers 0.42's native backend raises "Native attention does not support return_lse=True"; its backends that
    return it (flash, cuDNN) need CUDA. PyTorch's CPU flash kernel computes the same log-sum-exp. Yields what it did."""
    from diffusers.models import attention_dispatch

    original = attention_dispatch._native_attention_forward_op
    attention_dispatch._native_attention_forward_op = _cpu_flash_forward_op(original)
    try:
        yield "native attention answers return_lse=True on CPU with aten._scaled_dot_product_flash_attention_for_cpu"
    finally:
        attention_dispatch._native_attention_forward_op = original


@contextlib.contextmanager
def cpu_shims() -> Iterator[list[str]]:
    """Both CPU stand-ins at once, for a script run on CPU processes (each a no-op where it is not needed): the device
    count diffusers divides by, and an attention op that returns the log-sum-exp ring attention merges with. Yields
    what each did."""
    with cpu_device_count_shim() as device, cpu_lse_attention() as lse:
        yield [x for x in (device, lse) if x]


# --- counting what the collectives send ---

@dataclass
class CollectiveCount:
    """Bytes this rank sent to other ranks, and calls, per collective, while counting."""

    sent: dict[str, int] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, nbytes: int) -> None:
        """Record one call of a collective that sent nbytes to other ranks."""
        self.sent[name] = self.sent.get(name, 0) + nbytes
        self.calls[name] = self.calls.get(name, 0) + 1

    @property
    def total(self) -> int:
        """All bytes sent to other ranks."""
        return sum(self.sent.values())


def _process_group(group: Any) -> Any:
    """The process group of a device mesh (1-D), or group itself (None: the default group)."""
    return group.get_group() if isinstance(group, dist.device_mesh.DeviceMesh) else group


def _group_size(group: Any) -> int:
    """World size of a process group, a device mesh, or the default group (None)."""
    return dist.get_world_size(_process_group(group))


@contextlib.contextmanager
def count_collectives() -> Iterator[CollectiveCount]:
    """Count the bytes this rank sends through the collectives diffusers' context parallelism calls.

    all_to_all_single with equal splits keeps 1/n of its input and sends the rest; an all-gather sends this rank's
    tensor to each of the n-1 others. Sizes come from the tensors handed to torch.distributed, not from a formula."""
    count = CollectiveCount()
    real_a2a, real_gather_tensor, real_all_gather = funcol.all_to_all_single, funcol.all_gather_tensor, dist.all_gather

    def all_to_all_single(x: torch.Tensor, output_split_sizes: Any, input_split_sizes: Any, group: Any,
                          *args: Any, **kwargs: Any) -> Any:
        n, rank = _group_size(group), dist.get_rank(_process_group(group))
        per_row = x.numel() // x.shape[0] if x.ndim else 1
        own = x.numel() // n if input_split_sizes is None else input_split_sizes[rank] * per_row
        count.add("all_to_all_single", (x.numel() - own) * x.element_size())
        return real_a2a(x, output_split_sizes, input_split_sizes, group, *args, **kwargs)

    def all_gather_tensor(x: torch.Tensor, gather_dim: int, group: Any, *args: Any, **kwargs: Any) -> Any:
        count.add("all_gather_tensor", (_group_size(group) - 1) * x.numel() * x.element_size())
        return real_gather_tensor(x, gather_dim, group, *args, **kwargs)

    def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: Any = None, *args: Any,
                   **kwargs: Any) -> Any:
        count.add("all_gather", (_group_size(group) - 1) * tensor.numel() * tensor.element_size())
        return real_all_gather(tensor_list, tensor, group, *args, **kwargs)

    funcol.all_to_all_single, funcol.all_gather_tensor, dist.all_gather = all_to_all_single, all_gather_tensor, all_gather
    try:
        yield count
    finally:
        funcol.all_to_all_single, funcol.all_gather_tensor, dist.all_gather = real_a2a, real_gather_tensor, real_all_gather


# --- the claims, as checks that can fail ---

def check_parity(rel_error: float, dtype_name: str) -> float:
    """Return the split output's relative L2 error against the single-process one if it is within the parity
    tolerance of its dtype (compile_tools.PARITY_TOLERANCE: a few roundings of the dtype), else raise."""
    tolerance = compile_tools.PARITY_TOLERANCE[dtype_name]
    if not rel_error <= tolerance:
        raise AssertionError(f"split output differs from the single-process output by {rel_error:.3g} (relative L2), "
                             f"above the {dtype_name} tolerance {tolerance:g}")
    return rel_error


def check_bytes(counted: int, analytic: int, what: str) -> None:
    """Raise unless the bytes counted from the collectives equal the analytic volume exactly."""
    if counted != analytic:
        raise AssertionError(f"{what}: counted {counted:,} bytes sent per step, the analytic volume is {analytic:,}")


# --- the scaling model on paper ---

def predicted_step_s(t1_s: float, bytes_sent: int, n: int, bandwidth: float = NVLINK_H100_BYTES_PER_S) -> float:
    """Step time on n GPUs if compute splits perfectly and communication does not overlap it: t1/n + bytes/bandwidth."""
    if t1_s <= 0 or n < 1 or bandwidth <= 0:
        raise ValueError(f"t1_s, n and bandwidth must be positive, got {t1_s}, {n}, {bandwidth}")
    return t1_s / n + bytes_sent / bandwidth


def published(source: str, scenario: str, *, required: bool = False) -> float | None:
    """One published value from data/reference/published-numbers.csv (its own unit); None when not published, or
    KeyError when required."""
    pub = report.published_numbers()
    hit = pub[(pub["source"] == source) & (pub["scenario"] == scenario)]
    if len(hit) > 1 or (required and hit.empty):
        raise KeyError(f"published-numbers.csv has {len(hit)} rows for {source!r} / {scenario!r}")
    return float(hit["value"].iloc[0]) if len(hit) else None


def xdit_scenario(strategy: str, n: int) -> str:
    """The scenario name of xDiT's published Flux figure for a strategy on n H100s (with torch.compile)."""
    return "1 GPU + torch.compile" if n == 1 else f"{strategy.capitalize()}-{n} + torch.compile"


# Notebook 03's compiled Flux step, in order of preference: inductor's defaults, then the precision-cast emulation.
NB03_STEPS = ["denoiser step compiled (default, no precision-cast emulation)", "denoiser step compiled (default)"]
NB03_IMAGES = ["pipeline compiled (default, no precision-cast emulation)", "pipeline compiled (default)"]  # the same


def _nb03_h100(results_dir: Path) -> pd.DataFrame:
    """Notebook 03's ok full-profile Flux rows on an H100, or an empty frame."""
    nb03 = results.read_rows(results_dir, notebook="03_torch_compile")
    if nb03.empty:
        return nb03
    return nb03[nb03["hardware"].str.startswith("h100") & (nb03["profile"] == "full") & (nb03["status"] == "ok")
                & (nb03["model"] == "flux-dev")]


def model_step_s(results_dir: Path, own: pd.DataFrame, steps: int = 28) -> tuple[float, str]:
    """The single-GPU step time the scaling model starts from, and where it comes from.

    In order: notebook 03's compiled denoiser step on an H100 (full profile); this notebook's own single-GPU step on
    the full profile; else xDiT's published one-H100 torch.compile latency divided by its 28 steps."""
    nb03 = _nb03_h100(results_dir)
    if not nb03.empty:
        hit = nb03[nb03["scenario"].isin(NB03_STEPS)]
        if not hit.empty:  # the unemulated compile (what the recipe gives a user) where the run has it
            r = hit.assign(rank=hit["scenario"].map(NB03_STEPS.index)).sort_values("rank", kind="stable").iloc[0]
            return float(r["latency_median_s"]), f"measured: notebook 03, compiled denoiser step on {r['hardware']}"
    if not own.empty:
        hit = own[(own["profile"] == "full") & (own["hardware"] != "cpu") & (own["status"] == "ok")
                  & (own["model"] == "flux-dev") & (own["scenario"] == SINGLE_SCENARIO)]
        if not hit.empty:
            r = hit.iloc[-1]
            return float(r["latency_median_s"]), f"measured here: eager denoiser step on {r['hardware']}"
    value = published(XDIT_SOURCE, xdit_scenario("", 1), required=True)
    return value / steps, (f"published, not measured: xDiT's {value:g} s for a {steps}-step image on one H100 with "
                           f"torch.compile, / {steps} (no H100 rows of notebook 03 under data/results yet)")


def model_unsplit_s(results_dir: Path, steps: int = 28) -> tuple[float, str]:
    """The part of one GPU's image that no split shortens (text encoders, VAE, scheduler), and where it comes from:
    notebook 03's compiled image on an H100 less steps times its compiled step, both of the run model_step_s reads;
    0 where no such pair is committed (the prediction then counts the steps alone, and says so)."""
    nb03 = _nb03_h100(results_dir)
    for step_name, image_name in zip(NB03_STEPS, NB03_IMAGES, strict=True) if not nb03.empty else ():
        step, image = nb03[nb03["scenario"] == step_name], nb03[nb03["scenario"] == image_name]
        if len(step) and len(image):
            t1, whole = float(step["latency_median_s"].iloc[0]), float(image["latency_median_s"].iloc[0])
            return whole - steps * t1, (f"measured: notebook 03's compiled image on {image['hardware'].iloc[0]}, "
                                        f"{whole:.2f} s, less {steps} of its {t1 * 1e3:.1f} ms steps")
    return 0.0, "not measured (no H100 image of notebook 03): the prediction counts the denoiser steps alone"


def scaling_table(t1_s: float, g: Geometry, strategies: list[str], steps: int = 28, unsplit_s: float = 0.0,
                  gpus: tuple[int, ...] = SCALING_GPUS, bandwidth: float = NVLINK_H100_BYTES_PER_S) -> pd.DataFrame:
    """The model's prediction per strategy and GPU count, beside xDiT's published 4x/2x H100 figures (per image:
    unsplit_s, the part no split shortens, plus steps predicted steps)."""
    out = []
    for n in gpus:
        for strategy in strategies:
            sent = analytic_bytes(strategy, g, n)["total"]
            step = predicted_step_s(t1_s, sent, n, bandwidth)
            xdit = published(XDIT_SOURCE, xdit_scenario(strategy, n))
            image = unsplit_s + step * steps
            out.append({"GPUs": n, "strategy": strategy, "sent per rank per step (MB)": sent / 1e6,
                        "communication per step (ms)": sent / bandwidth * 1e3, "predicted step (ms)": step * 1e3,
                        f"predicted image (s): unsplit part + {steps} steps": image,
                        "xDiT published image (s)": xdit,
                        "predicted / published": None if xdit is None else image / xdit})
    return pd.DataFrame(out)


# --- launching the worker ---

def torchrun_command(nproc: int, *target: str) -> list[str]:
    """The command that starts target (a script and its arguments, or -m module ...) once per process:
    `torchrun --standalone --nproc-per-node nproc ...`, as `python -m torch.distributed.run` of this interpreter."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *target]


def worker_pythonpath() -> str:
    """PYTHONPATH for the workers: this project first, then what this process was given (a GPU host's bundle)."""
    return os.pathsep.join([str(paths.ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


def port_taken(output: str) -> bool:
    """Whether a failed launch's output says its rendezvous port was already in use (a race with another launch)."""
    return "EADDRINUSE" in output or "address already in use" in output.lower()


def torchrun(nproc: int, *target: str, timeout_s: float = 600) -> str:
    """Run target under torchrun with nproc processes (this project put before the PYTHONPATH it inherits, one
    thread per process unless OMP_NUM_THREADS says otherwise); its output, or raise with it."""
    env = os.environ | {"PYTHONPATH": worker_pythonpath(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    for _ in range(2):  # a port another launch took between torchrun's choosing it and binding it: try once more
        done = subprocess.run(torchrun_command(nproc, *target), cwd=paths.ROOT, env=env, capture_output=True,
                              text=True, timeout=timeout_s, check=False)
        if done.returncode == 0 or not port_taken(done.stdout + done.stderr):
            break
    if done.returncode != 0:
        raise RuntimeError(f"torchrun exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def launch(nproc: int, job: dict[str, Any], *, timeout_s: float = 600) -> str:
    """Run helpers.parallel_worker under `torchrun --nproc-per-node nproc` with job; its output, or raise with it."""
    with tempfile.TemporaryDirectory(prefix="nb13-") as tmp:
        job_file = Path(tmp) / "job.pkl"
        job_file.write_bytes(pickle.dumps(job))
        return torchrun(nproc, "-m", "helpers.parallel_worker", str(job_file), timeout_s=timeout_s)


def published_split_line(strategy: str, degree: int, split_s: float | None, single_s: float | None, hardware: str,
                         profile: str) -> str:
    """One line: this run's split step against its single-process step, beside xDiT's published image times for the
    same split on H100s (no published figure: the line says so). A CPU or smoke-profile ratio is no comparison."""
    mine = "—" if not split_s or not single_s else f"{single_s / split_s:.2f}x"
    status = "tiny model: no comparison" if profile != "full" else "no comparison: one image, not one step"
    one = published(XDIT_SOURCE, xdit_scenario("", 1))
    many = published(XDIT_SOURCE, xdit_scenario(strategy, degree))
    theirs = ("no published figure" if one is None or many is None else
              f"{one / many:.2f}x ({one:g} s -> {many:g} s per image on {degree}x H100 with torch.compile)")
    return (f"{strategy}-{degree} speedup over one process: this run ({hardware}, {profile} profile) {mine} "
            f"({status}); published: {theirs} ({XDIT_SOURCE})")


# --- what notebook 13 reads back from a run ---

def rows_of_run(results_dir: Path, hardware: str, notebook: str, run_id: str) -> pd.DataFrame:
    """The rows one notebook run wrote (its own and its torchrun workers', which share its run id)."""
    rows = results.read_rows(results_dir, hardware=hardware, notebook=notebook)
    return rows[rows["run_id"] == run_id].reset_index(drop=True) if not rows.empty else rows


def split_fields(measured: pd.DataFrame, strategy: str, degree: int) -> dict[str, Any]:
    """The fields of the ok row of a split step (its extra fields and latency_median_s); {} when there is none."""
    hit = measured[(measured["scenario"] == scenario(strategy, degree)) & (measured["status"] == "ok")]
    if len(hit) != 1:
        return {}
    r = hit.iloc[0]
    return dict(r["extra"]) | {"latency_median_s": r["latency_median_s"]}


def split_summary(fields: dict[str, Any], on_paper: int) -> dict[str, Any]:
    """One table row for a split step: parity, bytes counted and on paper, collective calls, step time."""
    latency = fields.get("latency_median_s")
    return {"rel. L2 vs single": fields.get("rel_error"), "sent per step (bytes)": fields.get("bytes_sent_per_step"),
            "on paper (bytes)": on_paper, "collective calls per step": sum(fields.get("calls_by_collective", {}).values()),
            "step (ms)": None if latency is None else latency * 1e3}


def record_scaling(writer: results.ResultWriter, table: pd.DataFrame, t1_s: float, t1_source: str,
                   g: Geometry, unsplit_s: float = 0.0, unsplit_source: str = "") -> None:
    """Record each prediction of a scaling_table as a row 'scaling model: <strategy>-<N> H100'."""
    for _, r in table.iterrows():
        n = int(r["GPUs"])
        writer.record(f"scaling model: {r['strategy']}-{n} H100", strategy=r["strategy"], degree=n,
                      predicted_step_s=r["predicted step (ms)"] / 1e3, t1_s=t1_s, t1_source=t1_source,
                      unsplit_s=unsplit_s, unsplit_source=unsplit_source,
                      sent_per_rank_per_step_bytes=analytic_bytes(r["strategy"], g, n)["total"],
                      bandwidth_bytes_per_s=NVLINK_H100_BYTES_PER_S)


def scaling_shown(table: pd.DataFrame, t1_s: float, unsplit_s: float = 0.0, steps: int = 28) -> pd.DataFrame:
    """A scaling_table for reading: the predicted image speedup (one GPU's image, unsplit_s + steps x t1, over the
    predicted one) beside xDiT's published one (its 1-GPU image time over its N-GPU one), in place of the
    predicted/published ratio."""
    xdit_1 = published(XDIT_SOURCE, xdit_scenario("", 1), required=True)
    shown = table.drop(columns="predicted / published")
    predicted = shown[f"predicted image (s): unsplit part + {steps} steps"]
    shown["predicted speedup (x)"] = (unsplit_s + steps * t1_s) / predicted
    shown["xDiT published speedup (x)"] = xdit_1 / pd.to_numeric(shown["xDiT published image (s)"])
    return shown
