"""Timing statistics, memory and FLOP counting of helpers.measure."""

import time

import pytest
import torch

from helpers import environment, measure, precision

CPU = torch.device("cpu")


def test_time_callable_counts_warmup_and_repeats():
    calls = []
    t = measure.time_callable(lambda: calls.append(1), CPU, repeats=5, warmup=2)
    assert len(calls) == 7 and len(t.samples_s) == 5 and t.warmup == 2 and t.method == "perf_counter"


def test_timing_statistics_track_real_sleeps():
    t = measure.time_callable(lambda: time.sleep(0.02), CPU, repeats=3, warmup=0)
    assert 0.015 < t.median_s < 0.2 and t.min_s <= t.median_s and t.spread_s >= 0
    fixed = measure.Timing(samples_s=[3.0, 1.0, 2.0, 10.0, 4.0], warmup=0, method="x")
    assert fixed.median_s == 3.0 and fixed.spread_s == 9.0 and fixed.min_s == 1.0


def test_time_callable_rejects_bad_counts():
    with pytest.raises(ValueError, match="repeats"):
        measure.time_callable(lambda: None, CPU, repeats=0, warmup=0)


def test_peak_memory_sees_a_large_allocation():
    def allocate():
        x = torch.ones(64 * 2**20, dtype=torch.uint8)  # 64 MiB
        return int(x[-1])

    mem, out = measure.peak_memory(allocate, CPU)
    assert out == 1 and mem.kind == "cpu_allocated_during_call" and mem.kind in measure.MEMORY_KINDS
    assert set(measure.MEMORY_LABELS) == set(measure.MEMORY_KINDS) and "weights not included" in mem.kind_label
    assert 64 * 2**20 <= mem.peak_bytes - mem.baseline_bytes < 65 * 2**20


def test_cpu_peak_is_the_working_set_not_the_sum_of_allocations():
    weights = torch.ones(2**20)  # allocated before the call: not counted

    def two_in_turn():
        a = torch.ones(4 * 2**20, dtype=torch.uint8)
        del a
        b = torch.ones(4 * 2**20, dtype=torch.uint8)  # reuses the freed space: peak stays ~4 MiB
        return int(b[0]) + int(weights[0])

    mem, _ = measure.peak_memory(two_in_turn, CPU)
    assert 4 * 2**20 <= mem.peak_bytes < 5 * 2**20


def test_flop_count_of_a_matmul():
    a, b = torch.randn(64, 32), torch.randn(32, 16)
    assert measure.count_flops(lambda: a @ b) == 2 * 64 * 32 * 16


def test_flop_count_includes_attention_on_a_cpu():
    """Without the math backend the CPU's flash kernel counts 0 (no formula): QK^T and PV are 2 b h s^2 d each."""
    b, h, s, d = 2, 3, 40, 16
    q, k, v = (torch.randn(b, h, s, d) for _ in range(3))
    attention = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)
    with torch.utils.flop_counter.FlopCounterMode(display=False) as plain:
        attention()
    assert plain.get_total_flops() == 0  # what the count missed before
    assert measure.count_flops(attention) == 2 * (2 * b * h * s * s * d)


def test_check_fraction_of_peak_fails_above_the_peak_and_on_nothing_measured():
    assert measure.check_fraction_of_peak(0.42, peak_is_native=True) == ""
    assert measure.check_fraction_of_peak(1.05, peak_is_native=True) == ""  # inside the noise margin
    for planted in (1.3, 0.0, float("nan")):
        with pytest.raises(AssertionError):
            measure.check_fraction_of_peak(planted, peak_is_native=True)
    assert "fallback" in measure.check_fraction_of_peak(1.6, peak_is_native=False)


def test_fraction_of_peak():
    assert measure.fraction_of_peak(2e12, 2.0, 2.0) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        measure.fraction_of_peak(1.0, 0.0, 1.0)


def test_environment_card_on_cpu():
    card = environment.environment_card(CPU, torch.float32)
    assert card.hardware == "cpu" and card.peak_tflops > 0 and card.versions["torch"].startswith("2.13.0")
    assert card.device_memory_gib == 0.0 and "CPU threads" in card.peak_note
    assert dict(card.as_table())["version: diffusers"] == "0.42.1"


def test_hardware_slug(monkeypatch):
    for name, slug in [("NVIDIA H100 80GB HBM3", "h100-80gb"), ("NVIDIA H200", "h200"),
                       ("NVIDIA GeForce RTX 4090", "rtx-4090"), ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb")]:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_a, n=name: n)
        got = environment.hardware_slug(torch.device("cuda"))
        assert got == slug, (name, got)


def test_cpu_allocations_are_credited_to_the_op_that_asked_for_them():
    conv, x = torch.nn.Conv2d(8, 8, 3, padding=1), torch.randn(1, 8, 32, 32)
    with torch.inference_mode():
        by_op, out = measure.cpu_allocations_by_op(lambda: conv(x) * 2)
    assert out.shape == (1, 8, 32, 32)
    assert list(by_op.values()) == sorted(by_op.values(), reverse=True) and all(v > 0 for v in by_op.values())
    assert not set(by_op) & measure.ALLOCATOR_OPS, f"allocator ops are credited to their callers: {by_op}"
    # the product's fp32 output, net of the wrapped scalar 2 that mul frees before it returns
    assert by_op["aten::mul"] == pytest.approx(out.numel() * 4, abs=16), by_op
    assert any("conv" in op for op in by_op), by_op


def test_bf16_convolution_fallback_on_a_cpu_without_bf16_instructions():
    """Where oneDNN has no bf16 path, a bf16 convolution runs the im2col fallback, which allocates its buffers."""
    reason = precision.native_half_reason(CPU, "bf16")
    assert precision.native_half_reason(torch.device("cuda"), "bf16") == ""
    assert precision.native_half_reason(CPU, "fp32") == ""
    conv, x = torch.nn.Conv2d(8, 8, 3, padding=1).bfloat16(), torch.randn(1, 8, 32, 32, dtype=torch.bfloat16)
    with torch.inference_mode():
        by_op, _ = measure.cpu_allocations_by_op(lambda: conv(x))
    if reason:
        assert "slow_conv2d" in reason and next(iter(by_op)) == "aten::_slow_conv2d_forward", by_op
        assert by_op["aten::_slow_conv2d_forward"] >= 9 * x.numel() * 2, "3x3 im2col: 9 copies of the input"
    else:
        assert "aten::_slow_conv2d_forward" not in by_op, by_op


def test_cpu_matmul_peak_tries_several_sizes_and_names_them(monkeypatch):
    monkeypatch.setattr(environment, "CPU_SIZES", (64, 128))
    monkeypatch.setattr(environment, "CPU_BUDGET_S", 0.05)
    environment.measure_matmul_peak.cache_clear()
    peak = environment.measure_matmul_peak("cpu", torch.float32)
    environment.measure_matmul_peak.cache_clear()
    assert peak.tflops > 0 and peak.size in (64, 128)
    assert "64^3" in peak.note and "128^3" in peak.note and "CPU threads" in peak.note


def test_out_of_memory_returns_the_reason_and_lets_other_errors_through():
    assert measure.out_of_memory(lambda: 42) == (42, "")

    def oom():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore")
    assert measure.out_of_memory(oom) == (None, "CUDA out of memory. Tried to allocate 2.00 GiB")

    def other():
        raise RuntimeError("shape mismatch")
    with pytest.raises(RuntimeError, match="shape mismatch"):
        measure.out_of_memory(other)


def test_peak_text_picks_a_unit_that_shows_the_peak():
    assert measure.Memory(int(3.8 * 2**20), 0, "cpu_allocated_during_call").peak_text == "3.8 MiB"
    assert measure.Memory(int(22.5 * 2**30), 0, "cuda_max_allocated").peak_text == "22.50 GiB"


def test_told_apart_only_beyond_the_larger_spread():
    """The one rule compare_medians and attention_backends.pick_backend share: a gap within the larger max-min spread
    is noise (planted: 12.6 vs 13.5 with 2.0 of spread), beyond it a difference."""
    from helpers import measure

    assert not measure.told_apart(12.6, 13.5, 2.0, 0.1) and measure.told_apart(10.0, 13.5, 0.5, 0.5)
    assert not measure.told_apart(1.0, 1.5, 0.0, 0.5)  # a gap equal to the spread is not told apart
    def timing(*samples: float) -> measure.Timing:
        return measure.Timing(list(samples), 0, "wall")

    assert not timing(12.0, 14.0).told_apart(timing(12.6, 12.7)) and timing(10.0, 10.5).told_apart(timing(13.4, 13.6))


def test_human_seconds_picks_the_unit_that_reads():
    assert measure.human_seconds(2.134) == "2.13 s"
    assert measure.human_seconds(0.0124) == "12.4 ms"
    assert measure.human_seconds(0.000306) == "0.31 ms", "the smoke floor read '0.000306 s'"


def test_human_speedup_says_a_slowdown():
    assert measure.human_speedup(1.594) == "1.59x"
    assert measure.human_speedup(0.06) == "0.06x (16.7x slower)"
    assert measure.human_speedup(0.5) == "0.50x (2x slower)"
