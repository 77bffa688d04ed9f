"""helpers.pipelines: real model sizes, smoke pipelines end to end, seeded weights, save/load, tokenizers."""

from __future__ import annotations

import importlib.util
import json
from typing import ClassVar

import psutil
import pytest
import torch
from diffusers import FluxPipeline
from transformers import CLIPTokenizer, PreTrainedTokenizerFast, Qwen2Tokenizer, T5TokenizerFast

from helpers import compile_tools, paths, pipelines, workloads

# Published sizes of the real components (parameters).
PUBLISHED = {
    ("flux-dev", "transformer"): 11.9e9,
    ("flux-dev", "text_encoder"): 123e6,      # CLIP ViT-L/14 text tower
    ("flux-dev", "text_encoder_2"): 4.76e9,   # T5 v1.1 XXL encoder
    ("flux-dev", "vae"): 84e6,
    ("sdxl", "unet"): 2.57e9,
    ("sdxl", "text_encoder"): 123e6,
    ("sdxl", "text_encoder_2"): 695e6,        # OpenCLIP ViT-bigG/14 text tower with projection
    ("sdxl", "vae"): 83.7e6,
    ("flux2-dev", "transformer"): 32.2e9,     # FLUX.2 [dev]
    ("flux2-dev", "text_encoder"): 24.0e9,    # Mistral Small 3.1 24B (with its Pixtral vision tower)
    ("qwen-image", "transformer"): 20.4e9,    # Qwen-Image
    ("qwen-image", "text_encoder"): 8.29e9,   # Qwen2.5-VL 7B (with its vision tower)
}
FLUX_KW = {"max_sequence_length": 32}
PIPELINE_NAMES = {"flux-dev": "FluxPipeline", "sdxl": "StableDiffusionXLPipeline", "flux2-dev": "Flux2Pipeline",
                  "qwen-image": "QwenImagePipeline"}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _kwargs(model: str) -> dict:
    """The per-model pipeline call arguments: Flux's text length, FLUX.2's (its chat with the system message) and
    the guidance denoiser_inputs defaults to, Qwen-Image without true CFG (no negative prompt: one transformer call
    per step)."""
    return {"flux-dev": FLUX_KW, "flux2-dev": {"max_sequence_length": 64, "guidance_scale": 3.5},
            "qwen-image": {"true_cfg_scale": 1.0}}.get(model, {})


def _input_kwargs(model: str) -> dict:
    """The same text length for pipelines.denoiser_inputs."""
    return {k: v for k, v in _kwargs(model).items() if k == "max_sequence_length"}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from two threads, and on a busy 2-core machine OpenMP waits dominate."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def smoke_fp32() -> dict:
    """One fp32 smoke pipeline per model, shared by the read-only tests."""
    return {m: pipelines.build_pipeline(m, "smoke", dtype=torch.float32) for m in pipelines.MODELS}


@pytest.mark.parametrize("model", pipelines.MODELS)
def test_full_parameter_counts_match_published_sizes(model):
    counts = pipelines.count_parameters(model, "full")
    assert next(iter(counts)) == pipelines.DENOISER[model]
    for (m, component), published in PUBLISHED.items():
        if m == model:
            assert counts[component] == pytest.approx(published, rel=0.01), component


def test_counting_full_size_allocates_nothing():
    rss = psutil.Process().memory_info().rss
    counts = pipelines.count_parameters("flux-dev", "full")
    grew = psutil.Process().memory_info().rss - rss
    assert sum(counts.values()) > 16e9  # 64 GiB in fp32 if it were real
    assert grew < 2**30, f"counting grew the process by {grew / 2**30:.1f} GiB"
    built = pipelines._build_models("flux-dev", "full", torch.device("meta"), torch.float32)
    assert all(p.is_meta for module in built.values() for p in module.parameters())


@pytest.mark.parametrize("model", pipelines.MODELS)
def test_smoke_configs_keep_classes_and_block_structure(model):
    for component in pipelines._MODEL_CLASSES[model]:
        full, smoke = (json.loads((pipelines.config_dir(model, p) / component / "config.json").read_text())
                       for p in ("full", "smoke"))
        assert full.get("_class_name") == smoke.get("_class_name")
        assert full.get("architectures") == smoke.get("architectures")
        for key in ("down_block_types", "up_block_types", "mid_block_type", "latent_channels", "in_channels"):
            assert full.get(key) == smoke.get(key), (component, key)
    smoke_dir = pipelines.config_dir(model, "smoke")
    full_dir = pipelines.config_dir(model, "full")
    assert (smoke_dir / "scheduler" / "scheduler_config.json").read_text() == \
        (full_dir / "scheduler" / "scheduler_config.json").read_text()
    if model != "sdxl":
        for profile in ("smoke", "full"):
            t = json.loads((pipelines.config_dir(model, profile) / "transformer" / "config.json").read_text())
            assert sum(t["axes_dims_rope"]) == t["attention_head_dim"], (model, profile)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("model", pipelines.MODELS)
def test_smoke_pipeline_runs_end_to_end(model, dtype):
    pipe = pipelines.build_pipeline(model, "smoke", dtype=DTYPES[dtype], seed=0)
    assert type(pipe).__name__ == PIPELINE_NAMES[model]
    assert all(not m.training for m in pipe.components.values() if isinstance(m, torch.nn.Module))
    assert {p.dtype for p in pipelines.denoiser(pipe).parameters()} == {DTYPES[dtype]}
    pipe.set_progress_bar_config(disable=True)
    image = pipe(prompt="a red fox in the snow", height=128, width=128, num_inference_steps=2, output_type="np",
                 generator=torch.Generator().manual_seed(0), **_kwargs(model)).images
    assert image.shape == (1, 128, 128, 3)
    assert torch.isfinite(torch.from_numpy(image)).all()
    assert image.std() > 0


@pytest.mark.parametrize("model", pipelines.MODELS)
def test_same_seed_same_weights_other_seed_other_weights(model):
    def weights(seed: int, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
        pipe = pipelines.build_pipeline(model, "smoke", dtype=dtype, seed=seed)
        return {f"{name}.{k}": v for name, m in pipe.components.items() if isinstance(m, torch.nn.Module)
                for k, v in m.state_dict().items()}

    a, b, c = weights(0), weights(0), weights(1)
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # Qwen-Image's VAE keeps its RMS norms' scales (`gamma`) as (C, 1, 1, 1): norm weights, set to 1 by any seed
    matrices = [k for k in a if a[k].ndim >= 2 and not k.endswith(".gamma")]
    assert all(not torch.equal(a[k], c[k]) for k in matrices)
    half = weights(0, torch.bfloat16)  # the same draw, rounded: builds in different dtypes agree
    assert all(torch.equal(a[k].to(half[k].dtype), half[k]) for k in matrices)


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("model", pipelines.MODELS)
def test_denoiser_forward_on_denoiser_inputs(model, dtype):
    pipe = pipelines.build_pipeline(model, "smoke", dtype=DTYPES[dtype])
    inputs = pipelines.denoiser_inputs(pipe, height=128, width=128, max_sequence_length=32, guidance=3.5)
    assert inputs["return_dict"] is False
    with torch.no_grad():
        out = pipelines.denoiser(pipe)(**inputs)[0]
    if model == "flux2-dev":  # 128 px -> 16x16 latents of 32 channels -> 8x8 tokens of 2x2 patches (128 features)
        assert inputs["hidden_states"].shape == (1, 64, 128) and inputs["encoder_hidden_states"].shape == (1, 32, 96)
        assert inputs["img_ids"].shape == (1, 64, 4) and inputs["txt_ids"].shape == (1, 32, 4)
        assert out.shape == inputs["hidden_states"].shape
    elif model == "qwen-image":  # the prompt's own length after the template's 34 tokens
        assert inputs["hidden_states"].shape == (1, 64, 64) and inputs["img_shapes"] == [[(1, 8, 8)]]
        assert inputs["encoder_hidden_states"].shape[2] == 32 and inputs["guidance"] is None
        assert out.shape == inputs["hidden_states"].shape
    elif model == "flux-dev":
        assert inputs["hidden_states"].shape == (1, 64, 64)  # 128 px -> 16x16 latents -> 8x8 packed 2x2 patches
        assert inputs["encoder_hidden_states"].shape == (1, 32, 32)
        assert inputs["img_ids"].shape == (64, 3) and inputs["txt_ids"].shape == (32, 3)
        assert out.shape == inputs["hidden_states"].shape
    else:
        assert inputs["sample"].shape == (2, 4, 16, 16)  # guidance 3.5 -> classifier-free batch of 2
        assert inputs["added_cond_kwargs"]["time_ids"].shape == (2, 6)
        assert inputs["encoder_hidden_states"].shape == (2, 77, 80)
        assert out.shape == inputs["sample"].shape
    assert out.dtype == DTYPES[dtype]
    assert torch.isfinite(out).all()
    floats = {k: v for k, v in [*inputs.items(), *inputs.get("added_cond_kwargs", {}).items()]
              if isinstance(v, torch.Tensor) and v.is_floating_point()}
    if model == "sdxl":  # the pipeline hands the UNet the scheduler's fp32 timestep (946 is 944 in bf16)
        assert floats.pop("timestep").dtype == torch.float32
    elif model != "qwen-image":  # Flux pipelines build guidance in fp32; the transformer casts it (3.5 * 1000 is 3504)
        assert floats.pop("guidance").dtype == torch.float32
    assert {k: v.dtype for k, v in floats.items()} == {k: DTYPES[dtype] for k in floats}


def test_denoiser_inputs_batch_and_text_length(smoke_fp32):
    flux = pipelines.denoiser_inputs(smoke_fp32["flux-dev"], height=256, width=128, max_sequence_length=64,
                                     batch_size=2)
    assert flux["hidden_states"].shape == (2, 128, 64) and flux["encoder_hidden_states"].shape == (2, 64, 32)
    sdxl = pipelines.denoiser_inputs(smoke_fp32["sdxl"], height=128, width=128, batch_size=3, guidance=1.0)
    assert sdxl["sample"].shape == (3, 4, 16, 16)  # guidance 1: no classifier-free doubling


def _describe(value: object) -> object:
    """What dynamo guards on for one argument: tensor metadata, recursively through dicts; other values as is."""
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.stride(), value.dtype, value.device, value.requires_grad,
                value.is_inference())
    if isinstance(value, dict):
        return {k: _describe(v) for k, v in value.items()}
    return value


def _first_denoiser_call(pipe, model: str, batch_size: int) -> dict:
    """The arguments the pipeline's own first denoiser call gets (SDXL's positional sample, timestep by name)."""
    net, seen = pipelines.denoiser(pipe), []

    def spy(*args, **kwargs):
        seen.append({**dict(zip(("sample", "timestep"), args)), **kwargs})
        raise StopIteration  # one call is all we need

    net.forward = spy
    pipe.set_progress_bar_config(disable=True)
    try:
        with torch.inference_mode(), pytest.raises(StopIteration):  # as workloads.pipeline_call runs it
            pipe(prompt=[pipelines.PROMPT] * batch_size, height=128, width=128, num_inference_steps=2,
                 output_type="latent", **_kwargs(model))
    finally:
        del net.forward
    return seen[0]


@pytest.mark.parametrize(("model", "batch_size"), [("flux-dev", 1), ("flux-dev", 2), ("sdxl", 1), ("flux2-dev", 1),
                                                   ("qwen-image", 1)])
def test_denoiser_inputs_are_what_the_pipeline_passes(model, batch_size):
    """Same keys in the same order, and every tensor with the pipeline's dtype, shape, strides and tensor kind
    (Flux's guidance is the pipeline's fp32 `full([1]).expand(batch)`: stride 0 for a batch of 2)."""
    pipe = pipelines.build_pipeline(model, "smoke", dtype=torch.bfloat16)
    passed = _first_denoiser_call(pipe, model, batch_size)
    ours = pipelines.denoiser_inputs(pipe, height=128, width=128, batch_size=batch_size, **_input_kwargs(model))
    assert list(ours) == list(passed)
    assert _describe(ours) == _describe(passed)
    if model in ("flux-dev", "flux2-dev"):
        assert ours["guidance"].stride() == ((0,) if batch_size > 1 else (1,))
        assert torch.equal(ours["timestep"], passed["timestep"])  # sigma 1 at the first step
        assert torch.equal(ours["guidance"], passed["guidance"])


@pytest.mark.parametrize("model", pipelines.MODELS)
def test_denoiser_compiled_on_denoiser_inputs_serves_the_pipeline_without_recompiling(model):
    """Compile (dynamo only: backend eager) on workloads.denoiser_call(denoiser_inputs), then run the pipeline:
    no new graph (SDXL's pipeline passes sample and timestep positionally, and denoiser_call does too)."""
    pipe = pipelines.build_pipeline(model, "smoke", dtype=torch.bfloat16)
    pipe.set_progress_bar_config(disable=True)
    net = pipelines.denoiser(pipe)
    step = workloads.denoiser_call(pipe, pipelines.denoiser_inputs(pipe, height=128, width=128,
                                                                   **_input_kwargs(model)))
    compile_tools.reset()
    net.compile(fullgraph=True, backend="eager")
    try:
        with torch.inference_mode():
            with compile_tools.counting() as first:
                step()
            with compile_tools.counting() as later, compile_tools.error_on_recompile():
                pipe(prompt=pipelines.PROMPT, height=128, width=128, num_inference_steps=2, output_type="latent",
                     **_kwargs(model))
    finally:
        compile_tools.uncompile(net)
        compile_tools.reset()
    assert first.graphs == 1 and first.graph_breaks == 0
    assert later.graphs == 0


@pytest.mark.parametrize("model", pipelines.MODELS)
def test_save_and_reload_through_weights_folder(model, smoke_fp32, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    pipe = smoke_fp32[model]
    pipe.save_pretrained(tmp_path)
    again = pipelines.build_pipeline(model, "smoke", weights=str(tmp_path), dtype=torch.float32)
    assert type(again) is type(pipe)
    inputs = pipelines.denoiser_inputs(pipe, height=128, width=128, max_sequence_length=32)
    inputs_again = pipelines.denoiser_inputs(again, height=128, width=128, max_sequence_length=32)
    net, net_again = pipelines.denoiser(pipe), pipelines.denoiser(again)
    weights, weights_again = net.state_dict(), net_again.state_dict()
    assert weights.keys() == weights_again.keys()
    assert all(torch.equal(weights[k], weights_again[k]) for k in weights), "the saved weights come back unchanged"
    with torch.no_grad():
        out = net(**inputs)[0]
        out_again = net_again(**inputs)[0]
        # from_pretrained maps the safetensors file, so a reloaded weight may start off a 64-byte boundary; on
        # some CPUs (AVX2-only) the fp32 kernels then add in another order and the last bits differ. Equal
        # within fp32 rounding as loaded, and bit for bit once the weights are copied to aligned memory.
        torch.testing.assert_close(out_again, out, rtol=1e-5, atol=1e-5)
        for p in net_again.parameters():
            p.data = p.data.clone()
        assert torch.equal(out, net_again(**inputs)[0])
    for key, value in inputs.items():  # the reloaded text encoders and tokenizers encode identically
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, inputs_again[key]), key


def test_weights_and_choices_are_validated(tmp_path):
    with pytest.raises(ValueError, match=r"WEIGHTS=.*not an existing folder.*'auto'.*'random'.*folder.*hub id"):
        pipelines.build_pipeline("flux-dev", "smoke", weights=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="WEIGHTS"):
        pipelines.build_pipeline("flux-dev", "smoke", weights="./models/flux")
    with pytest.raises(ValueError, match="MODEL='sd15'.*'flux-dev', 'sdxl'"):
        pipelines.build_pipeline("sd15", "smoke")
    with pytest.raises(ValueError, match="PROFILE='auto'.*'smoke', 'full'"):
        pipelines.build_pipeline("sdxl", "auto")
    with pytest.raises(ValueError, match="'smoke', 'full'"):
        pipelines.count_parameters("sdxl", "tiny")
    with pytest.raises(ValueError, match="dtype"):
        pipelines.build_pipeline("sdxl", "smoke", dtype=torch.int8)
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionXLPipeline"}))
    with pytest.raises(ValueError, match="StableDiffusionXLPipeline.*FluxPipeline"):
        pipelines.build_pipeline("flux-dev", "smoke", weights=str(tmp_path))


def test_hub_id_goes_through_from_pretrained(monkeypatch):
    calls = []

    class Loaded:
        components: ClassVar[dict] = {}

        def to(self, device):
            calls.append(("to", device))
            return self

    def fake_from_pretrained(name, **kwargs):
        calls.append((name, kwargs))
        return Loaded()

    monkeypatch.setattr(FluxPipeline, "from_pretrained", fake_from_pretrained)
    pipelines.build_pipeline("flux-dev", "full", weights="black-forest-labs/FLUX.1-dev", dtype=torch.bfloat16)
    assert calls == [("black-forest-labs/FLUX.1-dev", {"dtype": torch.bfloat16}),
                     ("to", torch.device("cpu"))]


def test_tokenizers_load_offline_and_round_trip():
    clip = CLIPTokenizer.from_pretrained(paths.DATA_DIR / "tokenizers" / "clip")
    t5 = T5TokenizerFast.from_pretrained(paths.DATA_DIR / "tokenizers" / "t5")
    assert (clip.model_max_length, t5.model_max_length) == (77, 512)
    prompt = "a photo of a cat holding a sign that says hello"
    for tok in (clip, t5):
        ids = tok(prompt).input_ids
        assert tok.decode(ids, skip_special_tokens=True) == prompt
        assert ids[-1] == tok.eos_token_id
    assert clip(prompt).input_ids[0] == clip.bos_token_id
    assert clip.eos_token_id == len(clip) - 1  # CLIP pools at the argmax id with the legacy eos_token_id=2
    assert (t5.pad_token_id, t5.eos_token_id, t5.unk_token_id) == (0, 1, 2)
    padded = t5([prompt], padding="max_length", max_length=512, truncation=True, return_tensors="pt").input_ids
    assert padded.shape == (1, 512) and int(padded[0, -1]) == t5.pad_token_id
    for model, profile in [(m, p) for m in ("flux-dev", "sdxl") for p in pipelines.PROFILES]:
        for encoder, tok in (("text_encoder", clip), ("text_encoder_2", t5 if model == "flux-dev" else clip)):
            config = json.loads((pipelines.config_dir(model, profile) / encoder / "config.json").read_text())
            assert len(tok) <= config["vocab_size"], (model, profile, encoder)


def test_byte_level_tokenizers_keep_the_pipelines_templates():
    """Qwen2's and Mistral's tokenizers: every id fits the text encoders' vocabularies; Qwen-Image's template prefix is
    the 34 tokens QwenImagePipeline drops (as with Qwen's own tokenizer); FLUX.2's chat puts the system message and
    the prompt between Mistral's control tokens and pads to the length asked."""
    from diffusers.pipelines.flux2.pipeline_flux2 import format_input

    qwen = Qwen2Tokenizer.from_pretrained(paths.DATA_DIR / "tokenizers" / "qwen2")
    mistral = PreTrainedTokenizerFast.from_pretrained(paths.DATA_DIR / "tokenizers" / "mistral3")
    for model, tok in (("qwen-image", qwen), ("flux2-dev", mistral)):
        for profile in pipelines.PROFILES:
            config = json.loads((pipelines.config_dir(model, profile) / "text_encoder" / "config.json").read_text())
            assert len(tok) <= config["text_config"]["vocab_size"], (model, profile)
    pipe = pipelines.build_pipeline("qwen-image", "smoke", dtype=torch.float32)
    prefix = pipe.prompt_template_encode.split("{}")[0]
    assert len(qwen(prefix).input_ids) == pipe.prompt_template_encode_start_idx == 34
    chat = mistral.apply_chat_template(format_input(["a photo of a cat"]), tokenize=True, return_dict=True,
                                       padding="max_length", truncation=True, max_length=64, return_tensors="pt")
    ids = chat["input_ids"][0].tolist()
    assert len(ids) == 64 and ids[0] == mistral.bos_token_id and ids[-1] == mistral.pad_token_id
    names = mistral.convert_ids_to_tokens(ids)
    assert names[1] == "[SYSTEM_PROMPT]" and "[/SYSTEM_PROMPT]" in names and "[INST]" in names and "[/INST]" in names


def test_flux_encode_prompt_truncates_long_prompts(smoke_fp32):
    pipe = smoke_fp32["flux-dev"]
    long_prompt = "a photo of a cat holding a sign in a quiet cafe, " * 20
    embeds, pooled, text_ids = pipe.encode_prompt(long_prompt, None, max_sequence_length=16)
    assert embeds.shape == (1, 16, 32) and pooled.shape == (1, 32) and text_ids.shape == (16, 3)


def test_shipped_tokenizers_match_a_fresh_build(tmp_path):
    spec = importlib.util.spec_from_file_location("build_tokenizers", paths.ROOT / "tools" / "build_tokenizers.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    build.build(tmp_path)
    for name in build.TOKENIZERS:
        assert build.same_tree(tmp_path / name, paths.DATA_DIR / "tokenizers" / name), name


@pytest.mark.parametrize("model", pipelines.MODELS)
def test_bf16_build_computes_what_fp32_build_computes(model, smoke_fp32):
    """Same seed, different dtype: the same weights rounded, so the denoiser agrees to bf16 precision (the
    random time embeddings are smooth in t, so bf16 rounding of t * 1000 does not change the output)."""
    half = pipelines.build_pipeline(model, "smoke", dtype=torch.bfloat16)
    with torch.no_grad():
        ref = pipelines.denoiser(smoke_fp32[model])(
            **pipelines.denoiser_inputs(smoke_fp32[model], height=128, width=128, max_sequence_length=32))[0]
        out = pipelines.denoiser(half)(
            **pipelines.denoiser_inputs(half, height=128, width=128, max_sequence_length=32))[0]
    # bf16 keeps 8 significand bits (unit roundoff u = 2^-8); the weights, the activations and every op's output
    # are rounded once each, so a few tens of roundings accumulate: 25u in relative L2, the bound notebook 01
    # uses for 16-bit formats (the old max-norm < 0.05 x max|ref| had no stated basis)
    drift = float((out.float() - ref).norm() / ref.norm())
    assert 0 < drift < 25 * 2**-8, drift


def test_denoiser_config_overrides_depth_only_for_random_weights(tmp_path):
    pipe = pipelines.build_pipeline("flux-dev", "smoke", dtype=torch.float32,
                                    denoiser_config={"num_layers": 3, "num_single_layers": 5})
    assert len(pipe.transformer.transformer_blocks) == 3 and len(pipe.transformer.single_transformer_blocks) == 5
    assert pipe.transformer.config.attention_head_dim == 16  # everything else as shipped
    assert pipelines.flux_depth("full") == [19, 38] and pipelines.flux_depth("smoke") == [2, 4]
    with pytest.raises(ValueError, match=r"denoiser_config: \['num_layer'\] are not fields.*num_layers"):
        pipelines.build_pipeline("flux-dev", "smoke", denoiser_config={"num_layer": 3})
    with pytest.raises(ValueError, match="needs WEIGHTS='random'"):
        pipelines.build_pipeline("flux-dev", "smoke", weights=str(tmp_path), denoiser_config={"num_layers": 3})


def test_random_weights_are_drawn_on_the_gpu_wherever_the_module_lives(monkeypatch):
    """A pipeline kept in CPU memory on a GPU machine (08 and 09 on a small card) draws on the GPU: the weights of a
    GPU build, in seconds; without a GPU it draws where it lives."""
    from helpers import pipelines

    assert pipelines._draw_device(torch.device("cpu")) == torch.device("cpu")  # this machine: no CUDA
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # planted: a GPU machine
    assert pipelines._draw_device(torch.device("cpu")) == torch.device("cuda")
    assert pipelines._draw_device(torch.device("cuda", 1)) == torch.device("cuda", 1)
