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
