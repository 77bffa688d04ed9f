"""Unit tests of helpers.attention: the naive attention is exact, and installing it really replaces SDPA."""

import pytest
import torch
import torch.nn.functional as F

from helpers import attention, pipelines, precision, workloads

CPU = torch.device("cpu")


@pytest.mark.parametrize("mask", [None, "bool", "additive"])
def test_naive_attention_equals_sdpa_math_in_fp64(mask):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 17, 8, generator=g, dtype=torch.float64) for _ in range(3))
    m = None
    if mask == "bool":
        m = torch.rand(2, 1, 17, 17, generator=g) > 0.3
        m[..., 0] = True  # every query keeps at least one key
    elif mask == "additive":
        m = torch.randn(2, 1, 17, 17, generator=g, dtype=torch.float64)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    assert torch.allclose(attention.naive_attention(q, k, v, attn_mask=m), ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("model", ["flux-dev", "sdxl"])
def test_naive_processor_is_in_effect_and_matches_sdpa(model):
    pipe = pipelines.build_pipeline(model, "smoke", dtype=torch.float32, device=CPU, seed=0)
    net = pipelines.denoiser(pipe)
    step = workloads.denoiser_call(pipe, pipelines.denoiser_inputs(pipe, height=64, width=64,
                                                                   max_sequence_length=32))
    calls, ref = attention.record_calls(step)
    before = attention.naive_calls()
    out = attention.with_implementation(step, net, "naive")()
    assert attention.naive_calls() - before == len(calls) > 0, "the naive processor did not replace every SDPA call"
    assert precision.drift(workloads.first_output(out), workloads.first_output(ref)).rel_l2 < 1e-5
    # the model's own processors are back afterwards: no naive call on a plain step, nor under "sdpa" (the default)
    before = attention.naive_calls()
    step()
    sdpa = attention.with_implementation(step, net, "sdpa")()
    assert attention.naive_calls() == before
    assert precision.drift(workloads.first_output(sdpa), workloads.first_output(ref)).rel_l2 == 0
    assert attention.unavailable_reason("sdpa", CPU, torch.float32) == ""


def test_unknown_implementation_is_refused():
    with pytest.raises(ValueError, match="allowed"), attention.implementation(torch.nn.Linear(2, 2), "fast"):
        pass
