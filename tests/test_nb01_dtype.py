"""Notebook 01 on the smoke profile: per-format latency, memory, weight bytes, drift vs fp32, and (trained weights)
the image quality of each 16-bit format."""

import math

import pytest
import torch

from helpers import params, precision
from tests.nbrun import run_notebook, run_setup

pytestmark = pytest.mark.notebook

U = {"fp16": 2.0**-11, "bf16": 2.0**-8}
CLAIMS = {"every TF32 switch is back as it was", "fp16 weights take half of fp32's bytes (modules kept in fp32 aside; bytes)",
          "bf16 weights take half of fp32's bytes (modules kept in fp32 aside; bytes)",
          "bf16 peaks below fp32, or (bf16 not native) the im2col fallback is its largest allocator",
          "fp32 run twice gives the same denoiser output", "bf16 output is finite",
          "bf16 denoiser drift at an exact guidance is in (0, 25 u)",
          "bf16 denoiser drift at the run's guidance is in (0, 1)",
          "the fp32 reference ran with every TF32 switch off",
          "pipe.to(torch.bfloat16) holds the weights from_pretrained(dtype=torch.bfloat16) loads"}
# with random weights or the project's smoke model fp16 is claimed too (a hub checkpoint may overflow it)
OURS = {"fp16 output is finite", "fp16 denoiser drift at an exact guidance is in (0, 25 u)",
        "fp16 drifts less than bf16 (3 more significand bits)"}
QUALITY = {f"{d}: {claim}" for d in ("fp16", "bf16") for claim in
           ("at most two digits fewer read as prompted than in fp32", "PSNR against fp32 above -20 log10(25 u)")}


def _check(nb, model):
    rows = nb.rows
    assert set(rows["model"]) == {model} and set(rows["profile"]) == {"smoke"}
    assert set(rows["run_id"]) == {rows["run_id"].iloc[0]}
    tf32 = [nb.row("denoiser step tf32"), nb.row("pipeline tf32")]
    assert all(r["status"] == "skipped" and "TF32" in r["reason"] for r in tf32), "tf32 must be skipped on a CPU"
    step = {d: nb.row(f"denoiser step {d}") for d in ("fp32", "fp16", "bf16")}
    pipe = {d: nb.row(f"pipeline {d}") for d in ("fp32", "fp16", "bf16")}
    for d in step:
        assert step[d]["status"] == pipe[d]["status"] == "ok" and step[d]["dtype"] == d
        assert step[d]["latency_median_s"] > 0 and len(pipe[d]["latency_samples_s"]) == 3
        assert pipe[d]["peak_memory_bytes"] > 0 and pipe[d]["memory_kind"] == "cpu_allocated_during_call"
        assert step[d]["extra"]["finite"] and pipe[d]["extra"]["image_finite"]
    # the fp32 reference ran with every TF32 switch off (PyTorch's default lets cuDNN convolutions use TF32), and so
    # did every format measured here
    switches = step["fp32"]["extra"]["reference_switches"]
    assert switches["float32_matmul_precision"] == "highest" and switches["cudnn.allow_tf32"] is False
    assert switches["cuda.matmul.allow_tf32"] is False
    assert all(v == "ieee" for k, v in switches.items() if k.endswith(".fp32_precision")), switches
    assert all(step[d]["extra"]["reduced_precision_switches"] == [] for d in step)
    # 16-bit weights are half of fp32's, apart from what from_pretrained keeps in fp32 (T5's wo in fp16)
    w = {d: pipe[d]["extra"]["weight_bytes"] for d in pipe}
    assert w["fp32"] == 2 * w["bf16"] > 0 and pipe["bf16"]["extra"]["kept_in_fp32"] == {}
    kept = 4 * sum(pipe["fp16"]["extra"]["kept_in_fp32"].values())
    assert w["fp16"] == (w["fp32"] - kept) / 2 + kept
    assert all(".wo." in name for name in pipe["fp16"]["extra"]["kept_in_fp32"])
    dw = {d: step[d]["extra"]["denoiser_weight_bytes"] for d in step}
    assert dw["fp32"] == 2 * dw["bf16"] == 2 * dw["fp16"] > 0
    # memory: the bf16 pipeline peaks lower than fp32 (on a CPU: the bytes the call allocates) where bf16 is native;
    # on a CPU without bf16 instructions a higher bf16 peak must come from the im2col convolution fallback
    lower = pipe["bf16"]["peak_memory_bytes"] < pipe["fp32"]["peak_memory_bytes"]
    top = pipe["bf16"]["extra"]["top_allocators"]
    assert top and all(v > 0 for v in top.values()), "a CPU run lists who allocated its working memory"
    assert pipe["bf16"]["extra"]["top_cpu_seconds"], "a CPU run lists where its time went"
    if pipe["bf16"]["extra"]["not_native_reason"] == "":
        assert lower
    else:
        assert lower or next(iter(top)) == "aten::_slow_conv2d_forward", top
        assert "bf16 is not native here" in nb.text(), "Going deeper says why bf16 behaves differently here"
    # drift: fp32 reruns bitwise equal; half precision small (< 25 unit roundoffs), nonzero, fp16 < bf16
    assert step["fp32"]["extra"]["rel_l2"] == 0 and step["fp32"]["extra"]["max_abs"] == 0
    assert step["fp32"]["extra"]["rel_l2_exact_guidance"] == 0
    assert pipe["fp32"]["extra"]["image_rel_l2"] == 0
    for d, u in U.items():
        assert 0 < step[d]["extra"]["rel_l2_exact_guidance"] < 25 * u, (d, step[d]["extra"])
        assert 0 < step[d]["extra"]["rel_l2"] < 1
        assert math.isfinite(pipe[d]["extra"]["image_rel_l2"])
    assert step["fp16"]["extra"]["rel_l2_exact_guidance"] < step["bf16"]["extra"]["rel_l2_exact_guidance"]
    # the CPU speed is one line beside the published GPU figure
    line = next(ln for ln in nb.text().splitlines() if "this run (cpu, smoke profile)" in ln)
    assert "tiny model: no comparison" in line and "diffusion-fast" in line  # Flux: SDXL's, the nearest published
    assert model == "sdxl" or "no fp32 figure is published for Flux-1-Dev" in line
    suffix = "" if model == "flux-dev" else f".{model}"  # an SDXL run keeps the Flux run's figures
    assert (nb.figures_dir / "cpu" / f"01_dtype_latency_per_dtype{suffix}.png").stat().st_size > 1000
    assert (nb.figures_dir / "cpu" / f"01_dtype_drift_per_dtype{suffix}.png").stat().st_size > 1000
    assert "not measured" in nb.text()
    # the lesson (before 'Going deeper') teaches what holds on any device: drift and digits; the CPU latency, its
    # published line and the fallback forensics sit under 'Going deeper'
    deeper = next(i for i, c in enumerate(nb.notebook.cells) if c.source.startswith("## Going deeper"))
    lesson = "\n".join(o.get("text", "") or str(o.get("data", {}).get("text/plain", ""))
                        for c in nb.notebook.cells[:deeper] for o in c.get("outputs", []))
    assert "this run (cpu, smoke profile)" not in lesson and "is not native here" not in lesson
    assert "01_dtype_drift_per_dtype" in lesson and "01_dtype_latency_per_dtype" not in lesson
    assert "TL;DR, bf16 over fp32, whole SDXL image: " in lesson and "published: 1.59x on A100-80GB (diffusion-fast)" in lesson
    code = [c.source for c in nb.notebook.cells[:deeper] if c.cell_type == "code"]
    assert any("Pipeline.from_pretrained(run.weights, dtype=dtype)" in c for c in code)
    assert any("\n    pipe.to(torch.bfloat16)" in c for c in code), "the cast runs, not only named"
    assert any('torch.backends.cuda.matmul.fp32_precision = "tf32"' in c for c in code)
    claims = nb.checks()  # the Checks cell's table, every claim held (the cell raises otherwise)
    assert all(c["holds"] for c in claims.values()) and nb.row("checks")["status"] == "ok"
    assert CLAIMS | OURS <= set(claims), sorted(CLAIMS | OURS - set(claims))
    trained = params.trained_smoke_folder(model).joinpath("model_index.json").is_file()
    assert (QUALITY <= set(claims)) is trained
    shown = {t: nb.row(f"shown: {t}")["extra"] for t in ("the fp32 reference", "the ten digits per format")
             if (rows["scenario"] == f"shown: {t}").any()}
    assert shown["the fp32 reference"]["judged"] is trained
    if trained:  # WEIGHTS="auto" loads the project's smoke model: its images are judged per format
        grid = shown["the ten digits per format"]
        assert [g["label"] for g in grid["grid"]] == ["fp32", "fp16", "bf16"] and grid["grid"][0]["floor"] == 0.8
        assert all(g["holds"] for s in shown.values() for g in s["grid"]), shown
        assert claims["every image shown reads as its prompt's digit (a grid row: at least its floor)"]["holds"]
        assert pipe["fp32"]["weights"] == f"data/models/{model}-smoke"
        quality = {d: nb.row(f"quality {d}")["extra"] for d in ("fp32", "fp16", "bf16")}
        # the rows store an infinite PSNR as the text 'inf' (JSON has no infinity)
        assert float(quality["fp32"]["psnr"]) == math.inf and quality["fp32"]["ssim"] == pytest.approx(1)
        for d in U:
            assert math.isfinite(float(quality[d]["psnr"])) and 0 < quality[d]["ssim"] <= 1
            assert quality[d]["frechet"] >= 0 and len(quality[d]["read_as"]) == 10
    else:
        assert "noise by design" in nb.text() and "the ten digits per format" not in shown
        assert "quality cannot be judged" in nb.text()
        assert not rows["scenario"].str.startswith("quality").any()
    return nb


class _Pipe:
    """A stand-in pipeline: its components, as diffusers lists them."""

    def __init__(self, **components):
        self.components = components


def test_weights_fingerprint_tells_a_cast_from_other_weights():
    """The cast check can fail: one value moved by a few bf16 steps, or a module kept in fp32, changes the
    fingerprint; the same fp32 values cast or loaded into bf16 give the same one."""
    torch.manual_seed(0)
    master = torch.nn.Linear(8, 8).state_dict()
    loaded = torch.nn.Linear(8, 8).bfloat16()
    loaded.load_state_dict(master)  # a load in bf16: each fp32 value rounded once
    cast = torch.nn.Linear(8, 8)
    cast.load_state_dict(master)
    cast.to(torch.bfloat16)  # the cast: the same rounding
    print_ = precision.weights_fingerprint
    assert print_(_Pipe(net=cast, tokenizer="not a module")) == print_(_Pipe(net=loaded))
    kept = torch.nn.Linear(8, 8)
    kept.load_state_dict(master)  # left in fp32, as a load keeps T5's wo in fp16
    assert print_(_Pipe(net=kept)) != print_(_Pipe(net=loaded))
    with torch.no_grad():
        cast.weight[0, 0] += cast.weight[0, 0].abs() * 2**-5  # a few bf16 steps off
    assert print_(_Pipe(net=cast)) != print_(_Pipe(net=loaded))


def test_dtype_rows_flux(tmp_path):
    _check(run_notebook("01_dtype", tmp_path), "flux-dev")


@pytest.mark.slow  # make test-all
def test_dtype_rows_sdxl(tmp_path):
    nb = _check(run_notebook("01_dtype", tmp_path, MODEL="sdxl"), "sdxl")
    # fp16 SDXL upcasts its VAE at every call (force_upcast): diffusers' notices show once, not at each call
    # (at most once: a notice naming no module, 'kept in float32: []', is dropped, as the tiny SDXL's is)
    assert nb.text().count("should be kept in float32") <= 1 and "kept in float32: []" not in nb.text()
    assert nb.text().count("`upcast_vae` is deprecated") <= 1  # one line of ours, not diffusers' advice


def test_dtypes_without_fp32_fails_fast(tmp_path):
    with pytest.raises(params.ParameterError, match="must include 'fp32'"):
        run_setup("01_dtype", tmp_path, DTYPES=["bf16"])
    assert not (tmp_path / "results").exists(), "nothing may be written before the parameters are checked"


@pytest.mark.parametrize("prompt", ["", 7])
def test_bad_prompt_fails_fast(tmp_path, prompt):
    with pytest.raises(params.ParameterError, match="PROMPT=.*non-empty string"):
        run_setup("01_dtype", tmp_path, PROMPT=prompt)
    assert not (tmp_path / "results").exists(), "nothing may be written before the parameters are checked"
