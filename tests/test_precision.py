"""helpers.precision's TF32 switches: an fp32 reference runs with every one of them off, and they come back after;
and notebook 01's helpers: the modules a load kept in fp32, diffusers' repeated notices shown once, the denoiser probe
on the reference's inputs, and one format's measurement.

The flags are process-wide and read the same on a CPU as on a GPU, so a CPU checks what a GPU would do."""

import contextlib
import logging
import types
import warnings

import pytest
import torch

from helpers import precision

NEW_API = hasattr(torch.backends, "fp32_precision")  # torch >= 2.9: per-backend, per-op fp32_precision switches
needs_new_api = pytest.mark.skipif(not NEW_API, reason="torch < 2.9 has no fp32_precision switches")
LEAVES = ("cuda.matmul", "cudnn.conv", "cudnn.rnn", "mkldnn.matmul", "mkldnn.conv", "mkldnn.rnn")


def _state() -> dict:
    """Every TF32 switch, parents included (the legacy getters may refuse: then their error text)."""
    state = precision.tf32_settings()
    if NEW_API:
        state["generic.all"] = torch._C._get_fp32_precision_getter("generic", "all")
        state["cuda.all"] = torch._C._get_fp32_precision_getter("cuda", "all")
        state["mkldnn.all"] = torch._C._get_fp32_precision_getter("mkldnn", "all")
    return state


@pytest.fixture(autouse=True)
def defaults():
    """Each test starts from PyTorch's defaults and leaves them as it found them (the switches are global)."""
    before = _state()
    yield before
    if NEW_API:
        for backend in ("generic", "cuda", "mkldnn"):
            torch._C._set_fp32_precision_setter(backend, "all", "none")
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = True
    if NEW_API:
        for name in LEAVES:
            key = f"{name}.fp32_precision"
            backend, op = name.split(".")
            torch._C._set_fp32_precision_setter("cuda" if backend == "cudnn" else backend, op, before[key])
    assert _state() == before, "the test left the switches changed"


class Probe(torch.nn.Module):
    """A convolution and a matmul whose forward reads the switches it runs under, as a reference computation would."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.linear = torch.nn.Conv2d(2, 2, 3, padding=1), torch.nn.Linear(4, 4)
        self.seen: list[dict] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(precision.tf32_settings())
        return self.linear(self.conv(x))


def _all_off(settings: dict) -> None:
    """Assert that settings (from tf32_settings) let no fp32 matmul, convolution or RNN use TF32 or bf16."""
    assert settings["float32_matmul_precision"] == "highest"
    assert settings["cuda.matmul.allow_tf32"] is False and settings["cudnn.allow_tf32"] is False
    leaves = {k: v for k, v in settings.items() if k.endswith(".fp32_precision")}
    assert len(leaves) == (len(LEAVES) if NEW_API else 0)
    assert all(v == "ieee" for v in leaves.values()), leaves
    assert precision.reduced_precision_switches(settings) == []


def test_pytorch_defaults_allow_tf32_convolutions(defaults):
    """Why a reference needs the block: outside it cuDNN may use TF32 (PyTorch's default)."""
    assert defaults["cudnn.allow_tf32"] is True
    assert "cudnn.allow_tf32" in precision.reduced_precision_switches(defaults)


def test_fp32_reference_turns_every_switch_off_inside_the_computation_and_restores_them(defaults):
    probe = Probe()
    with precision.fp32_reference() as settings, torch.no_grad():
        probe(torch.ones(1, 2, 4, 4))
    _all_off(settings)
    _all_off(probe.seen[0])
    assert probe.seen[0] == settings
    assert _state() == defaults


def test_fp32_reference_restores_after_an_error(defaults):
    with pytest.raises(ValueError), precision.fp32_reference():
        raise ValueError("the reference computation failed")
    assert _state() == defaults


def test_fp32_reference_after_tf32_matmuls_were_allowed():
    torch.set_float32_matmul_precision("high")
    before = _state()
    assert "float32_matmul_precision" in precision.reduced_precision_switches(before)
    with precision.fp32_reference() as settings:
        _all_off(settings)
    assert _state() == before and torch.get_float32_matmul_precision() == "high"


@needs_new_api
def test_fp32_reference_overrides_the_new_global_switch():
    """torch.backends.fp32_precision = "tf32" reaches every leaf left at "none": the legacy cudnn.allow_tf32 = False
    sets the cuDNN leaves to "none", so the convolutions of a reference made with the legacy switches alone would
    still be TF32."""
    torch.backends.fp32_precision = "tf32"
    before = _state()
    assert before["cudnn.conv.fp32_precision"] == "tf32"
    torch.backends.cudnn.allow_tf32 = False  # the legacy way alone: the convolution leaf still resolves to tf32
    assert torch.backends.cudnn.conv.fp32_precision == "tf32"
    torch.backends.cudnn.allow_tf32 = True
    probe = Probe()
    with precision.fp32_reference() as settings, torch.no_grad():
        probe(torch.ones(1, 2, 4, 4))
    _all_off(settings)
    _all_off(probe.seen[0])
    assert _state() == before, "the global switch's effect must come back"


def test_tf32_on_and_off_again(defaults):
    with precision.tf32(True):
        on = precision.tf32_settings()
    assert on["float32_matmul_precision"] == "high" and on["cudnn.allow_tf32"] is True
    assert on["cuda.matmul.allow_tf32"] is True
    if NEW_API:
        assert {on[f"{n}.fp32_precision"] for n in ("cuda.matmul", "cudnn.conv", "cudnn.rnn")} == {"tf32"}
    assert {"float32_matmul_precision", "cudnn.allow_tf32"} <= set(precision.reduced_precision_switches(on))
    assert _state() == defaults
    with precision.tf32(False):
        _all_off(precision.tf32_settings())
    assert _state() == defaults


def test_fp32_reference_refuses_when_a_switch_stays_on(monkeypatch):
    """A reference block that left TF32 on (the old notebook computed the reference outside any block) fails."""
    monkeypatch.setattr(precision, "tf32", lambda enabled=True: contextlib.nullcontext())
    with pytest.raises(RuntimeError, match="cudnn.allow_tf32"), precision.fp32_reference():
        pass


def test_reduced_precision_switches():
    assert precision.reduced_precision_switches({"float32_matmul_precision": "highest", "cudnn.allow_tf32": False,
                                                 "cudnn.conv.fp32_precision": "ieee",
                                                 "mkldnn.matmul.fp32_precision": "none"}) == []
    assert precision.reduced_precision_switches({"float32_matmul_precision": "medium", "cudnn.allow_tf32": True,
                                                 "cudnn.conv.fp32_precision": "tf32",
                                                 "mkldnn.matmul.fp32_precision": "bf16",
                                                 "cuda.matmul.allow_tf32": "unreadable: mixed APIs"}) == [
        "float32_matmul_precision", "cudnn.allow_tf32", "cudnn.conv.fp32_precision", "mkldnn.matmul.fp32_precision",
        "cuda.matmul.allow_tf32"]


# --- notebook 01's recipe and its helpers -------------------------------------------------------------------------

@needs_new_api
def test_the_recipe_switches_turn_tf32_on_and_put_back_every_switch(defaults):
    """Notebook 01's visible cell: the torch >= 2.9 switches on, then the two leaves restored; nothing else moves."""
    before = (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision)
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    torch.backends.cudnn.conv.fp32_precision = "tf32"
    on = precision.reduced_precision_switches(precision.tf32_settings())
    assert {"cuda.matmul.fp32_precision", "cudnn.conv.fp32_precision"} <= set(on)
    torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision = before
    assert _state() == defaults


def test_kept_in_fp32_lists_the_fp32_parameters_of_a_16_bit_pipeline():
    half, kept = torch.nn.Linear(3, 2).half(), torch.nn.Linear(2, 2)
    pipe = types.SimpleNamespace(components={"text_encoder": torch.nn.Sequential(half, kept), "tokenizer": object()})
    assert precision.kept_in_fp32(pipe) == {"text_encoder.1.weight": 4, "text_encoder.1.bias": 2}
    kept.half()
    assert precision.kept_in_fp32(pipe) == {}


def test_each_notice_once_passes_the_first_and_drops_the_repeats(capsys):
    logger = logging.getLogger("diffusers.models.modeling_utils")
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logger.addHandler(handler)
    shown: list[str] = []
    notice = "There are modules in AutoencoderKL that should be kept in float32: ['x']."
    empty = "There are modules in FluxTransformer2DModel that should be kept in float32: []."
    future = "`upcast_vae` is deprecated and will be removed in version 1.0.0."
    try:
        with warnings.catch_warnings():
            warnings.showwarning = lambda message, *args, **kwargs: shown.append(str(message))
            with precision.each_notice_once():
                for _ in range(3):
                    logger.warning(notice)
                    logger.warning(empty)  # names no module: dropped every time
                    logger.warning("another notice")
                    with warnings.catch_warnings():  # as the profiler's blocks in helpers.measure do
                        warnings.warn(future, FutureWarning, stacklevel=1)
            logger.warning(notice)  # the filter is gone after the block
    finally:
        logger.removeHandler(handler)
    assert records.count(notice) == 2 and records.count("another notice") == 3 and empty not in records
    assert shown == [] and capsys.readouterr().out.count(precision.UPCAST_VAE_NOTE) == 1  # said once, as what it is


def test_first_only_can_fail():
    """The filter really decides: a second record with the text is dropped, one without passes."""
    once = precision.FirstOnly("kept in float32")
    make = lambda msg: logging.LogRecord("x", logging.WARNING, __file__, 1, msg, None, None)
    assert [once.filter(make(m)) for m in ("kept in float32", "kept in float32", "other")] == [True, False, True]
    assert not precision.FirstOnly("kept in float32").filter(make("kept in float32: []")), "an empty list passes"


@pytest.fixture(scope="module")
def smoke_flux():
    """A tiny Flux pipeline with random weights in fp32, and a smoke Run for it."""
    from diffusers import FluxPipeline

    from helpers import params, pipelines
    run = params.resolve("01_dtype", PROFILE="smoke", WEIGHTS="random", DTYPE="fp32")
    pipe = FluxPipeline(**pipelines.random_components("flux-dev", "smoke", dtype=torch.float32, seed=0))
    pipe.set_progress_bar_config(disable=True)
    return pipe, run


def test_probe_denoiser_compares_formats_on_the_reference_inputs(smoke_flux):
    from diffusers import FluxPipeline

    from helpers import pipelines
    pipe, run = smoke_flux
    ref = precision.probe_denoiser(pipe, run, 4.0)
    assert not torch.equal(ref.out, ref.exact_out), "Flux embeds the guidance: 3.5 and 4.0 give different outputs"
    again = precision.probe_denoiser(pipe, run, 4.0, like=ref)
    assert torch.equal(again.out, ref.out) and torch.equal(again.exact_out, ref.exact_out)
    bf16 = FluxPipeline(**pipelines.random_components("flux-dev", "smoke", dtype=torch.bfloat16, seed=0))
    probe = precision.probe_denoiser(bf16, run, 4.0, like=ref)
    assert probe.inputs["hidden_states"].dtype == torch.bfloat16
    assert torch.equal(probe.inputs["hidden_states"], ref.inputs["hidden_states"].bfloat16()), "same values, rounded"
    assert 0 < precision.drift(probe.exact_out, ref.exact_out).rel_l2 < 25 * precision.unit_roundoff("bf16")


def test_measure_format_times_and_profiles_on_a_cpu(smoke_flux):
    pipe, run = smoke_flux
    s = run.settings
    generate = lambda p: p(prompt="a seven", height=s.height, width=s.width, num_inference_steps=1,
                           output_type="np", max_sequence_length=s.max_sequence_length).images
    with precision.fp32_reference():
        m = precision.measure_format(pipe, run, generate, precision.probe_denoiser(pipe, run, 4.0))
    assert m.step.median_s > 0 and len(m.pipeline.samples_s) == s.repeats and m.memory.peak_bytes > 0
    assert m.images.shape == (1, s.height, s.width, 3) and m.switches == []
    assert m.allocations and m.cpu_seconds and all(v > 0 for v in m.cpu_seconds.values())


@pytest.mark.parametrize("model", ["flux-dev", "sdxl"])
def test_initial_noise_is_the_generators_fp32_draw_rounded_to_each_format(model):
    """In fp32 the drawn noise makes the generator's image exactly; in bf16 it is that noise rounded, whatever a CPU
    generator draws for bf16 values on this torch (another sequence before torch 2.13); another seed differs."""
    from diffusers import FluxPipeline, StableDiffusionXLPipeline

    from helpers import pipelines
    Pipeline = {"flux-dev": FluxPipeline, "sdxl": StableDiffusionXLPipeline}[model]
    call = {"prompt": "a seven", "height": 64, "width": 64, "num_inference_steps": 1, "output_type": "np"}
    pipe = Pipeline(**pipelines.random_components(model, "smoke", dtype=torch.float32, seed=0))
    pipe.set_progress_bar_config(disable=True)
    noise = precision.initial_noise(pipe, 64, 64, seed=3, batch=2)
    with_generator = pipe(**call, num_images_per_prompt=2, generator=torch.Generator("cpu").manual_seed(3)).images
    assert (pipe(**call, num_images_per_prompt=2, latents=noise).images == with_generator).all()
    assert not torch.equal(precision.initial_noise(pipe, 64, 64, seed=4, batch=2), noise)  # planted: another seed
    half = Pipeline(**pipelines.random_components(model, "smoke", dtype=torch.bfloat16, seed=0))
    rounded_noise = precision.initial_noise(half, 64, 64, seed=3, batch=2)
    assert rounded_noise.dtype == torch.bfloat16 and torch.equal(rounded_noise, noise.bfloat16())
