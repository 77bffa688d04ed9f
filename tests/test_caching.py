"""helpers.caching: block and attention computations counted under diffusers' step caches; planted failures caught."""

import pytest
import torch
from diffusers import FirstBlockCacheConfig, FluxPipeline, TaylorSeerCacheConfig
from diffusers.hooks.first_block_cache import FBCHeadBlockHook

from helpers import caching, pipelines

STEPS = 4


@pytest.fixture(scope="module")
def pipe():
    p = FluxPipeline(**pipelines.random_components("flux-dev", "smoke", dtype=torch.float32, seed=0))
    p.set_progress_bar_config(disable=True)
    return p


def latents(pipe):
    """One image's final latents (no VAE), same prompt and seed every call."""
    return pipe(prompt="a handwritten digit seven", height=128, width=128, num_inference_steps=STEPS,
                max_sequence_length=32, generator=torch.Generator("cpu").manual_seed(0), output_type="latent").images


def cached_run(pipe, config, unit="block"):
    pipe.transformer.enable_cache(config)
    try:
        with caching.count_computations(pipe.transformer, unit) as counts:
            out = latents(pipe)
    finally:
        pipe.transformer.disable_cache()
    return counts, out


def test_blocks_are_found_in_fluxs_order(pipe):
    blocks = caching.counted_modules(pipe.transformer, "block")
    double, single = pipelines.flux_depth("smoke")
    assert list(blocks)[:2] == ["transformer_blocks.0", "transformer_blocks.1"] and len(blocks) == double + single
    assert len(caching.counted_modules(pipe.transformer, "attention")) == double + single
    with pytest.raises(ValueError, match="unit="):
        caching.counted_modules(pipe.transformer, "layer")
    with pytest.raises(ValueError, match="no block modules"), caching.count_computations(torch.nn.Linear(2, 2)):
        pass


def test_threshold_zero_skips_nothing_and_changes_nothing(pipe):
    reference = latents(pipe)
    counts, out = cached_run(pipe, FirstBlockCacheConfig(threshold=0.0))
    blocks = len(caching.counted_modules(pipe.transformer, "block"))
    assert counts.calls == blocks * STEPS and counts.skipped == 0 and counts.pattern() == "C" * STEPS
    assert torch.equal(out, reference)
    assert caching.skip_problem(0.0, counts, off=True) == ""
    assert "never took effect" in caching.skip_problem(0.0, counts, off=False)  # as a strongest setting: no skip


def test_a_huge_threshold_skips_every_block_but_the_first_after_step_one(pipe):
    counts, _ = cached_run(pipe, FirstBlockCacheConfig(threshold=1e9))
    blocks = len(caching.counted_modules(pipe.transformer, "block"))
    assert counts.skipped == (blocks - 1) * (STEPS - 1), "counted: all but the head block, at every step but the first"
    assert counts.pattern("transformer_blocks.0") == "C" * STEPS and counts.pattern() == "C" + "s" * (STEPS - 1)
    assert counts.skipped_share == pytest.approx((blocks - 1) * (STEPS - 1) / (blocks * STEPS))
    assert caching.skip_problem(1e9, counts, off=False) == ""
    # planted: the same counts at an 'off' setting are a cache that skips when it must not
    assert "expected 0" in caching.skip_problem(0.0, counts, off=True)


def test_a_cache_that_never_skips_fails_the_check(pipe, monkeypatch):
    """Planted: First Block Cache whose decision always says 'compute' skips nothing even at a huge threshold."""
    monkeypatch.setattr(FBCHeadBlockHook, "_should_compute_remaining_blocks", lambda self, residual: True)
    counts, _ = cached_run(pipe, FirstBlockCacheConfig(threshold=1e9))
    assert counts.calls > 0 and counts.skipped == 0
    assert "never took effect" in caching.skip_problem(1e9, counts, off=False)


def test_attention_caches_are_counted_per_attention_layer(pipe):
    config = TaylorSeerCacheConfig(cache_interval=2, disable_cache_before_step=1, taylor_factors_dtype=torch.float32)
    pipe.transformer.enable_cache(config)
    try:
        with caching.count_computations(pipe.transformer, "block") as blocks, \
                caching.count_computations(pipe.transformer, "attention") as attention:
            latents(pipe)
    finally:
        pipe.transformer.disable_cache()
    assert blocks.skipped == 0, "TaylorSeer predicts attention layers; every block still runs"
    assert attention.skipped > 0 and attention.calls == blocks.calls
    assert set(attention.pattern()) == {"C", "s"}


def test_hooks_are_removed_and_nothing_counted_is_a_problem(pipe):
    with caching.count_computations(pipe.transformer) as counts:
        pass
    assert counts.calls == 0 and "nothing was counted" in caching.skip_problem(0.3, counts, off=False)
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in pipe.transformer.modules())
