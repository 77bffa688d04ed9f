"""Parameter validation: wrong values fail fast with the allowed ones named, and write nothing."""


import papermill
import pytest
import torch

from helpers import params, paths
from tests.nbrun import run_setup


@pytest.mark.parametrize("name,value,allowed", [
    ("PROFILE", "bogus", "'auto', 'smoke', 'full'"),
    ("MODEL", "sd15", "'flux-dev', 'sdxl'"),
    ("DTYPE", "int3", "'bf16', 'fp16', 'fp32'"),
])
def test_unknown_choice_names_allowed_values(name, value, allowed):
    with pytest.raises(params.ParameterError, match=allowed):
        params.resolve("00_setup_and_baseline", **{name: value})


def test_missing_weights_folder(tmp_path):
    with pytest.raises(params.ParameterError, match="WEIGHTS=.*not an existing folder.*'random'"):
        params.resolve("x", WEIGHTS=str(tmp_path / "nope"))
    with pytest.raises(params.ParameterError, match="WEIGHTS"):
        params.resolve("x", WEIGHTS="./models/flux")
    assert params.resolve("x", WEIGHTS=str(tmp_path)).weights == str(tmp_path.resolve())
    assert params.resolve("x", WEIGHTS="black-forest-labs/FLUX.1-dev").weights == "black-forest-labs/FLUX.1-dev"


def test_full_profile_without_big_gpu_is_refused(monkeypatch):
    monkeypatch.setattr(params, "_gpu", lambda: None)
    with pytest.raises(params.ParameterError, match="PROFILE='full' needs a CUDA GPU"):
        params.resolve("x", PROFILE="full")
    run = params.resolve("x", PROFILE="auto")
    assert run.profile == "smoke" and "no CUDA GPU" in run.profile_reason


def test_list_knobs():
    assert params.check_positive_ints("RESOLUTIONS", [64, 128], 16) == [64, 128]
    for bad in ([], [64, 100], [0], ["64"]):
        with pytest.raises(params.ParameterError, match="RESOLUTIONS"):
            params.check_positive_ints("RESOLUTIONS", bad, 16)
    with pytest.raises(params.ParameterError, match="'default'"):
        params.check_subset("MODES", ["turbo"], ["default", "max-autotune"])
    with pytest.raises(params.ParameterError, match="positive integers$"):
        params.check_positive_ints("RANKS", [4, True])  # a bool is not a rank
    assert params.check_nonnegative_numbers("THRESHOLDS", [0, 0.1]) == [0, 0.1]
    for bad in ([], [-0.1], [0.1, "0.2"], [False]):
        with pytest.raises(params.ParameterError, match=r"THRESHOLDS=.* numbers >= 0"):
            params.check_nonnegative_numbers("THRESHOLDS", bad)


def test_scalar_knobs():
    assert params.check_positive_int("STEPS", 2) == 2
    for bad in (0, -1, 2.0, "2", True, None):
        with pytest.raises(params.ParameterError, match=r"STEPS=.* must be a positive integer"):
            params.check_positive_int("STEPS", bad)
    assert params.check_choice("FLAG", False, (True, False)) is False
    for bad in (1, 0, "True"):  # 1 == True in Python, but 1 is not a choice of a flag
        with pytest.raises(params.ParameterError, match="choose one of: True, False"):
            params.check_choice("FLAG", bad, (True, False))


@pytest.mark.parametrize("bad", ["", "  ", None, 7])
def test_prompt_must_be_text(bad):
    assert params.resolve("x", PROMPT="a digit").knobs["PROMPT"] == "a digit"
    with pytest.raises(params.ParameterError, match=r"PROMPT=.* is not allowed; use a non-empty string"):
        params.resolve("x", PROMPT=bad)


def _snapshot():
    return sorted(str(p) for p in paths.RESULTS_DIR.rglob("*")) if paths.RESULTS_DIR.exists() else []


@pytest.mark.notebook
def test_bogus_profile_through_papermill_fails_fast_and_writes_nothing(tmp_path):
    before = _snapshot()
    with pytest.raises(papermill.PapermillExecutionError) as err:
        papermill.execute_notebook(
            str(paths.NOTEBOOKS_DIR / "00_setup_and_baseline.ipynb"), str(tmp_path / "out.ipynb"),
            parameters={"PROFILE": "bogus"}, kernel_name="python3", cwd=str(paths.NOTEBOOKS_DIR),
            progress_bar=False, execution_timeout=120,
        )
    assert "PROFILE='bogus' is not allowed; choose one of: 'auto', 'smoke', 'full'" in str(err.value)
    # it failed in the setup cell, before any pipeline was built: no later code cell ran (no seconds asserted: a
    # loaded machine may take long to start the kernel)
    import nbformat
    code = [c for c in nbformat.read(tmp_path / "out.ipynb", as_version=4).cells if c.cell_type == "code"]
    failed = [i for i, c in enumerate(code) if any(o.get("output_type") == "error" for o in c.get("outputs", []))]
    setup = next(i for i, c in enumerate(code) if "session.start(" in c.source)
    assert failed == [setup] and all(c.get("execution_count") is None for c in code[setup + 1:])
    assert _snapshot() == before, "a failed validation wrote under data/results/"


def test_repeats_and_warmup_shorten_a_measurement_and_refuse_bad_values():
    run = params.resolve("x", PROFILE="smoke", REPEATS=2, WARMUP=0)
    assert (run.settings.repeats, run.settings.warmup) == (2, 0)
    default = params.resolve("x", PROFILE="smoke")
    assert (default.settings.repeats, default.settings.warmup) == (3, 1)  # the smoke profile's own
    for name, bad in (("REPEATS", 0), ("REPEATS", True), ("WARMUP", -1), ("WARMUP", 1.5)):
        with pytest.raises(params.ParameterError, match=name):
            params.resolve("x", PROFILE="smoke", **{name: bad})


def test_dtype_auto_is_bf16_where_native_and_fp32_elsewhere(monkeypatch):
    from helpers import precision
    monkeypatch.setattr(precision, "native_half_reason", lambda device, name: "")
    assert params.resolve_dtype("auto", torch.device("cpu"))[0] == "bf16"
    monkeypatch.setattr(precision, "native_half_reason", lambda device, name: "no bf16 instructions")
    name, why = params.resolve_dtype("auto", torch.device("cpu"))
    assert name == "fp32" and "no bf16 instructions" in why and "DTYPE='bf16'" in why
    assert params.resolve_dtype("bf16", torch.device("cpu")) == ("bf16", "bf16: chosen explicitly")
    assert params.resolve("00_x", DTYPE="fp16").dtype == torch.float16
    with pytest.raises(params.ParameterError, match="auto"):
        params.resolve("00_x", DTYPE="float32")


def test_run_setup_runs_the_setup_cell_with_the_overrides(tmp_path):
    """The bad-knob tests' runner: an accepted knob goes through the real setup cell, a refused one raises there."""
    ns = run_setup("06_graph_breaks", tmp_path, LOG_LINES=7, SEED=3)
    assert ns["LOG_LINES"] == 7 and ns["run"].seed == 3 and ns["run"].profile == "smoke"
    assert ns["s"].writer.path.is_relative_to(tmp_path / "results")
    with pytest.raises(params.ParameterError, match="LOG_LINES=0 must be a positive integer"):
        run_setup("06_graph_breaks", tmp_path, LOG_LINES=0)


_NATIVE_BF16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


@pytest.mark.skipif(not _NATIVE_BF16, reason="this CPU has no native bf16 (AVX512-BF16 or AMX): auto gives fp32 here")
def test_dtype_auto_on_a_cpu_with_native_bf16_is_bf16():
    """The real resolution on this machine, no stand-in: a CPU with AVX512-BF16 or AMX runs the smoke profile in bf16."""
    name, why = params.resolve_dtype("auto", torch.device("cpu"))
    assert name == "bf16" and "natively" in why


@pytest.mark.skipif(_NATIVE_BF16, reason="this CPU has native bf16 (AVX512-BF16 or AMX): auto gives bf16 here")
def test_dtype_auto_on_a_cpu_without_native_bf16_is_fp32():
    """The real resolution on this machine, no stand-in: an AVX2-only CPU runs the smoke profile in fp32."""
    name, why = params.resolve_dtype("auto", torch.device("cpu"))
    assert name == "fp32" and "no bf16 instructions" in why


def test_cpu_note_names_what_the_arithmetic_depends_on():
    from helpers import environment

    note = environment.cpu_note()
    assert note.startswith("CPU: ") and "torch capability" in note
    assert f"native bf16 (DTYPE='auto' -> bf16): {'yes' if _NATIVE_BF16 else 'no'}" in note
    assert "bitsandbytes AVX512-BF16 path: " in note


def test_a_model_of_notebook_16_is_refused_elsewhere_with_the_reason():
    for model in params.TRANSFER_ONLY_MODELS:
        with pytest.raises(params.ParameterError, match=rf"not taught in 03_torch_compile.*16_does_it_transfer.*{model}"):
            params.resolve("03_torch_compile", MODEL=model, PROFILE="smoke")
    with pytest.raises(params.ParameterError, match="MODEL='sd3' is not allowed; choose one of"):  # unknown: the list
        params.resolve("03_torch_compile", MODEL="sd3", PROFILE="smoke")
    assert params.resolve("16_does_it_transfer", MODEL="qwen-image", PROFILE="smoke",
                          models=("all", "flux-dev", "qwen-image", "flux2-dev")).model == "qwen-image"


def test_auto_weights_for_notebook_16s_all_models_name_the_trained_one():
    """MODEL='all' (notebook 16) resolves per model: its card names the trained smoke Flux, not 'none ships for all'."""
    from helpers import params

    weights, reason = params.resolve_weights("auto", "all", "smoke")
    assert weights == "random" and "trained smoke model for flux-dev" in reason and "for all" not in reason
    assert params.resolve_weights("auto", "sdxl", "smoke")[1].endswith("no trained smoke model ships for sdxl")


def test_auto_weights_in_notebook_04_are_random_and_the_card_says_auto():
    """04 times compiles at full depth: WEIGHTS='auto' resolves to random there, and its card says 'auto', not that
    random weights were chosen explicitly; other notebooks still get the trained smoke model."""
    from helpers import params

    run = params.resolve("04_regional_compilation", PROFILE="smoke", WEIGHTS="auto", models=("flux-dev",))
    assert run.weights == "random" and run.weights_reason.startswith("auto: random, because compile time grows")
    assert params.resolve("04_regional_compilation", PROFILE="smoke", WEIGHTS="random",
                          models=("flux-dev",)).weights_reason == "random: chosen explicitly"
    assert params.resolve_weights("auto", "flux-dev", "smoke", "03_torch_compile")[0].endswith("flux-dev-smoke")
