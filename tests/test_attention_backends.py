"""helpers.attention_backends: skip reasons, dispatch and kernel evidence; planted silent fallbacks caught."""

import importlib.util

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from diffusers import FluxTransformer2DModel
from diffusers.models import attention_dispatch as dispatch
from diffusers.models.transformers import transformer_flux

from helpers import attention_backends, pipelines

CPU, FP32 = torch.device("cpu"), torch.float32


@pytest.fixture(scope="module")
def step():
    """One forward of the smoke Flux transformer on fixed random inputs, and the model."""
    net = pipelines.random_components("flux-dev", "smoke", dtype=FP32, seed=0)["transformer"]
    assert isinstance(net, FluxTransformer2DModel)
    gen = torch.Generator().manual_seed(0)
    c = net.config
    inputs = {"hidden_states": torch.randn(1, 64, c.in_channels, generator=gen),
              "encoder_hidden_states": torch.randn(1, 8, c.joint_attention_dim, generator=gen),
              "pooled_projections": torch.randn(1, c.pooled_projection_dim, generator=gen),
              "timestep": torch.tensor([0.5]), "guidance": torch.tensor([3.5]),
              "img_ids": torch.zeros(64, 3), "txt_ids": torch.zeros(8, 3), "return_dict": False}

    @torch.inference_mode()
    def call():
        return net(**inputs)[0]
    yield net, call
    net.reset_attention_backend()
    dispatch._AttentionBackendRegistry.set_active_backend(dispatch.AttentionBackendName.NATIVE)


def evidence(net, call, backend):
    net.set_attention_backend(backend)
    with attention_backends.dispatch_counter(backend) as calls:
        kernels, out = attention_backends.kernels_seen(call)
    return kernels, calls["calls"], out


def test_every_named_backend_is_listed():
    assert len(attention_backends.BACKENDS) == len(dispatch.AttentionBackendName) >= 27
    assert {"native", "_native_cudnn", "_native_flash", "flex", "sage", "_flash_3", "_flash_3_hub"} <= set(
        attention_backends.BACKENDS)


def test_skip_reasons_name_the_cause():
    assert attention_backends.skip_reason("native", CPU, FP32, 16) == ""
    cudnn = attention_backends.skip_reason("_native_cudnn", CPU, FP32, 16)
    assert "bfloat16 or float16" in cudnn and "No viable backend" in cudnn  # diffusers' check and torch's failure
    assert cudnn.startswith("diffusers'") and "needs CUDA" in cudnn
    assert attention_backends.skip_reason("_native_efficient", CPU, FP32, 16).startswith("needs CUDA")
    hub = attention_backends.skip_reason("_flash_3_hub", CPU, FP32, 16)
    assert "kernels-community/flash-attn3" in hub and "network" in hub
    if importlib.util.find_spec("sageattention") is None:
        assert "sageattention" in attention_backends.skip_reason("sage", CPU, FP32, 16)
    assert attention_backends.contract_breaches("native", CPU, FP32, 16) == []
    assert attention_backends.contract_breaches("_native_flash", CPU, FP32, 16), "flash declares bf16/fp16 only"


def test_the_kernel_each_backend_names_is_the_one_that_ran(step):
    net, call = step
    for backend, kernel in (("_native_math", "aten::_scaled_dot_product_attention_math"),
                            ("native", "aten::_scaled_dot_product_flash_attention_for_cpu")):
        kernels, dispatched, _ = evidence(net, call, backend)
        blocks = sum(pipelines.flux_depth("smoke"))
        assert dispatched == blocks and kernels.get(kernel) == blocks, (backend, kernels)
        assert attention_backends.fallback_problem(backend, kernels, dispatched) == ""


def test_a_silent_fallback_is_caught_by_the_kernel_not_by_parity(step, monkeypatch):
    """Planted: '_native_flash' registered to run the math kernel; the output matches flash, the kernel does not."""
    net, call = step
    _, _, flash_out = evidence(net, call, "_native_flash")
    registry = dispatch._AttentionBackendRegistry._backends
    monkeypatch.setitem(registry, dispatch.AttentionBackendName._NATIVE_FLASH,
                        registry[dispatch.AttentionBackendName._NATIVE_MATH])
    kernels, dispatched, out = evidence(net, call, "_native_flash")
    assert torch.allclose(out, flash_out, atol=1e-5), "parity passes: the fallback computes the same attention"
    problem = attention_backends.fallback_problem("_native_flash", kernels, dispatched)
    assert dispatched > 0 and "_scaled_dot_product_flash_attention" in problem and "math" in problem


def test_processors_that_bypass_the_dispatcher_are_caught(step, monkeypatch):
    """Planted: Flux's processor calling torch SDPA itself, so the chosen backend is never reached."""
    net, call = step

    def sdpa_directly(query, key, value, attn_mask=None, backend=None, parallel_config=None, **kwargs):
        q, k, v = (t.transpose(1, 2) for t in (query, key, value))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask).transpose(1, 2)

    monkeypatch.setattr(transformer_flux, "dispatch_attention_fn", sdpa_directly)
    kernels, dispatched, _ = evidence(net, call, "_native_math")
    assert dispatched == 0 and "no call reached" in attention_backends.fallback_problem("_native_math", kernels, 0)


def test_a_package_backend_that_runs_torch_sdpa_is_a_fallback():
    seen = {"aten::_scaled_dot_product_flash_attention_for_cpu": 6}
    assert "instead of the backend's kernel" in attention_backends.fallback_problem("sage", seen, 6)
    assert attention_backends.fallback_problem("sage", {}, 6) == ""
    assert "expected a kernel" in attention_backends.fallback_problem("flex", seen, 6)


def test_the_fastest_backend_is_adopted_only_beyond_the_noise():
    """14's waterfall adopts the fastest backend only when its median beats native's by more than the larger max-min
    spread and it runs another kernel (planted: _native_math 12.6 ms against native 13.5 ms with 2 ms of spread, as
    a smoke run read it, is noise)."""
    def table(math_ms, spread_ms, math_kernels=("aten::_scaled_dot_product_attention_math",)):
        return pd.DataFrame({"step (ms)": {"native": 13.5, "_native_math": math_ms},
                             "spread (ms)": {"native": spread_ms, "_native_math": spread_ms},
                             "kernels": {"native": ["aten::_scaled_dot_product_flash_attention_for_cpu"],
                                         "_native_math": list(math_kernels)}})
    fastest, why_not = attention_backends.pick_backend(table(12.6, 2.0))
    assert fastest == "_native_math" and "not told apart" in why_not and "within the larger" in why_not
    assert attention_backends.pick_backend(table(10.0, 0.5)) == ("_native_math", "")
    same = table(10.0, 0.5, ["aten::_scaled_dot_product_flash_attention_for_cpu"])
    assert "runs the kernel native SDPA already runs" in attention_backends.pick_backend(same)[1]
    assert attention_backends.pick_backend(table(14.0, 0.1)) == (
        "native", "native SDPA is the fastest measured: nothing to switch")
    assert attention_backends.pick_backend(table(14.0, 0.1).iloc[0:0]) == ("native", "no backend ran")
