"""Full-size dry run of Flux-1-Dev without its memory: sizes, sequence lengths and GPU fit of the full profile.

Every full-profile component is built from `data/configs/flux-dev/full/` as `helpers.pipelines` builds it, on
PyTorch's `meta` device (shapes and dtypes, no storage) for the counts and bytes, and under
`torch._subclasses.fake_tensor.FakeTensorMode` for one real forward of the 11.9B-parameter DiT at 1024x1024:
4096 image tokens + 512 text tokens, batch 1, bf16. Fake tensors carry shape, dtype and device and run every
op's shape rule, so the forward goes through diffusers' real code path (RoPE, attention dispatch, all 57 blocks)
and allocates nothing; on a 2-core CPU it takes a few seconds (printed). The inputs are made the way
`pipelines.denoiser_inputs` makes them, with one change: its FlowMatchEulerDiscreteScheduler cannot be built
under FakeTensorMode (its __init__ calls `self.sigmas[-1].item()`, a data-dependent op a fake tensor refuses
with DataDependentOutputException), so the first timestep is computed by a real scheduler outside the fake
mode; the prompt embeddings and packed latents come from the pipeline's own `encode_prompt` and
`prepare_latents` under it.

The fit checks use `helpers.footprint`: weight bytes per component (bf16, fp32, NF4 with the layout
bitsandbytes gives notebook 09's BitsAndBytesConfig, checked byte for byte against real NF4 loads of the smoke models), and
the weights each notebook's full scenarios hold on the GPU at once, each of which must leave >= 10 GiB of a
78 GiB H100 free. Every check has a planted wrong input that makes it fail.
"""

import time

import numpy as np
import psutil
import pytest
import torch
from diffusers import FluxPipeline
from diffusers.pipelines.flux.pipeline_flux import calculate_shift, retrieve_timesteps
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from helpers import footprint, pipelines, quantize
from helpers.params import PROFILE_SETTINGS
from tests.test_offload_quantize import NF4, load_nf4

FULL = PROFILE_SETTINGS["full"]
# Published sizes (data/configs/README.md): DiT 11.90 B, CLIP-L 123.1 M, T5-XXL encoder 4.762 B, VAE 83.8 M.
BANDS = {"transformer": (11.85e9, 11.95e9), "text_encoder": (120e6, 126e6),
         "text_encoder_2": (4.7e9, 4.8e9), "vae": (82e6, 86e6)}
EXPECTED_IMAGE_TOKENS, EXPECTED_TEXT_TOKENS = 4096, 512  # (1024 / 8 / 2)^2 and T5's max_sequence_length
QUANTIZED = ("transformer", "text_encoder_2")


def _config(component: str) -> dict:
    """The shipped full-profile config of a Flux component."""
    cls = pipelines._MODEL_CLASSES["flux-dev"][component]
    return dict(cls.load_config(pipelines.config_dir("flux-dev", "full") / component))


@pytest.fixture(scope="module")
def sizes() -> dict:
    """Counts and bytes of every full-profile component, from meta models: fp32 as built, then cast to bf16."""
    rss = psutil.Process().memory_info().rss
    components = footprint.meta_components("flux-dev", "full", torch.float32)
    out = {"counts": footprint.parameter_counts(components),
           "param_bytes_fp32": {n: sum(p.numel() * p.element_size() for p in m.parameters())
                                for n, m in components.items()},
           "fp32": footprint.component_bytes(components, torch.float32),
           "bf16": footprint.component_bytes(components, torch.bfloat16)}
    out["param_bytes_bf16"] = {n: sum(p.numel() * p.element_size() for p in m.parameters())
                               for n, m in components.items()}
    out["nf4"] = {n: footprint.nf4_bytes(components[n]) for n in QUANTIZED}
    out["all_meta"] = all(t.is_meta for m in components.values() for t in [*m.parameters(), *m.buffers()])
    out["rss_growth"] = psutil.Process().memory_info().rss - rss
    return out


def test_full_parameter_counts(sizes):
    assert sizes["all_meta"] and sizes["rss_growth"] < 2**30, f"grew {sizes['rss_growth'] / 2**30:.2f} GiB"
    for name, count in sizes["counts"].items():
        print(f"{name}: {count:,} parameters")
        footprint.check_band(f"{name} parameters", count, *BANDS[name])


def test_planted_wrong_counts_fail(sizes):
    counts = sizes["counts"]
    # T5 with its embedding counted twice (untied: 4.894 B), the DiT halved, CLIP counted in bytes (fp32)
    planted = {"text_encoder_2": counts["text_encoder_2"] + 32128 * 4096, "transformer": counts["transformer"] / 2,
               "text_encoder": 4 * counts["text_encoder"]}
    for name, value in planted.items():
        with pytest.raises(ValueError, match="outside"):
            footprint.check_band(f"{name} parameters", value, *BANDS[name])


def test_bf16_and_fp32_weight_bytes(sizes):
    for name, count in sizes["counts"].items():
        bf16, fp32 = sizes["param_bytes_bf16"][name], sizes["param_bytes_fp32"][name]
        print(f"{name}: bf16 {bf16:,} B ({bf16 / 2**30:.3f} GiB), fp32 {fp32:,} B ({fp32 / 2**30:.3f} GiB); "
              f"with buffers bf16 {sizes['bf16'][name]:,} B")
        assert bf16 == 2 * count and fp32 == 4 * count, name
        assert 0 <= sizes["bf16"][name] - bf16 < 2**20, f"{name}: buffers should be tiny"
    total = sum(sizes["bf16"].values())
    print(f"whole pipeline in bf16: {total:,} B = {total / 1e9:.2f} GB = {total / 2**30:.2f} GiB")
    assert 33e9 < total < 34e9, "the published bf16 Flux-1-Dev pipeline takes about 33 GB"
    footprint.check_band("DiT bf16 bytes", sizes["bf16"]["transformer"], 23.7e9, 23.9e9)


def test_nf4_layout_matches_real_quantizers_on_smoke(tmp_path):
    """footprint.nf4_bytes predicts, byte for byte, what diffusers' and transformers' NF4 loads hold (smoke)."""
    assert "bnb_4bit_use_double_quant" not in NF4, "nested quantization changes the scale bytes footprint counts"
    pipe = pipelines.build_pipeline("flux-dev", "smoke", dtype=torch.bfloat16)
    for name in QUANTIZED:
        bf16 = getattr(pipe, name)
        bf16.save_pretrained(tmp_path / name)
        nf4 = load_nf4(type(bf16), tmp_path / name)  # notebook 09's recipe, as its unit tests run it
        predicted, real = footprint.nf4_bytes(bf16), quantize.footprint_bytes(nf4)
        assert predicted["total_bytes"] == real["total_bytes"], (name, predicted, real)
        assert predicted["scale_bytes"] == quantize.linear4bit_bytes(nf4)["scale_bytes"], name
        assert footprint.nf4_kept_linears(bf16) == quantize.unquantized_linear_names(nf4), name
        assert {p.quant_state.blocksize for p in nf4.parameters()
                if getattr(p, "quant_state", None) is not None} == {footprint.NF4_BLOCKSIZE}
        # planted wrong layouts no longer match: one scale per 128 weights; T5's `wo` layers converted too
        assert predicted["total_bytes"] - predicted["scale_bytes"] // 2 != real["total_bytes"]
        if name == "text_encoder_2":
            assert footprint.nf4_bytes(bf16, kept=[])["total_bytes"] != real["total_bytes"]


def test_full_nf4_bytes(sizes):
    for name in QUANTIZED:
        nf4, bf16 = sizes["nf4"][name], sizes["bf16"][name]
        print(f"{name} NF4: {nf4['total_bytes']:,} B ({nf4['total_bytes'] / 2**30:.3f} GiB) = {nf4['nf4_layers']} "
              f"NF4 layers ({nf4['packed_bytes']:,} B codes + {nf4['scale_bytes']:,} B scales + "
              f"{nf4['code_book_bytes']:,} B code books) + {nf4['other_bytes']:,} B kept in bf16 "
              f"({nf4['kept_layers']} linear layers kept); {nf4['total_bytes'] / bf16:.3f} of bf16")
    dit, t5 = sizes["nf4"]["transformer"], sizes["nf4"]["text_encoder_2"]
    assert dit["kept_layers"] == 0 and 0.28 < dit["total_bytes"] / sizes["bf16"]["transformer"] < 0.29
    assert t5["kept_layers"] == 24, "transformers keeps T5's 24 feed-forward `wo` layers out of 4-bit"
    assert 0.4 < t5["total_bytes"] / sizes["bf16"]["text_encoder_2"] < 0.5


def test_full_sequence_lengths_from_configs():
    image, text = footprint.flux_sequence_lengths(_config("vae"), _config("transformer"), FULL.height, FULL.width,
                                                  FULL.max_sequence_length)
    print(f"full profile {FULL.height}x{FULL.width}: {image} image tokens + {text} text tokens")
    assert (image, text) == (EXPECTED_IMAGE_TOKENS, EXPECTED_TEXT_TOKENS)


def test_sequence_lengths_fail_on_planted_wrong_configs():
    vae, dit = _config("vae"), _config("transformer")
    five_blocks = {**vae, "block_out_channels": [*vae["block_out_channels"], 512]}  # x16 VAE: 1024 tokens
    assert footprint.flux_sequence_lengths(five_blocks, dit, 1024, 1024, 512)[0] != EXPECTED_IMAGE_TOKENS
    with pytest.raises(ValueError, match="features per token"):
        footprint.flux_sequence_lengths(vae, {**dit, "in_channels": 16}, 1024, 1024, 512)
    with pytest.raises(ValueError, match="not a multiple of 16"):
        footprint.flux_sequence_lengths(vae, dit, 1000, 1024, 512)


def test_full_scenarios_fit_an_h100(sizes):
    scenarios = footprint.full_scenarios(sizes["bf16"], sizes["fp32"], {n: b["total_bytes"] for n, b in
                                                                        sizes["nf4"].items()})
    for s in scenarios:
        free = footprint.check_fits(s.name, s.weight_bytes)
        print(f"{s.name} [{s.notebooks}]: {s.weight_bytes:,} B = {s.weight_gib:.2f} GiB; "
              f"{free:.2f} GiB free on a {footprint.H100_GIB:g} GiB H100")
    by_name = {s.name: s for s in scenarios}
    assert by_name["bf16 model CPU offload (largest component)"].weight_bytes == sizes["bf16"]["transformer"]
    assert by_name["NF4 + model CPU offload (largest component)"].weight_bytes == sizes["nf4"]["transformer"][
        "total_bytes"]
    assert all(footprint.check_fits(s.name, s.weight_bytes) >= footprint.MIN_FREE_GIB for s in scenarios)


def test_fit_check_fails_on_planted_wrong_inputs(sizes):
    bf16_total = sum(sizes["bf16"].values())
    with pytest.raises(ValueError, match="24 GiB GPU"):
        footprint.check_fits("bf16 pipeline on a 24 GiB card", bf16_total, gpu_gib=24.0)
    with pytest.raises(ValueError, match="at least 10 GiB"):  # notebook 01 keeping its fp32 master on the GPU too
        footprint.check_fits("fp32 pipeline + fp32 master", 2 * sum(sizes["fp32"].values()))
    with pytest.raises(ValueError, match="at least 10 GiB"):  # bf16 bytes planted 3x too large
        footprint.check_fits("bf16 pipeline x3", 3 * bf16_total)
    with pytest.raises(ValueError, match="at least 20 GiB"):  # fp32 leaves ~15 GiB: fails a 20 GiB headroom
        footprint.check_fits("fp32 pipeline", sum(sizes["fp32"].values()), min_free_gib=20.0)


def test_full_dit_forward_under_fake_tensor_mode():
    """The 11.9B DiT's real forward at 1024x1024 (4096 + 512 tokens, batch 1, bf16) on fake tensors: no memory."""
    rss = psutil.Process().memory_info().rss
    mode = FakeTensorMode(allow_non_fake_inputs=True)  # tokenizer ids and the real timestep enter as real tensors
    started = time.perf_counter()
    with mode:
        models = pipelines._build_models("flux-dev", "full", torch.device("cpu"), torch.bfloat16)
    built_s = time.perf_counter() - started
    scheduler_class = pipelines._SCHEDULER_CLASS["flux-dev"]
    scheduler = scheduler_class.from_config(scheduler_class.load_config(
        pipelines.config_dir("flux-dev", "full") / "scheduler"))
    tokenizers = {slot: cls.from_pretrained(pipelines.TOKENIZERS_DIR / folder)
                  for slot, (folder, cls) in pipelines._TOKENIZERS["flux-dev"].items()}
    pipe = FluxPipeline(**models, scheduler=scheduler, **tokenizers)
    net = pipe.transformer
    assert all(isinstance(p, FakeTensor) for p in net.parameters())

    started = time.perf_counter()
    with mode, torch.inference_mode():
        embeds, pooled, text_ids = pipe.encode_prompt(prompt=[pipelines.PROMPT], prompt_2=None, device="cpu",
                                                      max_sequence_length=FULL.max_sequence_length)
        latents, image_ids = pipe.prepare_latents(1, net.config.in_channels // 4, FULL.height, FULL.width,
                                                  embeds.dtype, torch.device("cpu"), torch.Generator().manual_seed(0))
    inputs_s = time.perf_counter() - started
    # The first timestep, as denoiser_inputs computes it, with a real scheduler (see the module docstring).
    conf = scheduler.config
    mu = calculate_shift(latents.shape[1], conf.get("base_image_seq_len", 256), conf.get("max_image_seq_len", 4096),
                         conf.get("base_shift", 0.5), conf.get("max_shift", 1.15))
    timesteps, _ = retrieve_timesteps(scheduler_class.from_config(conf), FULL.steps, "cpu",
                                      sigmas=np.linspace(1.0, 1 / FULL.steps, FULL.steps), mu=mu)
    timestep = timesteps[0].expand(1).to(latents.dtype) / 1000
    assert tuple(latents.shape) == (1, EXPECTED_IMAGE_TOKENS, net.config.in_channels)
    assert tuple(embeds.shape) == (1, EXPECTED_TEXT_TOKENS, net.config.joint_attention_dim)
    assert tuple(image_ids.shape) == (EXPECTED_IMAGE_TOKENS, 3) and tuple(text_ids.shape) == (EXPECTED_TEXT_TOKENS, 3)

    started = time.perf_counter()
    with mode, torch.inference_mode():
        out = net(hidden_states=latents, timestep=timestep, guidance=torch.full([1], FULL.guidance).expand(1),
                  pooled_projections=pooled, encoder_hidden_states=embeds, txt_ids=text_ids, img_ids=image_ids,
                  joint_attention_kwargs={}, return_dict=False)[0]
    forward_s = time.perf_counter() - started
    grew = psutil.Process().memory_info().rss - rss
    print(f"FakeTensorMode: built all components in {built_s:.2f} s, encode_prompt + prepare_latents in "
          f"{inputs_s:.2f} s, DiT forward in {forward_s:.2f} s -> {type(out).__name__} {tuple(out.shape)} "
          f"{out.dtype}; process grew {grew / 2**20:.0f} MiB")
    assert isinstance(out, FakeTensor) and out.dtype == torch.bfloat16
    assert tuple(out.shape) == (1, EXPECTED_IMAGE_TOKENS, 64)
    assert grew < 2**30, f"the fake forward grew the process by {grew / 2**30:.2f} GiB"


# --- FLUX.2 [dev] and Qwen-Image (notebook 16): released sizes on the meta device, weight bytes, what fits ---

# Published sizes: FLUX.2 [dev] DiT 32.2B (black-forest-labs/FLUX.2-dev) with Mistral Small 3.1 24B as text encoder;
# Qwen-Image DiT 20.4B (Qwen/Qwen-Image) with Qwen2.5-VL 7B (8.29B with its vision tower) as text encoder.
NEW_PUBLISHED = {("flux2-dev", "transformer"): 32.2e9, ("flux2-dev", "text_encoder"): 24.0e9,
                 ("qwen-image", "transformer"): 20.4e9, ("qwen-image", "text_encoder"): 8.29e9}


@pytest.fixture(scope="module")
def new_models() -> dict:
    """Parameter counts and bf16 bytes of FLUX.2 and Qwen-Image's full components, from meta models."""
    rss = psutil.Process().memory_info().rss
    out = {}
    for model in ("flux2-dev", "qwen-image"):
        components = footprint.meta_components(model, "full", torch.bfloat16)
        out[model] = {"counts": footprint.parameter_counts(components),
                      "bf16": footprint.component_bytes(components, torch.bfloat16),
                      "meta": all(p.is_meta for m in components.values() for p in m.parameters())}
    out["rss_growth"] = psutil.Process().memory_info().rss - rss
    return out


def test_new_models_build_on_meta_with_their_released_sizes(new_models):
    assert new_models["rss_growth"] < 2**30, "a meta build allocated weights"
    for (model, component), published in NEW_PUBLISHED.items():
        assert new_models[model]["meta"]
        assert new_models[model]["counts"][component] == pytest.approx(published, rel=0.01), (model, component)
    # a planted wrong size is caught by the same comparison
    assert new_models["qwen-image"]["counts"]["transformer"] != pytest.approx(NEW_PUBLISHED[("flux2-dev",
                                                                                             "transformer")], rel=0.01)


def test_new_models_weight_bytes_are_the_footprint_arithmetic(new_models):
    for model in ("flux2-dev", "qwen-image"):
        counts, got = new_models[model]["counts"], new_models[model]["bf16"]
        assert got == footprint.model_weight_bytes(model, torch.bfloat16)
        for component, n in counts.items():  # bf16: two bytes per parameter, plus buffers (a few MB at most)
            assert 2 * n <= got[component] < 2 * n + 16 * 2**20, (model, component)
    # FLUX.2's DiT and encoder together leave less than the 10 GiB a run needs on a 78 GiB H100: the full profile
    # builds the DiT alone (pipelines.TEXT_ENCODER_LEFT_OUT), which fits; Qwen-Image fits whole
    flux2, qwen = new_models["flux2-dev"]["bf16"], new_models["qwen-image"]["bf16"]
    with pytest.raises(ValueError, match="at least 10 GiB must stay free"):
        footprint.check_fits("FLUX.2 DiT + text encoder", flux2["transformer"] + flux2["text_encoder"])
    assert footprint.check_fits("FLUX.2 DiT + VAE", flux2["transformer"] + flux2["vae"]) > 10
    assert footprint.check_fits("Qwen-Image pipeline", sum(qwen.values())) > 10
    assert ("flux2-dev", "full") in pipelines.TEXT_ENCODER_LEFT_OUT
