"""Unit tests of helpers.attention: the naive attention is exact, installing it really replaces SDPA (a processor
that replaces nothing is caught), notebook 02's knobs are checked, and its published figures are read."""

import functools

import pytest
import torch
import torch.nn.functional as F

from helpers import attention, params, pipelines, precision, workloads

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
    if not torch.cuda.is_available():  # the CPU has no memory-efficient kernel: said without PyTorch's wrong guess
        why = attention.unavailable_reason("sdpa-efficient", CPU, torch.float32)
        assert why.startswith(f"torch {torch.__version__} has no sdpa-efficient kernel for cpu") and "likely" not in why


def test_unknown_implementation_is_refused():
    with pytest.raises(ValueError, match="allowed"), attention.implementation(torch.nn.Linear(2, 2), "fast"):
        pass


class _Bypass:
    """A planted broken 'naive' processor: it wraps the model's processor and replaces nothing."""

    def __init__(self, inner):
        self.inner = inner
        self.__call__ = functools.wraps(inner.__call__)(functools.partial(type(self).__call__, self))

    def __call__(self, *args, **kwargs):
        return self.inner(*args, **kwargs)


@pytest.fixture(scope="module")
def smoke_step():
    """A tiny Flux (random weights, fp32), its denoiser, one step at 64x64 and that step's attention calls."""
    pipe = pipelines.build_pipeline("flux-dev", "smoke", dtype=torch.float32, device=CPU, seed=0)
    net = pipelines.denoiser(pipe)
    step = workloads.denoiser_call(pipe, pipelines.denoiser_inputs(pipe, height=64, width=64, max_sequence_length=32))
    calls, _ = attention.record_calls(step)
    run = params.resolve("02_attention_sdpa", PROFILE="smoke", WEIGHTS="random", DTYPE="fp32")
    return net, step, calls, run


def test_measure_step_counts_the_calls_the_naive_processor_took(smoke_step):
    net, step, calls, run = smoke_step
    naive = attention.measure_step(step, net, "naive", calls, run)
    math = attention.measure_step(step, net, "sdpa-math", calls, run)
    assert naive.replaced_calls == len(calls) > 0 and math.replaced_calls == 0
    assert precision.drift(naive.out, math.out).rel_l2 < 1e-5
    assert naive.timing.median_s > 0 and naive.only_timing.median_s > 0
    # a processor that replaces nothing is caught: no call was taken from SDPA
    assert attention.measure_step(step, net, "naive", calls, run, naive=_Bypass).replaced_calls == 0


def test_a_processor_class_and_attention_function_of_ones_own_are_used(smoke_step):
    net, step, calls, run = smoke_step
    seen = []

    def counting(query, key, value, *args, **kwargs):  # diffusers passes them by name
        seen.append(query.shape)
        return attention.naive_attention(query, key, value, *args, **kwargs)

    class Counting(attention.NaiveAttnProcessor):
        def __call__(self, *args, **kwargs):
            with attention.sdpa_replaced(counting):
                return self.inner(*args, **kwargs)

    m = attention.measure_step(step, net, "naive", calls, run, naive=Counting, attend=counting)
    assert m.replaced_calls == len(calls)
    # every call of the timed and measured steps, then the attention-only calls, went through `counting`
    assert len(seen) >= len(calls) * (run.settings.warmup + run.settings.repeats + 1) + len(calls)
    assert not any(isinstance(p, Counting) for p in net.attn_processors.values()), "the model's processors are back"


def test_resolve_knobs_defaults_and_refusals():
    knobs = attention.resolve_knobs("smoke", None, None, None, None)
    assert knobs.implementations[0] == attention.REFERENCE and "naive" in knobs.implementations
    assert knobs.resolutions == [128, 256, 512] and knobs.batches == [1, 2, 4, 8]
    assert knobs.sdpa_dtypes == ["fp32", "fp16"]
    assert attention.resolve_knobs("full", ["naive", "sdpa-math"], [1024, 512], None, ["bf16"]) == attention.Knobs(
        ["sdpa-math", "naive"], [512, 1024], [1, 4, 16, 32], ["bf16"])
    for bad, match in (({"implementations": ["naive"]}, "must include 'sdpa-math'"),
                       ({"resolutions": [100]}, "divisible by 16"), ({"resolutions": []}, "RESOLUTIONS"),
                       ({"resolutions": [128, 128]}, "needs two different sizes"),
                       ({"batches": [0, 2]}, "BATCHES"), ({"sdpa_dtypes": ["fp8"]}, "SDPA_DTYPES")):
        given = {"implementations": None, "resolutions": None, "batches": None, "sdpa_dtypes": None} | bad
        with pytest.raises(params.ParameterError, match=match):
            attention.resolve_knobs("smoke", **given)


def test_largest_self_attention_skips_cross_attention():
    calls = [attention.AttentionCall((1, 2, 64, 8), (1, 2, 77, 8), (1, 2, 77, 8)),
             attention.AttentionCall((1, 2, 16, 8), (1, 2, 16, 8), (1, 2, 16, 8))]
    assert attention.largest_self_attention(calls) is calls[1]
