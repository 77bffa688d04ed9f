"""Build the notebooks' diffusion pipelines: the real diffusers classes, from shipped configs or real weights.

`weights="random"` assembles FluxPipeline / StableDiffusionXLPipeline / Flux2Pipeline / QwenImagePipeline from
`data/configs/<model>/<profile>/` with seeded random weights, created directly on the target device in the target
dtype, and the project's own small tokenizers from `data/tokenizers/`. A local folder or a hub id goes through the
pipeline's real `from_pretrained`. Nothing here times or measures anything (that is `helpers.measure`).

FLUX.2 [dev] on the full profile is built without its text encoder (TEXT_ENCODER_LEFT_OUT): its 32.2B DiT and 24B
Mistral encoder do not fit one 80 GB GPU together in bf16, so the DiT is fed random prompt embeddings of the
encoder's shape (`prompt_embeds`).
"""

from __future__ import annotations

import contextlib
import json
import math
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import diffusers
import torch
import transformers
from diffusers import (
    AutoencoderKL,
    AutoencoderKLFlux2,
    AutoencoderKLQwenImage,
    EulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    Flux2Pipeline,
    Flux2Transformer2DModel,
    FluxPipeline,
    FluxTransformer2DModel,
    QwenImagePipeline,
    QwenImageTransformer2DModel,
    StableDiffusionXLPipeline,
    UNet2DConditionModel,
)
from transformers import (
    CLIPTextModel,
    CLIPTextModelWithProjection,
    CLIPTokenizer,
    Mistral3ForConditionalGeneration,
    PreTrainedTokenizerFast,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2Tokenizer,
    T5EncoderModel,
    T5TokenizerFast,
)
from transformers.initialization import no_init_weights

from helpers import paths
from helpers.params import check_choice, check_weights, resolve_weights

MODELS: tuple[str, ...] = ("flux-dev", "sdxl", "flux2-dev", "qwen-image")
PROFILES: tuple[str, ...] = ("smoke", "full")
DENOISER: dict[str, str] = {"flux-dev": "transformer", "sdxl": "unet", "flux2-dev": "transformer",
                            "qwen-image": "transformer"}

CONFIGS_DIR: Path = paths.DATA_DIR / "configs"
TOKENIZERS_DIR: Path = paths.DATA_DIR / "tokenizers"
PROMPT = "a photo of a cat holding a sign"

PIPELINE_CLASS: dict[str, type[diffusers.DiffusionPipeline]] = {
    "flux-dev": FluxPipeline, "sdxl": StableDiffusionXLPipeline, "flux2-dev": Flux2Pipeline,
    "qwen-image": QwenImagePipeline,
}
# Model components in the order count_parameters reports them: denoiser, text encoders, VAE.
_MODEL_CLASSES: dict[str, dict[str, type[torch.nn.Module]]] = {
    "flux-dev": {"transformer": FluxTransformer2DModel, "text_encoder": CLIPTextModel,
                 "text_encoder_2": T5EncoderModel, "vae": AutoencoderKL},
    "sdxl": {"unet": UNet2DConditionModel, "text_encoder": CLIPTextModel,
             "text_encoder_2": CLIPTextModelWithProjection, "vae": AutoencoderKL},
    "flux2-dev": {"transformer": Flux2Transformer2DModel, "text_encoder": Mistral3ForConditionalGeneration,
                  "vae": AutoencoderKLFlux2},
    "qwen-image": {"transformer": QwenImageTransformer2DModel, "text_encoder": Qwen2_5_VLForConditionalGeneration,
                   "vae": AutoencoderKLQwenImage},
}
_SCHEDULER_CLASS: dict[str, type] = {"flux-dev": FlowMatchEulerDiscreteScheduler, "sdxl": EulerDiscreteScheduler,
                                     "flux2-dev": FlowMatchEulerDiscreteScheduler,
                                     "qwen-image": FlowMatchEulerDiscreteScheduler}
# Pipeline tokenizer slot -> (folder under data/tokenizers, class the real pipeline names).
_TOKENIZERS: dict[str, dict[str, tuple[str, type]]] = {
    "flux-dev": {"tokenizer": ("clip", CLIPTokenizer), "tokenizer_2": ("t5", T5TokenizerFast)},
    "sdxl": {"tokenizer": ("clip", CLIPTokenizer), "tokenizer_2": ("clip", CLIPTokenizer)},
    # FLUX.2 ships a PixtralProcessor; transformers' Pixtral processor imports torchvision, which the project does not
    # install, so the pipeline gets the processor's tokenizer (tools/build_tokenizers.py), which a text prompt uses
    "flux2-dev": {"tokenizer": ("mistral3", PreTrainedTokenizerFast)},
    "qwen-image": {"tokenizer": ("qwen2", Qwen2Tokenizer)},
}
# (model, profile) built without the text encoder and its tokenizer, and why: the pipeline is then called with
# prompt_embeds (random_prompt_embeds) of the encoder's shape.
TEXT_ENCODER_LEFT_OUT: dict[tuple[str, str], str] = {
    ("flux2-dev", "full"): ("FLUX.2 [dev]'s 32.2B DiT (60.0 GiB in bf16) and 24B Mistral text encoder (44.7 GiB) do not "
                            "fit one 80 GB GPU together, so the full profile builds the DiT and VAE and feeds the DiT "
                            "random prompt embeddings of the encoder's shape"),
}
# Text tokens each model reads on the smoke profile (FLUX.2 pads its chat, system message included, to this length;
# Flux-1-Dev's T5 to the profile's 32; Qwen-Image's encoder pads to the longest prompt, whatever this says).
SMOKE_TEXT_TOKENS: dict[str, int] = {"flux2-dev": 64}
_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Sinusoidal time embedders (Flux, FLUX.2, Qwen-Image: timestep and guidance; UNet: timestep) whose first layer
# _randomise tapers.
_TIME_EMBEDDERS = ("timestep_embedder", "guidance_embedder", "time_embedding")
# SDXL's denoiser inputs are taken at the first step of a schedule of this many steps (the full profile's).
_SDXL_REFERENCE_STEPS = 28


def config_dir(model: str, profile: str) -> Path:
    """Folder holding the component configs of a model at a profile (data/configs/<model>/<profile>)."""
    check_choice("MODEL", model, MODELS)
    check_choice("PROFILE", profile, PROFILES)
    return CONFIGS_DIR / model / profile


def flux_depth(profile: str) -> list[int]:
    """[double-stream, single-stream] block counts of the shipped Flux transformer config of a profile."""
    config = json.loads((config_dir("flux-dev", profile) / "transformer" / "config.json").read_text())
    return [config["num_layers"], config["num_single_layers"]]


def _model_from_config(cls: type[torch.nn.Module], folder: Path, dtype: torch.dtype,
                       overrides: dict[str, Any] | None = None) -> torch.nn.Module:
    """Instantiate a diffusers or transformers model class from the config in folder (no weights loaded)."""
    if not issubclass(cls, transformers.PreTrainedModel):
        config = dict(cls.load_config(folder))
        unknown = sorted(set(overrides or {}) - set(config))
        if unknown:
            raise ValueError(f"denoiser_config: {unknown} are not fields of {cls.__name__}'s config; "
                             f"allowed: {sorted(k for k in config if not k.startswith('_'))}")
        return cls.from_config(config | (overrides or {}))
    config = cls.config_class.from_pretrained(folder)
    # transformers 5 builds sub-models in config.dtype (the published configs say float16/bfloat16), not in the
    # default dtype, and ties embeddings inside the init_weights that no_init_weights switches off. Multimodal
    # encoders (Mistral3, Qwen2.5-VL) carry a text and a vision config, each with its own dtype.
    config.dtype = dtype
    for sub in ("text_config", "vision_config"):
        if getattr(config, sub, None) is not None:
            getattr(config, sub).dtype = dtype
    model = cls(config)
    model.tie_weights()
    return model


@contextlib.contextmanager
def _created_on(device: torch.device, dtype: torch.dtype) -> Iterator[None]:
    """New parameters are allocated on device in dtype and left uninitialised (torch and transformers init off)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device), no_init_weights():
            yield
    finally:
        torch.set_default_dtype(previous)


def _build_models(model: str, profile: str, device: torch.device, dtype: torch.dtype,
                  denoiser_config: dict[str, Any] | None = None,
                  leave_out: tuple[str, ...] = ()) -> dict[str, torch.nn.Module]:
    """Every model component of a pipeline (but those in leave_out), instantiated from data/configs on device in
    dtype, uninitialised."""
    folder = config_dir(model, profile)
    with _created_on(device, dtype):
        return {name: _model_from_config(cls, folder / name, dtype, denoiser_config if name == DENOISER[model] else None)
                for name, cls in _MODEL_CLASSES[model].items() if name not in leave_out}


def _component_seed(seed: int, name: str) -> int:
    """A per-component seed, so one component's weights do not depend on another's size."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63


def _draw_device(device: torch.device) -> torch.device:
    """Where seeded random weights are drawn for a module on device: on the GPU whenever there is one, so a pipeline
    kept in CPU memory (08 and 09 on a card too small for it) holds the same weights as one built on the GPU, drawn
    in seconds (one CPU core draws Flux-1-Dev's 12B values in minutes); else on device."""
    if device.type == "cuda" or not torch.cuda.is_available():
        return device
    return torch.device("cuda")


@torch.no_grad()
def _randomise(module: torch.nn.Module, seed: int) -> None:
    """Seeded init that keeps activations modest in fp32, bf16 and fp16.

    Matrices and conv kernels get N(0, 1/fan_in), so each layer roughly preserves the scale of its input; norm
    layers get weight 1 and bias 0, other biases 0; time embeddings are tapered (_time_tapers). Values are drawn
    and tapered in fp32 one tensor at a time, then cast once, so builds in different dtypes hold the same
    weights up to one rounding; they are drawn where _draw_device says."""
    device = _draw_device(next(module.parameters()).device)
    gen = torch.Generator(device=device).manual_seed(seed)
    tapers = _time_tapers(module)
    seen: set[int] = set()
    for mod in module.modules():
        is_norm = "norm" in type(mod).__name__.lower()
        for name, param in mod.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            if is_norm:  # Qwen-Image's VAE names its RMS norm's scale `gamma`
                param.fill_(1.0 if name in ("weight", "gamma") else 0.0)
            elif param.ndim >= 2:
                fan_in = param[0].numel()
                draw = torch.empty(param.shape, dtype=torch.float32, device=device).normal_(
                    0.0, fan_in**-0.5, generator=gen)
                if id(param) in tapers:
                    draw *= tapers[id(param)].to(device)
                param.copy_(draw)
            else:
                param.zero_()


def _time_tapers(module: torch.nn.Module) -> dict[int, torch.Tensor]:
    """Column tapers for the first layer of each timestep/guidance embedder, keyed by id of its weight.

    Those layers read sinusoids sin(t * f) for f from 1 down to 1e-4, with t up to 1000 (Flux: guidance up to
    ~4000). Random weights make the output depend on the highest frequencies, so the rounding of t in bf16 (3500
    becomes 3504) would change the whole output. Trained embedders vary smoothly with t; we taper each input
    column by exp(-(f / 0.01)^2), rescaled to keep the layer's output scale, so embeddings still separate
    timesteps but ignore bf16 rounding of t."""
    tapers: dict[int, torch.Tensor] = {}
    for name, mod in module.named_modules():
        linear = getattr(mod, "linear_1", None)
        if name.rsplit(".", 1)[-1] not in _TIME_EMBEDDERS or not isinstance(linear, torch.nn.Linear):
            continue
        half = linear.in_features // 2
        freqs = torch.exp(-math.log(10_000.0) * torch.arange(half, dtype=torch.float32) / half)
        taper = torch.exp(-((freqs / 0.01) ** 2)).repeat(2)
        taper *= (taper.numel() / taper.square().sum()).sqrt()
        tapers[id(linear.weight)] = taper
    return tapers


def _check_saved_pipeline(model: str, folder: Path) -> None:
    """Refuse a local folder whose model_index.json names another pipeline class than the model's."""
    index = folder / "model_index.json"
    expected = PIPELINE_CLASS[model].__name__
    found = json.loads(index.read_text()).get("_class_name") if index.is_file() else None
    if found is not None and found != expected:
        raise ValueError(f"WEIGHTS={str(folder)!r} holds a {found}, but MODEL={model!r} needs a {expected}")


def build_pipeline(
    model: str,
    profile: str,
    *,
    weights: str = "random",
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
    seed: int = 0,
    denoiser_config: dict[str, Any] | None = None,
) -> diffusers.DiffusionPipeline:
    """The model's real diffusers pipeline on device in dtype, with seeded random or pretrained weights.

    denoiser_config overrides fields of the denoiser's shipped config (random weights only), e.g. the smoke
    Flux at Flux-1-Dev's depth: {"num_layers": 19, "num_single_layers": 38}."""
    config_dir(model, profile)
    if dtype not in _FLOAT_DTYPES:
        raise ValueError(f"dtype={dtype!r} is not allowed; choose one of: {', '.join(map(str, _FLOAT_DTYPES))}")
    device = torch.device(device)
    source = check_weights(str(weights))
    pipeline_class = PIPELINE_CLASS[model]
    if denoiser_config and source != "random":
        raise ValueError(f"denoiser_config={denoiser_config!r} changes the architecture, so it needs "
                         f"WEIGHTS='random', not {source!r}")

    source, _ = resolve_weights(source, model, profile)
    if source != "random":
        if Path(source).is_dir():
            _check_saved_pipeline(model, Path(source))
        # diffusers 0.42 names the argument dtype (torch_dtype still works but is deprecated).
        pipe = pipeline_class.from_pretrained(source, dtype=dtype).to(device)
    else:
        pipe = pipeline_class(**random_components(model, profile, dtype=dtype, device=device, seed=seed,
                                                  denoiser_config=denoiser_config))

    for component in pipe.components.values():
        if isinstance(component, torch.nn.Module):
            component.eval()
    return pipe


def random_components(model: str, profile: str, *, dtype: torch.dtype = torch.bfloat16,
                      device: str | torch.device = "cpu", seed: int = 0,
                      denoiser_config: dict[str, Any] | None = None) -> dict[str, Any]:
    """The keyword arguments of the model's pipeline class, made from data/configs/<model>/<profile>: each model
    component by its class's from_config, on device in dtype, with seeded random weights (_randomise); the
    scheduler by its from_config; the project's tokenizers by from_pretrained. Where TEXT_ENCODER_LEFT_OUT names
    (model, profile), text_encoder and tokenizer are None (the pipeline is called with prompt_embeds)."""
    device = torch.device(device)
    left_out = ("text_encoder",) if (model, profile) in TEXT_ENCODER_LEFT_OUT else ()
    components: dict[str, Any] = _build_models(model, profile, device, dtype, denoiser_config, left_out)
    for name, module in components.items():
        _randomise(module, _component_seed(seed, name))
        module.eval()
    scheduler_class = _SCHEDULER_CLASS[model]
    components["scheduler"] = scheduler_class.from_config(
        scheduler_class.load_config(config_dir(model, profile) / "scheduler"))
    for slot, (folder, tokenizer_class) in _TOKENIZERS[model].items():
        components[slot] = None if left_out else tokenizer_class.from_pretrained(TOKENIZERS_DIR / folder)
    components |= dict.fromkeys(left_out)
    if model == "sdxl":
        components["add_watermarker"] = False
    # Every module already lives on device; pipe.to(device) would only add diffusers' fp16-on-CPU warning.
    return components


def _model_of(pipe: diffusers.DiffusionPipeline) -> str:
    """Which of MODELS a pipeline object is."""
    for model, cls in PIPELINE_CLASS.items():
        if isinstance(pipe, cls):
            return model
    raise TypeError(f"{type(pipe).__name__} is not one of the project's pipelines "
                    f"({', '.join(c.__name__ for c in PIPELINE_CLASS.values())})")


def denoiser(pipe: diffusers.DiffusionPipeline) -> torch.nn.Module:
    """The module the pipeline calls once per step: pipe.transformer (Flux, FLUX.2, Qwen-Image) or pipe.unet (SDXL)."""
    return getattr(pipe, DENOISER[_model_of(pipe)])


@torch.inference_mode()
def denoiser_inputs(
    pipe: diffusers.DiffusionPipeline,
    *,
    height: int,
    width: int,
    max_sequence_length: int = 512,
    batch_size: int = 1,
    guidance: float = 3.5,
    seed: int = 0,
    prompt: str = PROMPT,
) -> dict[str, Any]:
    """Keyword arguments for one denoiser forward at the first step, exactly as the pipeline builds them for prompt.

    Every tensor has the dtype, shape and strides the pipeline's first denoiser call gets, and the keys are the
    ones it passes, so a denoiser compiled on these inputs serves the pipeline without recompiling (dynamo
    guards on all of that). Flux: packed latents, T5 and pooled CLIP embeddings, text/image position ids, the
    first timestep (sigma 1, i.e. 1000 rounded to the latents' dtype, / 1000), guidance as the pipeline's fp32
    `full([1]).expand(batch)`, and `joint_attention_kwargs={}`. SDXL: latents scaled for the first step of a
    28-step Euler schedule, the scheduler's 0-d fp32 timestep, both text encoders' hidden states, the added
    time embedding inputs, `timestep_cond=None` and `cross_attention_kwargs=None`; with guidance > 1 the batch
    is doubled for classifier-free guidance. The pipeline hands the UNet `sample` and `timestep` positionally,
    so a call that must match its guards passes those two positionally. The tensors are inference tensors, as
    in a pipeline run under `torch.inference_mode()` (workloads.pipeline_call). max_sequence_length is ignored
    for SDXL (CLIP reads 77 tokens)."""
    model = _model_of(pipe)
    net = denoiser(pipe)
    device = pipe._execution_device
    prompts = [prompt] * batch_size
    generator = torch.Generator(device="cpu").manual_seed(seed)
    if model == "flux2-dev":
        return _flux2_inputs(pipe, prompts, height, width, max_sequence_length, guidance, generator, seed)
    if model == "qwen-image":
        return _qwen_inputs(pipe, prompts, height, width, max_sequence_length, generator)

    if model == "flux-dev":
        import numpy as np
        from diffusers.pipelines.flux.pipeline_flux import calculate_shift, retrieve_timesteps

        # As FluxPipeline.__call__ (diffusers 0.42): embeddings in the text encoders' dtype, latents in theirs.
        prompt_embeds, pooled, text_ids = pipe.encode_prompt(
            prompt=prompts, prompt_2=None, device=device, max_sequence_length=max_sequence_length)
        latents, image_ids = pipe.prepare_latents(
            batch_size, net.config.in_channels // 4, height, width, prompt_embeds.dtype, device, generator)
        scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config)
        steps = _SDXL_REFERENCE_STEPS  # the first Flux timestep is sigma 1 whatever the step count
        conf = scheduler.config
        sigmas = None if getattr(conf, "use_flow_sigmas", False) else np.linspace(1.0, 1 / steps, steps)
        mu = calculate_shift(latents.shape[1], conf.get("base_image_seq_len", 256),
                             conf.get("max_image_seq_len", 4096), conf.get("base_shift", 0.5),
                             conf.get("max_shift", 1.15))
        timesteps, _ = retrieve_timesteps(scheduler, steps, device, sigmas=sigmas, mu=mu)
        batch = latents.shape[0]
        return {
            "hidden_states": latents,
            "timestep": timesteps[0].expand(batch).to(latents.dtype) / 1000,
            "guidance": (torch.full([1], guidance, device=device, dtype=torch.float32).expand(batch)
                         if net.config.guidance_embeds else None),
            "pooled_projections": pooled,
            "encoder_hidden_states": prompt_embeds,
            "txt_ids": text_ids,
            "img_ids": image_ids,
            "joint_attention_kwargs": {},
            "return_dict": False,
        }

    cfg = guidance > 1.0
    prompt_embeds, negative_embeds, pooled, negative_pooled = pipe.encode_prompt(
        prompt=prompts, device=device, num_images_per_prompt=1, do_classifier_free_guidance=cfg)
    scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config)
    scheduler.set_timesteps(_SDXL_REFERENCE_STEPS, device=device)
    timestep = scheduler.timesteps[0]
    latents = pipe.prepare_latents(batch_size, net.config.in_channels, height, width, prompt_embeds.dtype, device,
                                   generator)
    time_ids = pipe._get_add_time_ids((height, width), (0, 0), (height, width), dtype=prompt_embeds.dtype,
                                      text_encoder_projection_dim=pipe.text_encoder_2.config.projection_dim)
    time_ids = time_ids.to(device).repeat(batch_size, 1)
    if cfg:
        latents = torch.cat([latents, latents])
        prompt_embeds = torch.cat([negative_embeds, prompt_embeds])
        pooled = torch.cat([negative_pooled, pooled])
        time_ids = torch.cat([time_ids, time_ids])
    return {
        "sample": scheduler.scale_model_input(latents, timestep),
        "timestep": timestep,
        "encoder_hidden_states": prompt_embeds.to(device),
        "timestep_cond": None,
        "cross_attention_kwargs": None,
        "added_cond_kwargs": {"text_embeds": pooled.to(device), "time_ids": time_ids},
        "return_dict": False,
    }


def random_prompt_embeds(pipe: diffusers.DiffusionPipeline, batch_size: int, text_tokens: int,
                         seed: int = 0) -> torch.Tensor:
    """Seeded N(0, 1) prompt embeddings of the text encoder's output shape (batch, tokens, the DiT's text width), in
    the DiT's dtype: what a pipeline built without its text encoder (TEXT_ENCODER_LEFT_OUT) is called with."""
    net = denoiser(pipe)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    embeds = torch.randn(batch_size, text_tokens, net.config.joint_attention_dim, generator=gen)
    return embeds.to(device=pipe._execution_device, dtype=net.dtype)


def _first_timesteps(pipe: diffusers.DiffusionPipeline, image_tokens: int, mu: float) -> torch.Tensor:
    """The schedule's timesteps for _SDXL_REFERENCE_STEPS steps on a copy of the pipeline's scheduler (sigma 1 first)."""
    import numpy as np
    from diffusers.pipelines.flux.pipeline_flux import retrieve_timesteps

    scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config)
    steps = _SDXL_REFERENCE_STEPS
    timesteps, _ = retrieve_timesteps(scheduler, steps, pipe._execution_device,
                                      sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
    return timesteps


def _flux2_inputs(pipe: diffusers.DiffusionPipeline, prompts: list[str], height: int, width: int,
                  max_sequence_length: int, guidance: float, generator: torch.Generator, seed: int) -> dict[str, Any]:
    """Flux2Pipeline.__call__'s first transformer call (diffusers 0.42); random prompt embeddings without an encoder."""
    from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

    net, device, batch = denoiser(pipe), pipe._execution_device, len(prompts)
    embeds = random_prompt_embeds(pipe, batch, max_sequence_length, seed) if pipe.text_encoder is None else None
    prompt_embeds, text_ids = pipe.encode_prompt(prompt=None if embeds is not None else prompts,
                                                 prompt_embeds=embeds, device=device,
                                                 max_sequence_length=max_sequence_length)
    latents, latent_ids = pipe.prepare_latents(batch_size=batch, num_latents_channels=net.config.in_channels // 4,
                                               height=height, width=width, dtype=prompt_embeds.dtype, device=device,
                                               generator=generator)
    t = _first_timesteps(pipe, latents.shape[1], compute_empirical_mu(latents.shape[1], _SDXL_REFERENCE_STEPS))[0]
    return {
        "hidden_states": latents.to(net.dtype),
        "timestep": t.expand(batch).to(latents.dtype) / 1000,
        "guidance": torch.full([1], guidance, device=device, dtype=torch.float32).expand(batch),
        "encoder_hidden_states": prompt_embeds,
        "txt_ids": text_ids,
        "img_ids": latent_ids,
        "joint_attention_kwargs": pipe.attention_kwargs if hasattr(pipe, "_attention_kwargs") else None,
        "return_dict": False,
    }


def _qwen_inputs(pipe: diffusers.DiffusionPipeline, prompts: list[str], height: int, width: int,
                 max_sequence_length: int, generator: torch.Generator) -> dict[str, Any]:
    """QwenImagePipeline.__call__'s first transformer call without true CFG (diffusers 0.42)."""
    from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift

    net, device, batch = denoiser(pipe), pipe._execution_device, len(prompts)
    prompt_embeds, mask = pipe.encode_prompt(prompt=prompts, device=device, max_sequence_length=max_sequence_length)
    latents = pipe.prepare_latents(batch, net.config.in_channels // 4, height, width, prompt_embeds.dtype, device,
                                   generator)
    conf = pipe.scheduler.config
    mu = calculate_shift(latents.shape[1], conf.get("base_image_seq_len", 256), conf.get("max_image_seq_len", 4096),
                         conf.get("base_shift", 0.5), conf.get("max_shift", 1.15))
    t = _first_timesteps(pipe, latents.shape[1], mu)[0]
    side = 2 * pipe.vae_scale_factor
    return {
        "hidden_states": latents,
        "timestep": t.expand(batch).to(latents.dtype) / 1000,
        "guidance": None,
        "encoder_hidden_states_mask": mask,
        "encoder_hidden_states": prompt_embeds,
        "img_shapes": [[(1, height // side, width // side)]] * batch,
        "attention_kwargs": {},
        "return_dict": False,
    }


def count_parameters(model: str, profile: str = "full") -> dict[str, int]:
    """Parameters per model component (denoiser, text encoders, VAE), counted on the meta device: no memory."""
    built = _build_models(model, profile, torch.device("meta"), torch.float32)
    return {name: sum(p.numel() for p in module.parameters()) for name, module in built.items()}
