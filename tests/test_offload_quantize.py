"""Unit tests of helpers.offload and helpers.quantize on the tiny smoke Flux (CPU)."""

import pytest
import torch

from helpers import offload, pipelines, quantize


@pytest.fixture(scope="module")
def tiny_pipe():
    return pipelines.build_pipeline("flux-dev", "smoke", device="cpu")


def test_enable_rejects_unknown_mode(tiny_pipe):
    with pytest.raises(ValueError, match="'model', 'sequential', 'group_block', 'group_leaf'"):
        offload.enable(tiny_pipe, "disk", "cpu")


def test_model_offload_hooks_on_cpu():
    pipe = pipelines.build_pipeline("flux-dev", "smoke", device="cpu")
    before = offload.hook_summary(pipe)
    assert set(before) == {"vae", "text_encoder", "text_encoder_2", "transformer"}
    assert all(h["accelerate_hooks"] == 0 and h["group_offload_hooks"] == 0 for h in before.values())
    offload.enable(pipe, "model", "cpu")
    after = offload.hook_summary(pipe)
    assert all(h["accelerate_hook_types"] == ["CpuOffload"] and h["accelerate_hooks"] == 1 for h in after.values())


def test_group_offload_hooks_and_stream_refusal_on_cpu():
    pipe = pipelines.build_pipeline("flux-dev", "smoke", device="cpu")
    err = offload.error_of(lambda: offload.enable(pipe, "group_block", "cpu", use_stream=True))
    assert err.startswith("ValueError:") and "stream" in err
    offload.enable(pipe, "group_block", "cpu", use_stream=False)
    assert all(h["group_offload_hooks"] > 0 for h in offload.hook_summary(pipe).values())


def test_error_helpers():
    assert offload.error_of(lambda: None) == ""
    assert offload.error_of(lambda: int("x")).startswith("ValueError: invalid literal")
    assert offload.describe_error(RuntimeError("first\nsecond")) == "RuntimeError: first"
    reason = offload.no_accelerator_reason("sequential")
    assert reason.startswith("sequential offload") and "no CUDA GPU" in reason


def test_nf4_configs():
    import diffusers
    import transformers

    dit_cfg = quantize.nf4_config(diffusers.FluxTransformer2DModel)
    t5_cfg = quantize.nf4_config(transformers.T5EncoderModel)
    assert isinstance(dit_cfg, diffusers.BitsAndBytesConfig) and isinstance(t5_cfg, transformers.BitsAndBytesConfig)
    for cfg in (dit_cfg, t5_cfg):
        assert cfg.load_in_4bit and cfg.bnb_4bit_quant_type == "nf4" and cfg.bnb_4bit_compute_dtype == torch.bfloat16


@pytest.mark.parametrize("name", ["transformer", "text_encoder_2"])
def test_load_nf4_sizes_and_output(tiny_pipe, tmp_path, name):
    bf16 = getattr(tiny_pipe, name)
    bf16.save_pretrained(tmp_path / name)
    model, path = quantize.load_nf4(type(bf16), tmp_path / name, "cpu")
    if name == "transformer":
        assert "BnB4BitDiffusersQuantizer" in path and "No GPU found" in path
    else:
        assert path.startswith("transformers T5EncoderModel.from_pretrained")
    sizes = quantize.linear4bit_bytes(model)
    names = quantize.linear4bit_names(model)
    kept = quantize.unquantized_linear_names(model)
    assert sizes["layers"] == len(names) and len(names) + len(kept) == sum(
        isinstance(m, torch.nn.Linear) for m in bf16.modules())
    if name == "transformer":  # diffusers converts every linear layer of the DiT
        assert kept == []
        assert all(p.dtype in (torch.bfloat16, torch.uint8) for p in model.parameters())
    else:  # transformers keeps T5's feed-forward output projections ("wo") out of 4-bit
        assert kept and all(n.endswith(".wo") for n in kept)
    assert sizes["bf16_bytes"] == quantize.linear_weight_bytes(bf16, names)
    assert sizes["packed_bytes"] * 4 == sizes["bf16_bytes"]  # two 4-bit codes per byte vs two bytes per weight
    assert sizes["nf4_bytes"] / sizes["bf16_bytes"] == pytest.approx(0.5625 / 2)  # + one fp32 scale per 64
    if name == "transformer":
        inputs = pipelines.denoiser_inputs(tiny_pipe, height=64, width=64, max_sequence_length=16)
        with torch.inference_mode():
            ref, out = bf16(**inputs)[0], model(**inputs)[0]
    else:
        ids = torch.arange(16).unsqueeze(0)
        with torch.inference_mode():
            ref, out = bf16(ids)[0], model(ids)[0]
    assert out.isfinite().all() and 0 < quantize.relative_l2(ref, out) < 2


def test_relative_l2():
    x = torch.randn(10)
    assert quantize.relative_l2(x, x) == 0.0
    assert quantize.relative_l2(x, 2 * x) == pytest.approx(1.0)


def test_narrow_layers_go_to_the_generic_cpu_kernel(tiny_pipe, tmp_path):
    import bitsandbytes as bnb

    tiny_pipe.text_encoder_2.save_pretrained(tmp_path / "t5")
    model, path = quantize.load_nf4(type(tiny_pipe.text_encoder_2), tmp_path / "t5", "cpu")
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    narrow = [m for m in layers if m.in_features % 64]
    assert all(m.support_avx512bf16_for_cpu is False for m in narrow)
    assert (f"{len(narrow)} of {len(layers)} NF4 layers" in path) == bool(narrow)
    assert quantize.generic_cpu_path_for_narrow_layers(model) == len(narrow)
