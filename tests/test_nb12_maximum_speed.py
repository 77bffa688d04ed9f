"""Notebook 12 on the smoke profile: every lever that runs on a CPU keeps parity, compiles once, and the
AOTInductor package loads and reproduces the JIT-compiled output."""

import pytest
import torch
from diffusers import FluxTransformer2DModel
from diffusers.models import attention_dispatch

from helpers import attention_backends, compile_tools, params, stack
from tests.nbrun import run_notebook, run_setup

pytestmark = pytest.mark.notebook

NB = "12_maximum_speed"


# make test runs the ladder on the levers that carry its checks: the compile, int8 and the package built from them,
# and the two a CPU refuses (their reasons), without Going deeper's two cold compiles of the blocks; make test-all
# runs every lever (stack.LEVERS) and those compiles, as make reproduce does
QUICK = ["cudnn-attention", "compile", "int8", "fp8", "aoti"]
REGIONAL_CLAIMS = {"accelerate compile_regions: a cold compile, then no recompile",
                   "diffusers compile_repeated_blocks: output of eager (rel. L2)"}


@pytest.fixture(scope="module", params=[pytest.param(QUICK, id="quick"),
                                        pytest.param(list(stack.LEVERS), id="all", marks=pytest.mark.slow)])
def nb(request, tmp_path_factory):
    full = request.param == list(stack.LEVERS)
    run = run_notebook(NB, tmp_path_factory.mktemp("nb12"), REPEATS=1, LEVERS=request.param,  # one timed call
                       COMPARE_REGIONAL=full)
    run.levers, run.regional = request.param, full
    return run


def test_every_lever_is_measured_or_skipped_with_a_reason(nb):
    stages = nb.rows[nb.rows["scenario"].str.startswith("stack: ")]
    assert list(stages["scenario"]) == ["stack: eager"] + [f"stack: + {lever}" for lever in nb.levers]
    skipped = stages[stages["status"] == "skipped"].set_index("scenario")["reason"]
    # on a CPU: cuDNN attention and fp8 need CUDA (channels_last acts on Flux's VAE)
    assert set(skipped.index) == {"stack: + cudnn-attention", "stack: + fp8"}, skipped
    assert "CUDA" in skipped["stack: + cudnn-attention"] and "8.9" in skipped["stack: + fp8"]
    # fp8's reason is torchao's own refusal, in its words (not a guess about torch._scaled_mm)
    assert "torchao refuses" in skipped["stack: + fp8"] and "Float8 dynamic quantization requires" in skipped[
        "stack: + fp8"]


def test_parity_and_no_recompiles_at_every_stage(nb):
    stages = nb.rows[nb.rows["scenario"].str.startswith("stack: ") & (nb.rows["status"] == "ok")]
    tol = compile_tools.PARITY_TOLERANCE[stages["dtype"].iloc[0]]
    for _, row in stages.iterrows():
        extra = row["extra"]
        assert row["recompiles"] == 0 and row["graph_breaks"] == 0, row["scenario"]
        band = stack.INT8_TOLERANCE if "int8" in extra.get("levers", []) else tol
        assert extra["tolerance"] == band, row["scenario"]
        assert 0 <= extra["step_drift"] <= band and extra["finite"], (row["scenario"], extra["step_drift"])
        assert row["latency_median_s"] > 0 and extra["step_latency_median_s"] > 0
    int8 = nb.row("stack: + int8")["extra"]
    assert int8["quantized_linears"] == int8["linears"] > 0, "dynamic int8 swaps every Linear weight"
    for lever in {"compile", "max-autotune", "vae-compile"} & set(nb.levers):
        assert nb.row(f"stack: + {lever}")["extra"]["graphs_first_image"] >= 1, f"{lever} compiled nothing"


def test_fused_qkv_matches_unfused(nb):
    row = nb.row("fused qkv vs unfused (eager)")["extra"]
    assert row["rel_error"] <= row["tolerance"]


def test_checks_hold_and_name_every_claim(nb):
    claims = nb.checks()  # the Checks cell's table, every claim held (the cell raises otherwise)
    assert all(c["holds"] for c in claims.values()) and nb.row("checks")["status"] == "ok"
    assert {"fused QKV gives the unfused output (eager, rel. L2)",
            "every stage stays within its drift band, compiles once, without graph breaks",
            "largest drift relative to its band",
            "the package gives the output of the stage '+ int8' (rel. L2)",
            "the package keeps one 8-bit weight per quantized Linear layer",
            "the package replays in a CUDA graph, or the device has none",
            "the packaged stack compiles only the VAE at its first image (graphs)",
            "the packaged stack stays within its band, without recompiles",
            "the fastest stage stays within the measured matmul peak (+ noise margin)",
            "after the whole stack and the ladder, the process-wide attention backend is the default"} <= set(claims)
    assert (REGIONAL_CLAIMS <= set(claims)) if nb.regional else not (REGIONAL_CLAIMS & set(claims))


def test_the_whole_stack_cell_and_the_published_lines(nb):
    text = nb.text()
    # the whole stack ran in one cell beside eager: its levers minus the ones a CPU refuses, each skip with its reason
    whole = nb.row("whole stack")["extra"]
    assert set(whole["skipped"]) == {"cudnn-attention", "fp8"} and "torchao refuses" in whole["skipped"]["fp8"]
    assert set(whole["levers"]) == set(nb.levers) - {"cudnn-attention", "fp8", "int8", "aoti"}, whole["levers"]
    assert whole["graphs_first_image"] >= 1 and nb.row("whole stack")["graph_breaks"] == 0
    shown = nb.row("shown: eager and the whole stack")["extra"]
    assert [g["label"] for g in shown["grid"]] in ([], ["eager", "whole stack"]), shown
    if params.trained_smoke_folder("flux-dev").joinpath("model_index.json").is_file():  # both images are judged
        assert shown["judged"] and all(g["holds"] for g in shown["grid"]), shown
        assert nb.checks()["every image shown reads as its prompt's digit (a grid row: at least its floor)"]["holds"]
    # every speed figure of the stack sits beside a published one, said to be no comparison on a CPU
    assert text.count("tiny model: no comparison") >= 4 and "diffusers-torchao README" in text


def test_lossy_stages_are_judged_by_their_images(nb):
    if params.trained_smoke_folder("flux-dev").joinpath("model_index.json").is_file():  # WEIGHTS="auto" loads it
        q = nb.row("quality: + int8")["extra"]
        assert 0 <= q["recognized"] <= 1 and q["psnr_db"] > 0 and -1 <= q["ssim"] <= 1 and q["frechet"] >= 0
        assert nb.checks()["+ int8: its digits read as the eager images' digits (share of the ten)"]["holds"]
        grid = nb.row("shown: eager and 8-bit digits")["extra"]["grid"]
        assert [g["label"] for g in grid] == ["eager", "+ int8"] and all(g["holds"] for g in grid), grid
    else:  # random weights draw noise: the notebook says quality cannot be judged
        assert "quality cannot be judged" in nb.text()
        assert not nb.rows["scenario"].str.startswith("quality: ").any()


def test_aoti_package_loads_and_reproduces_the_compiled_output(nb):
    aoti = nb.row("stack: + aoti")
    assert aoti["status"] == "ok" and aoti["extra"]["package_mib"] > 0
    assert "CUDA GPU" in aoti["extra"]["cuda_graphs"], "CUDA graphs are recorded as skipped on a CPU, with the reason"
    assert aoti["extra"]["warm_cache_hits"] > 0, "the warm JIT compile beside the load found its kernels cached"
    same = nb.row("aoti vs jit step output")["extra"]
    assert same["jit_stage"] == "+ int8" and same["rel_error"] <= same["tolerance"] == stack.INT8_TOLERANCE
    assert aoti["extra"]["step_drift"] <= stack.INT8_TOLERANCE
    int8 = nb.row("stack: + int8")["extra"]
    assert aoti["extra"]["package_quantized_weights"] == int8["quantized_linears"] > 0, "the package kept its 8-bit weights"


def test_compile_regions_and_compile_repeated_blocks(nb):
    if not nb.regional:  # COMPARE_REGIONAL=False: one skipped row says so, nothing compiled
        skipped = nb.row("regional: two ways")
        assert skipped["status"] == "skipped" and skipped["reason"] == "COMPARE_REGIONAL=False"
        assert not nb.rows["scenario"].str.startswith("regional: accelerate").any()
    for name in ("accelerate compile_regions", "diffusers compile_repeated_blocks") if nb.regional else ():
        row = nb.row(f"regional: {name}")
        assert row["latency_median_s"] > 0 and row["extra"]["graphs_first_call"] >= 1
        assert row["extra"]["rel_error"] <= compile_tools.PARITY_TOLERANCE[row["dtype"]]
    floor = nb.row("denoiser floor")["extra"]
    assert floor["flops_per_step"] > 0 and floor["floor_s"] > 0
    assert (nb.figures_dir / "cpu" / f"{NB}_ladder.png").stat().st_size > 1000


@pytest.mark.parametrize("knob, value, allowed", [
    ("COMPILE_SCOPE", "partial", r"COMPILE_SCOPE='partial' is not allowed; choose one of: 'full', 'regional'"),
    ("VAE_MODE", "reduce-overhead", r"VAE_MODE='reduce-overhead' is not allowed; choose one of: 'default', 'max-autotune'"),
    ("LEVERS", ["turbo"], r"LEVERS contains \['turbo'\]; each entry must be one of: 'cudnn-attention'"),
    ("PROMPT", "  ", r"PROMPT='  ' is not allowed; use a non-empty string"),
    ("COMPARE_REGIONAL", "no", r"COMPARE_REGIONAL='no' is not allowed; choose one of: True, False"),
    ("SKIP_PARTS", ["eager"], r"SKIP_PARTS contains \['eager'\]; each entry must be one of: 'fused-qkv', 'aoti'"),
    ("SKIP_PARTS", "aoti", r"SKIP_PARTS='aoti' is not allowed; use None or a list of parts"),
])
def test_bad_knob_fails_fast(tmp_path, knob, value, allowed):
    with pytest.raises(params.ParameterError, match=allowed):
        run_setup(NB, tmp_path, **{knob: value})
    assert not (tmp_path / "results").exists(), "nothing may be written before the parameters are checked"


def test_skip_parts_skips_a_lever_as_if_it_did_not_fit(tmp_path):
    """SKIP_PARTS rehearses what helpers.fit decides on a 40 GB card (tests/test_fit.py): fused QKV and the package
    skipped, with the reason the ladder records; without it, nothing is skipped for memory off a GPU."""
    too_big = run_setup(NB, tmp_path, SKIP_PARTS=["fused-qkv", "aoti"])["too_big"]
    assert list(too_big) == ["fused-qkv", "aoti"] and "needs 39.9 GiB" in too_big["fused-qkv"]
    assert all(why.startswith("SKIP_PARTS rehearses a smaller card") for why in too_big.values())
    assert run_setup(NB, tmp_path / "none")["too_big"] == {}


def _tiny_flux() -> FluxTransformer2DModel:
    return FluxTransformer2DModel(num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
                                  joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=(4, 6, 6))


def test_the_cudnn_lever_leaves_the_process_default_alone():
    """The claim 'after the ladder the process-wide backend is the default' can fail: diffusers' own call leaks."""
    registry = attention_dispatch._AttentionBackendRegistry
    before = registry.get_active_backend()[0]
    try:
        model = _tiny_flux()
        attention_backends.set_model_backend(model, "_native_cudnn")  # what stack.apply_lever and section 1 do
        assert {p._attention_backend.value for p in model.attn_processors.values()} == {"_native_cudnn"}
        assert attention_backends.active_backend() == attention_backends.default_backend() == "native"
        assert attention_backends.default_problem() == ""
        model.set_attention_backend("_native_cudnn")  # planted: diffusers' call, unscoped, leaks into the process
        assert "'_native_cudnn', not the default 'native'" in attention_backends.default_problem()
    finally:
        registry.set_active_backend(before)


def test_the_fp8_reason_is_torchaos_refusal():
    if torch.cuda.is_available():
        pytest.skip("on a CUDA machine torchao may accept its fp8 recipe")
    why = stack.skip_reason("fp8", "flux-dev", torch.device("cpu"))
    assert why.startswith("torchao refuses its fp8 recipe here: 'Float8 dynamic quantization requires CUDA compute "
                          "capability"), why
    assert "compute capability ≥8.9" in why  # notebook 10's test reads the same words
