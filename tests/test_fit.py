"""helpers.fit: the GPU memory cap, and the decision whether a notebook's full profile fits a GPU, part by part, on
planted GPUs of every memory class (nothing here needs a GPU). The README's table is the same code's output."""

import re

import pytest
import torch

from helpers import fit, footprint, params, paths


def test_weights_are_the_footprint_of_the_full_models():
    for model, comps in fit.WEIGHTS_GIB.items():
        got = footprint.component_bytes(footprint.meta_components(model, "full", torch.bfloat16), torch.bfloat16)
        assert {k: round(v / 2**30, 3) for k, v in got.items()} == comps
    flux = footprint.meta_components("flux-dev", "full", torch.bfloat16)
    assert {n: round(footprint.nf4_bytes(flux[n])["total_bytes"] / 2**30, 3) for n in fit.NF4_GIB} == fit.NF4_GIB


def test_fused_qkv_keeps_the_unfused_layers_beside_the_fused_ones():
    """diffusers' fuse_qkv_projections adds the fused layers and keeps q/k/v: on Flux-1-Dev's released config, counted
    on the meta device, FUSED_QKV_GIB more in bf16."""
    from diffusers import FluxTransformer2DModel

    config = FluxTransformer2DModel.load_config(paths.ROOT / "data" / "configs" / "flux-dev" / "full" / "transformer")
    with torch.device("meta"):
        net = FluxTransformer2DModel.from_config(config)
    before = sum(p.numel() for p in net.parameters())
    net.fuse_qkv_projections()
    assert round((sum(p.numel() for p in net.parameters()) - before) * 2 / 2**30, 2) == fit.FUSED_QKV_GIB


@pytest.mark.parametrize(("gib", "skipped"), [(40, ["fused-qkv", "aoti"]), (48, []), (80, [])])
def test_12_skips_fused_qkv_and_the_package_where_their_copy_does_not_fit(gib, skipped, monkeypatch):
    """On a 40 GB card (an A100) the compiled pipeline fits and 12 runs full, without fused QKV and the package, whose
    extra copies do not; from 48 GB everything runs. A fused-QKV copy planted at 0 GiB would fit on 40 GB."""
    s = _planted_session(monkeypatch, "12_maximum_speed", gib)
    assert s.run.profile == "full" and list(s.skipped_parts()) == skipped
    assert all(why.startswith("needs 39.9 GiB") for why in s.skipped_parts().values())
    monkeypatch.setattr(fit, "FUSED_QKV_GIB", 0.0)
    assert gib != 40 or "fused-qkv" not in _planted_session(monkeypatch, "12_maximum_speed", gib).skipped_parts()


@pytest.mark.parametrize(("notebook", "model", "gib", "part", "need"), [
    ("02_attention_sdpa", "flux-dev", 48, "fp32", "needs 67.7 GiB"), ("02_attention_sdpa", "flux-dev", 80, "fp32", ""),
    ("02_attention_sdpa", "sdxl", 16, "fp32", "needs 19.9 GiB"), ("02_attention_sdpa", "sdxl", 24, "fp32", ""),
    ("14_caching_attention_steps", "flux-dev", 40, "fused-qkv", "needs 39.9 GiB"),
    ("14_caching_attention_steps", "flux-dev", 48, "fused-qkv", ""),
])
def test_parts_a_notebook_leaves_out_on_a_card_where_they_do_not_fit(notebook, model, gib, part, need, monkeypatch):
    """02's fp32 pipeline (Going deeper) and 14's fused-QKV waterfall stage are left out, with their need, where the
    card cannot hold them, while the notebook runs (16's Qwen-Image: test_notebook_16_skip_reason_by_model)."""
    s = _planted_session(monkeypatch, notebook, gib, MODEL=model)
    assert s.run.profile == "full" and list(s.skipped_parts(only=(part,))) == ([part] if need else [])
    assert s.skip_reason(part).startswith(need) and bool(s.skip_reason(part)) == bool(need)


def test_the_measured_eager_peak_is_the_committed_h200_row():
    from helpers import results

    rows = results.read_rows(paths.RESULTS_DIR, hardware="h200", notebook="00_setup_and_baseline")
    peak = rows[rows["scenario"] == "pipeline eager"]["peak_memory_bytes"].iloc[0] / 2**30
    assert round(peak, 2) == fit.FLUX_EAGER_GIB


@pytest.mark.parametrize("gib", fit.MEMORY_CLASSES)
@pytest.mark.parametrize("notebook", [nb for nb in fit.PARTS if fit.PARTS[nb] and nb not in fit.NOT_IN_README_TABLE])
def test_decisions_on_planted_gpus_are_the_readme_table(notebook, gib, monkeypatch):
    """For every notebook, model and memory class: the profile params.resolve picks on a planted GPU is the table's."""
    monkeypatch.setattr(params, "_gpu", lambda: params.Gpu("planted GPU", float(gib), True))
    table = {(r["notebook"], r["model"]): r[f"{gib} GB"] for r in fit.table()}
    for model in ("flux-dev", "sdxl") if notebook in fit.SDXL_NOTEBOOKS else ("flux-dev",):
        run = params.resolve(notebook, PROFILE="auto", MODEL=model, DTYPE="bf16")
        expected = table[(notebook[:2], model)]
        assert run.profile == ("smoke" if expected == "smoke" else "full"), (notebook, model, gib, run.profile_reason)
        if expected == "smoke":
            assert "needs" in run.profile_reason and "fits instead" in run.profile_reason
            with pytest.raises(params.ParameterError, match="PROFILE='full'"):
                params.resolve(notebook, PROFILE="full", MODEL=model, DTYPE="bf16")


def test_24_gib_runs_08_and_09_and_refuses_03_naming_what_fits(monkeypatch):
    monkeypatch.setattr(params, "_gpu", lambda: params.Gpu("planted RTX 4090", 24.0, True))
    assert params.resolve("08_cpu_offload", PROFILE="full", DTYPE="bf16").profile == "full"
    assert params.resolve("09_nf4_quantization", PROFILE="full", DTYPE="bf16").profile == "full"
    with pytest.raises(params.ParameterError, match=r"MODEL='sdxl'.*notebook 09 \(NF4"):
        params.resolve("03_torch_compile", PROFILE="full", DTYPE="bf16")
    d = fit.decide("08_cpu_offload", "flux-dev", 24.0)
    assert d.part("model CPU offload") == "" and "needs 33.9 GiB" in d.part("eager pipeline")
    assert fit.decide("09_nf4_quantization", "flux-dev", 16.0).part("NF4 + model CPU offload") == ""
    assert "this GPU has 15.0 GiB usable of 16 GiB" in fit.decide("09_nf4_quantization", "flux-dev", 16.0).part(
        "NF4 pipeline")


def test_a_cap_counts_as_the_smaller_card(monkeypatch):
    monkeypatch.setattr(params, "_gpu", lambda: params.Gpu("planted H100", 79.2, True))
    assert params.resolve("03_torch_compile", PROFILE="auto", DTYPE="bf16").profile == "full"
    run = params.resolve("03_torch_compile", PROFILE="auto", DTYPE="bf16", GPU_MEMORY_GIB=24)
    assert run.profile == "smoke" and "24 GiB (GPU_MEMORY_GIB)" in run.profile_reason and run.gpu_memory_gib == 24.0
    with pytest.raises(params.ParameterError, match="more than this GPU's 79.2 GiB"):
        params.resolve("03_torch_compile", GPU_MEMORY_GIB=100)
    for bad in (0, -1, "24", True):
        with pytest.raises(params.ParameterError, match="GPU_MEMORY_GIB="):
            params.resolve("03_torch_compile", GPU_MEMORY_GIB=bad)


def test_a_cap_without_a_gpu_is_refused():
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    with pytest.raises(params.ParameterError, match="no CUDA GPU is visible"):
        params.resolve("08_cpu_offload", GPU_MEMORY_GIB=24)


def test_fp32_doubles_the_16_bit_needs():
    bf16, fp32 = fit.decide("00_setup_and_baseline", "flux-dev", 48.0), fit.decide(
        "00_setup_and_baseline", "flux-dev", 48.0, dtype_name="fp32")
    assert bf16.runs and not fp32.runs and "twice the 16-bit figure" in fp32.reason


def test_a_gpu_without_native_bf16_gets_fp16_for_sdxl_and_fp32_for_flux(monkeypatch):
    monkeypatch.setattr(params, "_gpu", lambda: params.Gpu("planted T4", 15.0, False))
    cuda = torch.device("cuda")
    name, why = params.resolve_dtype("auto", cuda, "sdxl")
    assert name == "fp16" and "no native bf16" in why
    name, why = params.resolve_dtype("auto", cuda, "flux-dev")
    assert name == "fp32" and "overflows fp16" in why and "MODEL='sdxl'" in why
    monkeypatch.setattr(params, "_gpu", lambda: params.Gpu("planted A100", 79.0, True))
    assert params.resolve_dtype("auto", cuda, "flux-dev")[0] == "bf16"


def test_a_planted_wrong_need_changes_the_decision(monkeypatch):
    """The decision reads the needs: a planted 100 GiB eager peak turns 00 on an 80 GB card to smoke."""
    assert fit.decide("00_setup_and_baseline", "flux-dev", 80.0).runs
    monkeypatch.setattr(fit, "FLUX_EAGER_GIB", 100.0)
    assert not fit.decide("00_setup_and_baseline", "flux-dev", 80.0).runs


def test_readme_table_is_the_code_s():
    readme = (paths.ROOT / "README.md").read_text()
    region = re.search(r"<!-- gpu-fit:start -->\n(.*?)\n<!-- gpu-fit:end -->", readme, re.DOTALL)
    assert region, "README.md lacks the generated table (python -m helpers.fit writes it)"
    assert region.group(1) == fit.readme_table(), "README's table is stale: run python -m helpers.fit"


def test_running_out_of_memory_is_a_row_not_a_crash(tmp_path):
    """Planted: a part whose estimate was too low raises torch.OutOfMemoryError; the guard records an 'oom' row with
    the message, and the notebook goes on."""
    from helpers import session

    s = session.start("08_cpu_offload", PROFILE="smoke", DTYPE="fp32", RESULTS_DIR=str(tmp_path))
    with s.guard("model CPU offload", mode="model") as g:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert g.oom and g.row.status == "oom" and "Tried to allocate 2.00 GiB" in g.row.reason
    assert s.writer.rows[-1].extra["mode"] == "model"
    with s.guard("fine") as g2:
        pass
    assert not g2.oom
    with pytest.raises(ValueError), s.guard("other errors pass through"):
        raise ValueError("not a memory error")
    assert s.skip_reason("eager pipeline") == ""  # smoke: every part runs


def test_an_oom_row_carries_the_failed_parts_own_peak(tmp_path, monkeypatch):
    """Planted CUDA counters: the guard resets the peak as the part starts, so an earlier part's larger peak is not
    reported as this one's."""
    from helpers import session

    s = session.start("08_cpu_offload", PROFILE="smoke", DTYPE="fp32", RESULTS_DIR=str(tmp_path))
    state = {"peak": 30 * 2**30}  # an earlier part peaked at 30 GiB
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: state.update(peak=0))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: state["peak"])
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    with s.guard("model CPU offload") as g:
        state["peak"] = max(state["peak"], 22 * 2**30)  # this part reached 22 GiB, then asked for more
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert g.row.peak_memory_bytes == 22 * 2**30


@pytest.mark.parametrize(("gib", "profile", "skipped"), [
    (24, "smoke", None), (48, "full", {"qwen-image", "flux2-dev"}), (64, "full", {"flux2-dev"}), (80, "full", set()),
])
def test_16_runs_full_where_its_smallest_model_fits_and_skips_the_others(gib, profile, skipped, monkeypatch):
    """Notebook 16's parts are its models (estimated needs): MODEL='all' runs full where Flux-1-Dev's compiled
    pipeline fits, and the models that do not fit are skipped with their need; one MODEL is decided alone."""
    monkeypatch.setattr(params, "_gpu", lambda: params.Gpu("planted GPU", float(gib), True))
    run = params.resolve("16_does_it_transfer", PROFILE="auto", MODEL="all", DTYPE="bf16",
                         models=("all", "flux-dev", "qwen-image", "flux2-dev"))
    assert run.profile == profile, run.profile_reason
    d = fit.decide("16_does_it_transfer", "all", float(gib))
    if skipped is not None:
        assert set(d.skipped) == skipped and all("estimated" in why for why in d.skipped.values())
    needs = {n.part: n.gib for n in fit.needs("16_does_it_transfer", "all")}
    assert list(needs) == ["flux-dev", "qwen-image", "flux2-dev"]
    # weights from the footprint (meta-device counts): Qwen-Image whole, FLUX.2 without its 44.7 GiB text encoder
    assert needs["qwen-image"] > sum(fit.WEIGHTS_GIB["qwen-image"].values())
    assert sum(fit.WEIGHTS_GIB["flux2-dev"].values()) > 100 > needs["flux2-dev"] > fit.WEIGHTS_GIB["flux2-dev"][
        "transformer"]
    assert [n.part for n in fit.needs("16_does_it_transfer", "qwen-image")] == ["qwen-image"]
    assert not fit.decide("16_does_it_transfer", "flux2-dev", 48.0).runs
    # a planted larger need turns the 80 GB decision: the decision reads the needs
    monkeypatch.setattr(fit, "COMPILE_WORKSPACE_GIB", 20.0)
    assert "flux2-dev" in fit.decide("16_does_it_transfer", "all", 80.0).skipped


def _planted_session(monkeypatch, notebook: str, gib: float, cap: float | None = None, **knobs):
    """A session of notebook as on a planted GPU of gib (or capped at cap): the run resolved there, its device CUDA;
    nothing is built, so no GPU is needed."""
    import dataclasses

    from helpers import session

    monkeypatch.setattr(params, "_gpu", lambda: params.Gpu("planted GPU", float(gib), True))
    run = params.resolve(notebook, PROFILE="auto", DTYPE="bf16", GPU_MEMORY_GIB=cap, **knobs)
    return session.Session(run=dataclasses.replace(run, device=torch.device("cuda")), card=None, writer=None)


@pytest.mark.parametrize(("notebook", "gib", "cap", "skipped"), [
    ("08_cpu_offload", 12, None, ["model offload", "eager"]),
    ("08_cpu_offload", 16, None, ["model offload", "eager"]),
    ("08_cpu_offload", 24, None, ["eager"]),
    ("08_cpu_offload", 80, None, []),
    ("08_cpu_offload", 80, 24, ["eager"]),
    ("08_cpu_offload", 80, 16, ["model offload", "eager"]),
    ("09_nf4_quantization", 12, None, None),  # NF4 + offload does not fit: the smoke profile, nothing skipped
    ("09_nf4_quantization", 16, None, ["nf4", "eager"]),
    ("09_nf4_quantization", 24, None, ["eager"]),
    ("09_nf4_quantization", 80, None, []),
    ("09_nf4_quantization", 80, 16, ["nf4", "eager"]),
])
def test_skipped_parts_on_planted_gpus(notebook, gib, cap, skipped, monkeypatch):
    """The parts 08 and 09 skip, by their PARTS keys (the names the notebooks' why_skip reads), each with the GiB it
    needs and the GiB usable; a cap counts as the smaller card."""
    s = _planted_session(monkeypatch, notebook, gib, cap)
    got = s.skipped_parts()
    if skipped is None:
        assert s.run.profile == "smoke" and got == {}
        return
    assert s.run.profile == "full" and list(got) == skipped
    card = f"{cap:g} GiB (GPU_MEMORY_GIB)" if cap else f"{gib} GiB"
    for part, why in got.items():
        assert re.fullmatch(rf"needs \d+\.\d GiB \(.*\), this GPU has \d+\.\d GiB usable of {re.escape(card)}", why)
        assert s.skip_reason(part) == why  # the same decision, by key
    assert s.skip_reason("eager pipeline") == got.get("eager", "")  # and by the README's name


def test_a_planted_wrong_need_fails_the_24_gb_check(monkeypatch):
    """The 24 GB decision reads the needs: with the eager need planted at 10 GiB, the check that 08 and 09 skip their
    reference on a 24 GB card fails."""
    def reference_skipped() -> bool:
        return all("eager" in _planted_session(monkeypatch, nb, 24).skipped_parts()
                   for nb in ("08_cpu_offload", "09_nf4_quantization"))

    assert reference_skipped()
    monkeypatch.setattr(fit, "FLUX_EAGER_GIB", 10.0)
    assert not reference_skipped()


def test_skip_parts_rehearses_a_smaller_card_and_is_validated(monkeypatch):
    """SKIP_PARTS adds parts to skip on any profile (here the smoke one, on a CPU), saying what each needs at full
    size; on a planted GPU it adds to what does not fit; a part the notebook does not have is refused, naming them."""
    from helpers import session

    monkeypatch.setattr(params, "_gpu", lambda: None)
    s = session.Session(run=params.resolve("08_cpu_offload", PROFILE="smoke", SKIP_PARTS=["eager", "model offload"]),
                        card=None, writer=None)
    got = s.skipped_parts()
    assert list(got) == ["model offload", "eager"]  # in PARTS order
    assert got["eager"].startswith("SKIP_PARTS rehearses a smaller card") and "needs 33.9 GiB" in got["eager"]
    assert "needs 22.7 GiB" in got["model offload"] and s.skip_reason("eager") == ""  # the GPU's decision: none here
    planted = _planted_session(monkeypatch, "08_cpu_offload", 24, SKIP_PARTS=["group offload"])
    assert list(planted.skipped_parts()) == ["group offload", "eager"]
    assert planted.skipped_parts()["eager"].startswith("needs 33.9 GiB")  # fit's reason wins where both apply
    for bad, message in ((["nf4"], "SKIP_PARTS contains \\['nf4'\\].*'group offload', 'model offload'"),
                         ("eager", "SKIP_PARTS='eager' is not allowed.*list of parts"), ([], "SKIP_PARTS is empty")):
        s = session.Session(run=params.resolve("08_cpu_offload", PROFILE="smoke", SKIP_PARTS=bad), card=None,
                            writer=None)
        with pytest.raises(params.ParameterError, match=message):
            s.skipped_parts()
    assert session.Session(run=params.resolve("09_nf4_quantization", PROFILE="smoke"), card=None,
                           writer=None).skipped_parts() == {}


def test_decisions_are_keyed_by_the_notebooks_part_names():
    """Decision.skipped uses fit.PARTS keys for every notebook and memory class, the README its descriptive names;
    a part a notebook does not have is an error, not a silent 'fits'."""
    for nb in fit.PARTS:
        for gib in fit.MEMORY_CLASSES:
            d = fit.decide(nb, "flux-dev" if nb != fit.TRANSFER_NOTEBOOK else "all", float(gib))
            assert set(d.skipped) <= set(fit.PARTS[nb]), (nb, gib, d.skipped)
    d = fit.decide("08_cpu_offload", "flux-dev", 16.0)
    assert d.names["model offload"] == "model CPU offload" and d.part("model offload") == d.part("model CPU offload")
    with pytest.raises(ValueError, match="'group offload'.*'eager'"):
        d.part("eager pipline")
    assert fit.decide("16_does_it_transfer", "all", 48.0).part("qwen-image").startswith("needs")


def test_notebook_16_skip_reason_by_model(monkeypatch):
    """Notebook 16's parts are model names: skip_reason keeps answering for them."""
    s = _planted_session(monkeypatch, "16_does_it_transfer", 48, MODEL="all",
                         models=("all", "flux-dev", "qwen-image", "flux2-dev"))
    assert s.run.profile == "full" and s.skip_reason("flux-dev") == ""
    assert "needs" in s.skip_reason("qwen-image") and "needs" in s.skip_reason("flux2-dev")
    assert list(s.skipped_parts()) == ["qwen-image", "flux2-dev"]
