"""Notebook 14 on the smoke profile: step caches counted, caching with compile, every attention backend, fewer steps."""

import pytest

from helpers import attention_backends, caching, compile_tools, params, pipelines
from tests.nbrun import run_notebook, run_setup

pytestmark = pytest.mark.notebook

NB = "14_caching_attention_steps"
BLOCKS = sum(pipelines.flux_depth("smoke"))


def test_caching_attention_steps(tmp_path):
    nb = run_notebook(NB, tmp_path, THRESHOLDS=[0.0, 0.5], REPEATS=1)  # make test: two thresholds, one timed call
    rows = nb.rows
    assert set(rows["profile"]) == {"smoke"} and set(rows["model"]) == {"flux-dev"}
    assert "128x128, 8 steps," in nb.text(), "the card's workload is the cached images' CACHE_STEPS, not the profile's 2"
    tolerance = compile_tools.PARITY_TOLERANCE[rows["dtype"].iloc[0]]

    # 2. every cache ran; counts are counted per block and step, nothing skipped at threshold 0, something at the top
    sweep = rows[rows["scenario"].str.startswith("cache ") & (rows["scenario"] != "cache none")]
    assert set(sweep["status"]) == {"ok"}
    assert {e["cache"] for e in sweep["extra"]} == {"first-block", "mag", "taylorseer", "pyramid", "faster"}
    off = nb.row("cache first-block 0")["extra"]
    assert off["skipped"] == 0 and off["calls"] == BLOCKS * 8 and off["distance"] <= tolerance
    for cache in ("first-block", "mag", "taylorseer", "pyramid", "faster"):
        strongest = [e for e in sweep["extra"] if e["cache"] == cache][-1]
        assert strongest["skipped"] > 0 and 0 < strongest["skipped_share"] < 1, (cache, strongest)
    for e in sweep["extra"]:
        assert e["computed"] + e["skipped"] == e["calls"] and len(e["pattern"]) == 8

    # 3. compile and the cache: regional breaks graphs, blocks compiled first do not; no recompile either way
    refusals = nb.row("compile fullgraph + cache")["extra"]["refusals"]
    assert set(refusals) == {"whole model", "each block"} and all("disable" in r for r in refusals.values())
    regional, inner = nb.row("compile regional + cache"), nb.row("compile blocks then cache")
    assert regional["graph_breaks"] > 0 and regional["recompiles"] == 0
    assert inner["graph_breaks"] == 0 and inner["recompiles"] == 0

    # 4. one row per attention backend diffusers names: measured with kernel evidence, or skipped with a reason
    att = rows[rows["scenario"].str.startswith("attention ")]
    assert sorted(att["scenario"]) == sorted(f"attention {b}" for b in attention_backends.BACKENDS)
    ok, skipped = att[att["status"] == "ok"], att[att["status"] == "skipped"]
    assert {"attention native", "attention _native_math"} <= set(ok["scenario"])
    assert skipped["reason"].str.len().min() > 20
    assert all(e["dispatched"] > 0 and e["kernels"] and not e["fallback"] for e in ok["extra"])
    assert "network" in nb.row("attention _flash_3_hub")["reason"]
    assert "needs CUDA" in nb.row("attention _native_cudnn")["reason"]  # skipped: no CUDA here

    # 5. fewer steps: every block called once per step, counted
    for steps in (8, 4, 2, 1):
        assert nb.row(f"steps {steps}")["extra"]["block_calls"] == BLOCKS * steps

    # 6. the waterfall: fp8 skipped on a CPU with torchao's reason, no stage recompiles after its first image
    assert "compute capability ≥8.9" in nb.row("waterfall: + fp8")["reason"]
    assert "torchao refuses" in nb.row("waterfall: + fp8")["reason"]
    stages = rows[rows["scenario"].str.startswith("waterfall: ") & (rows["status"] == "ok")
                  & (rows["scenario"] != "waterfall: cache on and off in turn")]  # that row times the last stage again
    assert {"waterfall: eager", "waterfall: + compile", "waterfall: + fused qkv", "waterfall: + cache"} <= set(
        stages["scenario"])
    assert (stages["recompiles"] == 0).all() and "skipped" in nb.row("waterfall: + cache")["extra"]
    assert 0 < nb.row("waterfall: + cache")["extra"]["skipped_timed_share"] < 1, "the timed image skips blocks too"

    # 2. MagCache: counted skips within the caps diffusers applies
    for e in sweep["extra"]:
        if e["cache"] == "mag":
            assert e["pattern"].count("s") <= 5, e  # 8 steps, retention_ratio 0.2, max_skip_steps 3: at most 5

    claims = nb.checks()
    assert all(c["holds"] for c in claims.values()) and nb.row("checks")["status"] == "ok"
    assert {"first-block at threshold 0 skips no block", "first-block at threshold 0 reproduces the uncached images",
            "compile(fullgraph=True) refuses the cached transformer at the cache's decision, whole or per block",
            "blocks compiled before enable_cache: no graph break",
            "each backend that ran used its own kernel (no silent fallback)",
            "each image ran every block once per step (calls counted)",
            "mag never skips more steps than its caps allow (steps skipped)",
            "after the waterfall, the process-wide attention backend is the default"} <= set(claims)
    if params.trained_smoke_folder("flux-dev").joinpath("model_index.json").is_file():  # WEIGHTS="auto" loads it
        assert claims["the uncached images are read as the prompted digits (share of 0-9)"]["holds"]
        assert "recognized" in off and "ssim" in off
        # every image shown is judged and reads as its prompt's digit (grids: each row at least its floor)
        shown = rows[rows["scenario"].str.startswith("shown: ")]
        assert len(shown) >= 5 and all(e["judged"] for e in shown["extra"]), list(shown["scenario"])
        assert claims["every image shown reads as its prompt's digit (a grid row: at least its floor)"]["holds"]
    for name in ("cache_skipped", "steps_latency", "cache_sweep_images", "steps_images"):
        assert (nb.figures_dir / "cpu" / f"{NB}_{name}.png").stat().st_size > 1000
    assert "not measured" in nb.text()


@pytest.mark.parametrize("knob, value, message", [
    ("CACHES", ["teacache"], "CACHES contains"),
    ("THRESHOLDS", [-0.1], "THRESHOLDS="),
    ("INTERVALS", [0], "INTERVALS="),
    ("BACKENDS", ["flash_9"], "BACKENDS contains"),
    ("COMPILER", "tensorrt", "COMPILER="),
    ("STACK_THRESHOLD", -1, "STACK_THRESHOLD="),
    ("MODEL", "sdxl", "MODEL="),
])
def test_bad_knobs_fail_fast(tmp_path, knob, value, message):
    with pytest.raises(params.ParameterError, match=message):
        run_setup(NB, tmp_path, **{knob: value})
    assert not (tmp_path / "results").exists(), "nothing may be written before the parameters are checked"


def test_mag_skip_cap_replays_diffusers_rule():
    from diffusers import MagCacheConfig
    from diffusers.hooks.mag_cache import FLUX_MAG_RATIOS

    def cap(steps, **kw):
        return caching.mag_skip_cap(MagCacheConfig(threshold=0.5, num_inference_steps=steps,
                                                   mag_ratios=FLUX_MAG_RATIOS, **kw))

    assert cap(8) == 5  # steps 0-1 kept (0.2 x 8 rounds to 2), then s s s C s s
    assert cap(8, max_skip_steps=1) == 3 and cap(8, retention_ratio=1.0) == 0
    assert cap(28) == 17  # 6 kept, then 22 steps as sss C: 5 x 3 + 2


def test_a_planted_overskip_breaks_the_mag_claim():
    from diffusers import MagCacheConfig
    from diffusers.hooks.mag_cache import FLUX_MAG_RATIOS

    config = MagCacheConfig(threshold=0.5, num_inference_steps=8, mag_ratios=FLUX_MAG_RATIOS)
    counts = caching.Counts("block", {"transformer_blocks.0": [True] * 8, "single_transformer_blocks.0":
                                      [True, True, False, False, False, True, False, False]})
    assert caching.skipped_steps(counts) == 5 <= caching.mag_skip_cap(config)  # what diffusers does: holds
    counts.history["single_transformer_blocks.0"][5] = False  # planted: six skipped, four of them in a row
    assert not caching.skipped_steps(counts) <= caching.mag_skip_cap(config)  # the claim's test fails


def test_skip_reasons_fall_into_one_line_per_kind():
    reasons = {"flash": "Flash Attention backend 'flash' is not usable because of missing package. Please install x",
               "flash_varlen": "Flash Attention backend 'flash_varlen' is not usable because of missing package. "
                               "Please install x",
               "flash_hub": "downloads its kernel (kernels-community/flash-attn2) from the Hub",
               "sage_hub": "downloads its kernel (SageAttention/sage-attention) from the Hub",
               "_native_cudnn": "needs CUDA: PyTorch's cuDNN attention kernel exists only on CUDA GPUs (torch 2.13 on "
                                "cpu bfloat16: RuntimeError: no)"}
    groups = attention_backends.reason_groups(reasons)
    assert list(groups["backends (count)"]) == [2, 2, 1] and groups["backends (count)"].sum() == len(reasons)
    assert "flash, flash_varlen" in list(groups["backends"])
