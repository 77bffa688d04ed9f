"""Which attention kernel ran under diffusers' attention dispatcher (`set_attention_backend`, `attention_backend`).

For each backend diffusers names: why it cannot run here (package missing, a Hub download, diffusers' own checks
on device, dtype and head size, or PyTorch having no such kernel), or, when it runs, two pieces of evidence that
it is what ran: the calls that reached the backend's own function in diffusers' registry, and the attention kernels
the profiler saw. Parity with the default backend cannot show a silent fallback (a fallback to another exact
kernel gives the same numbers); the kernel names can.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pandas as pd
import torch
from diffusers.models import attention_dispatch as dispatch
from torch.profiler import ProfilerActivity
from tqdm.auto import tqdm

from helpers import _DropNotice, measure, text

# set_attention_backend and reset_attention_backend log this notice on every call; a sweep calls them per backend.
logging.getLogger("diffusers.models.modeling_utils").addFilter(
    _DropNotice("Attention backends are an experimental feature"))

BACKENDS: tuple[str, ...] = tuple(b.value for b in dispatch.AttentionBackendName)
# PyTorch's SDPA kernels as the profiler names them (aten level, on every device).
SDPA_KERNELS: tuple[str, ...] = ("aten::_scaled_dot_product_flash_attention",
                                 "aten::_scaled_dot_product_flash_attention_for_cpu",
                                 "aten::_scaled_dot_product_efficient_attention",
                                 "aten::_scaled_dot_product_cudnn_attention",
                                 "aten::_scaled_dot_product_attention_math")
# The kernel each backend that runs through PyTorch must run (a regex on the profiler's names); 'native' lets SDPA
# choose among SDPA_KERNELS, and the packages' backends (flash-attn, sage, xformers, Hub kernels) must run none.
EXPECTED_KERNEL: dict[str, str] = {"_native_flash": r"_scaled_dot_product_flash_attention",
                                   "_native_efficient": r"_scaled_dot_product_efficient_attention",
                                   "_native_cudnn": r"_scaled_dot_product_cudnn_attention",
                                   "_native_math": r"_scaled_dot_product_attention_math",
                                   "flex": r"(?i)flex_?attention",
                                   "native": "|".join(re.escape(k) for k in SDPA_KERNELS)}
# PyTorch SDPA kernels that exist only on CUDA devices (their backend fails elsewhere with torch's generic message).
CUDA_ONLY: dict[str, str] = {"_native_cudnn": "cuDNN attention", "_native_efficient": "memory-efficient attention"}
_ATTENTION_EVENT = re.compile(r"(?i)(scaled_dot_product|flex_?attention|flash_attn|sage|xformers|fmha)")


def hub_repo(backend: str) -> str:
    """The Hugging Face Hub repository a '*_hub' backend downloads its kernel from ('' for other backends)."""
    config = dispatch._HUB_KERNELS_REGISTRY.get(dispatch.AttentionBackendName(backend))
    return config.repo_id if config else ""


def skip_reason(backend: str, device: torch.device, dtype: torch.dtype, head_dim: int) -> str:
    """Why backend cannot run attention here ('' when it can): a package that is missing, a kernel it would download,
    or a trial call that fails (with what diffusers' own checks refuse here), joined by '; '."""
    name = dispatch.AttentionBackendName(backend)
    try:
        dispatch._check_attention_backend_requirements(name)
        missing = ""
    except RuntimeError as err:
        missing = str(err).strip().splitlines()[0].rstrip(".")
    if hub_repo(backend):
        return (f"downloads its kernel ({hub_repo(backend)}) from the Hugging Face Hub at run time: needs network, "
                f"which the notebooks never use at run time (the project's GPU machines have none), and the `kernels` package"
                f"{' (not installed)' if missing else ''}")
    if missing:
        return missing
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # flex without compile warns; the trial is only whether it runs
            probe = _probe(device, dtype, head_dim)
            dispatch.dispatch_attention_fn(probe, probe, probe, backend=name)
    except Exception as err:  # noqa: BLE001 any failure of the trial call is the reason recorded
        trial = (f"torch {torch.__version__} on {device.type} {str(dtype).removeprefix('torch.')}: "
                 f"{text.first_line(err)}")
        if backend in CUDA_ONLY and device.type != "cuda":
            trial = f"needs CUDA: PyTorch's {CUDA_ONLY[backend]} kernel exists only on CUDA GPUs ({trial})"
        return "; ".join([*contract_breaches(backend, device, dtype, head_dim), trial])
    return ""


def _probe(device: torch.device, dtype: torch.dtype, head_dim: int) -> torch.Tensor:
    """A small query/key/value in diffusers' layout (batch, tokens, heads, head_dim)."""
    return torch.zeros(1, 128, 2, head_dim, device=device, dtype=dtype)


def contract_breaches(backend: str, device: torch.device, dtype: torch.dtype, head_dim: int) -> list[str]:
    """What diffusers' own checks of a backend refuse here (device, dtype, head size); they run only when the
    environment sets DIFFUSERS_ATTN_CHECKS, so a backend can run outside what it declares."""
    name = dispatch.AttentionBackendName(backend)
    probe = _probe(device, dtype, head_dim)
    breaches = []
    for check in dispatch._AttentionBackendRegistry._constraints[name]:
        try:
            check(query=probe, key=probe, value=probe, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                  enable_gqa=False, _parallel_config=None)
        except (ValueError, RuntimeError) as err:
            breaches.append(f"diffusers' {check.__name__}: {str(err).strip()}")
    return breaches


@contextlib.contextmanager
def dispatch_counter(backend: str) -> Iterator[Counter]:
    """Inside the block, count the calls that reach backend's function in diffusers' registry (counter['calls'])."""
    name = dispatch.AttentionBackendName(backend)
    registry = dispatch._AttentionBackendRegistry._backends
    original = registry[name]
    counter: Counter = Counter()

    @functools.wraps(original)
    def counting(*args: Any, **kwargs: Any) -> Any:
        counter["calls"] += 1
        return original(*args, **kwargs)

    registry[name] = counting
    try:
        yield counter
    finally:
        registry[name] = original


def kernels_seen(fn: Callable[[], Any]) -> tuple[dict[str, int], Any]:
    """Run fn once under the profiler; attention kernels it ran (profiler name -> calls), and fn's result."""
    with measure.quiet_profile(activities=[ProfilerActivity.CPU]) as prof:
        out = fn()
    seen = Counter(e.name for e in prof.events() if _ATTENTION_EVENT.search(e.name)
                   and e.name != "aten::scaled_dot_product_attention")  # the dispatcher entry, not a kernel
    return dict(sorted(seen.items())), out


def fallback_problem(backend: str, kernels: dict[str, int], dispatched: int) -> str:
    """'' when backend's own function was called and ran the kernel it names; else the silent fallback found."""
    if dispatched == 0:
        return f"{backend}: no call reached the backend's function (the attention processors did not use it)"
    sdpa = sorted(k for k in kernels if k in SDPA_KERNELS)
    expected = EXPECTED_KERNEL.get(backend)
    if expected is None:
        return f"{backend}: PyTorch's SDPA ran ({', '.join(sdpa)}) instead of the backend's kernel" if sdpa else ""
    if not any(re.search(expected, k) for k in kernels):
        return f"{backend}: expected a kernel matching {expected!r}, ran {', '.join(kernels) or 'no attention kernel'}"
    other = [k for k in sdpa if not re.search(expected, k)]
    return f"{backend}: also ran {', '.join(other)}" if other else ""


def active_backend() -> str:
    """The backend diffusers' dispatcher runs for every attention layer that was given none of its own (the process
    default: 'native' unless the environment sets DIFFUSERS_ATTN_BACKEND, or a call of set_attention_backend)."""
    return dispatch._AttentionBackendRegistry.get_active_backend()[0].value


def default_backend() -> str:
    """The process default diffusers starts with (DIFFUSERS_ATTN_BACKEND, else 'native')."""
    return dispatch.AttentionBackendName(dispatch.DIFFUSERS_ATTN_BACKEND).value


def set_model_backend(model: torch.nn.Module, backend: str) -> None:
    """model.set_attention_backend(backend) for model's own attention layers only: diffusers' call also makes backend
    the process-wide default, so every model built later would run it; the `attention_backend` block puts the
    default back when it exits."""
    with dispatch.attention_backend(active_backend()):
        model.set_attention_backend(backend)


def default_problem() -> str:
    """'' when the process-wide attention backend is the default one, else what leaked into it."""
    active, default = active_backend(), default_backend()
    return "" if active == default else (f"the process-wide attention backend is {active!r}, not the default "
                                         f"{default!r}: every model without a backend of its own now runs it")


def reason_kind(backend: str, reason: str) -> str:
    """A skip reason without what names its one backend (the name, the Hub repository, the SDPA kernel, the trial
    call's details), so that backends skipped for the same reason fall together."""
    kind = reason.replace(f" '{backend}'", "")
    kind = re.sub(r" \([\w.-]+/[\w.-]+\)", "", kind)  # a Hub repository: '(kernels-community/flash-attn2)'
    kind = re.sub(r"PyTorch's [\w -]+? kernel", "PyTorch's kernel", kind)
    return re.sub(r" \(torch \S+ on .*\)$", "", kind)  # the trial call's version, device and message


def reason_groups(reasons: dict[str, str]) -> pd.DataFrame:
    """One line per kind of skip reason (reason_kind): how many backends it holds, and which, most first."""
    groups: dict[str, list[str]] = {}
    for backend, reason in reasons.items():
        groups.setdefault(reason_kind(backend, reason), []).append(backend)
    lines = sorted(groups.items(), key=lambda kv: -len(kv[1]))
    return pd.DataFrame({"backends (count)": [len(b) for _, b in lines], "backends": [", ".join(b) for _, b in lines]},
                        index=pd.Index([kind for kind, _ in lines], name="why skipped"))


def sweep(step: Callable[[], Any], model: torch.nn.Module, backends: Sequence[str], device: torch.device,
          dtype: torch.dtype, *, repeats: int, warmup: int, writer: Any) -> dict[str, dict[str, Any]]:
    """Run one denoiser step (step, calling model) under each backend, recording a row 'attention <backend>' through
    writer: skipped with every reason found (skip_reason), or timed, with its distance to the 'native' output, the
    calls that reached its function, the kernels the profiler saw, a silent fallback, and what diffusers' own checks
    would refuse. The model's choice is reset after, and the process default is 'native' inside and as before after."""
    from helpers import compile_tools, workloads

    head_dim = model.config.attention_head_dim
    found: dict[str, dict[str, Any]] = {}
    with dispatch.attention_backend("native"):  # restores the process default when the sweep is done
        native_out = workloads.first_output(step())
        for backend in tqdm(backends, desc="attention backends"):
            why = skip_reason(backend, device, dtype, head_dim)
            if why:
                writer.record(f"attention {backend}", status="skipped", reason=why, backend=backend)
                found[backend] = {"status": "skipped", "reason": why}
                continue
            model.set_attention_backend(backend)
            with dispatch_counter(backend) as dispatched:
                kernels, out = kernels_seen(step)
            timing = measure.time_callable(step, device, repeats=repeats, warmup=warmup)
            line = {"distance": compile_tools.relative_error(workloads.first_output(out), native_out),
                    "dispatched": dispatched["calls"], "kernels": kernels,
                    "fallback": fallback_problem(backend, kernels, dispatched["calls"]),
                    "outside_contract": contract_breaches(backend, device, dtype, head_dim)}
            writer.record(f"attention {backend}", timing=timing, timed="one denoiser step", backend=backend, **line)
            found[backend] = {"status": "ok", "step (ms)": timing.median_s * 1e3, "spread (ms)": timing.spread_s * 1e3,
                              **line}
        model.reset_attention_backend()
    return found


# sweep's keys as notebook 14's tables head them.
SHOWN_AS: dict[str, str] = {
    "distance": "distance to native's output (rel. L2)", "dispatched": "attention calls", "fallback": "silent fallback",
    "kernels": "kernels the profiler saw: calls", "outside_contract": "diffusers' checks would refuse",
}


def shown(table: pd.DataFrame) -> pd.DataFrame:
    """sweep's rows for display: columns in words (SHOWN_AS), a kernel count or a list as text, nothing as 'none'."""
    return table.map(lambda v: text.words(v) if isinstance(v, dict | list) else "none" if v == "" else v).rename(
        columns=SHOWN_AS)


def pick_backend(ran: pd.DataFrame) -> tuple[str, str]:
    """The fastest backend that ran (rows: sweep's 'ok' entries) and '' to adopt it, or why not: it runs native's
    kernels, or its median is not beyond the larger max-min spread of it and native (noise, not a faster kernel)."""
    if not len(ran):
        return "native", "no backend ran"
    fastest = str(ran["step (ms)"].idxmin())
    if fastest == "native" or "native" not in ran.index:
        return fastest, "" if fastest != "native" else "native SDPA is the fastest measured: nothing to switch"
    f, n = ran.loc[fastest], ran.loc["native"]
    if set(f["kernels"]) == set(n["kernels"]):
        return fastest, (f"the fastest backend measured, {fastest}, runs the kernel native SDPA already runs here "
                         f"({', '.join(f['kernels'])})")
    if not measure.told_apart(f["step (ms)"], n["step (ms)"], f["spread (ms)"], n["spread (ms)"]):
        gap, spread = n["step (ms)"] - f["step (ms)"], max(f["spread (ms)"], n["spread (ms)"])
        return fastest, (f"the fastest backend measured, {fastest} ({f['step (ms)']:.1f} ms a step), is not told apart "
                         f"from native ({n['step (ms)']:.1f} ms): the gap of {gap:.1f} ms is within the larger max-min "
                         f"spread ({spread:.1f} ms)")
    return fastest, ""
