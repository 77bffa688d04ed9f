"""The workloads the notebooks time: a whole pipeline call, and each component on its own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from helpers import pipelines
from helpers.params import Run

PROMPT = "a photo of a red fox reading a newspaper in a quiet cafe, morning light"


def pipeline_kwargs(run: Run, *, output_type: str = "pil", seed: int | None = None) -> dict[str, Any]:
    """Keyword arguments for one full pipeline call at the run's profile settings."""
    s = run.settings
    kwargs: dict[str, Any] = {
        "prompt": PROMPT, "height": s.height, "width": s.width, "num_inference_steps": s.steps,
        "guidance_scale": s.guidance, "output_type": output_type,
        "generator": torch.Generator(device="cpu").manual_seed(run.seed if seed is None else seed),
    }
    if run.model == "flux-dev":
        kwargs["max_sequence_length"] = s.max_sequence_length
    return kwargs


def pipeline_call(pipe: Any, run: Run, *, output_type: str = "pil") -> Callable[[], Any]:
    """A zero-argument callable running the whole pipeline once (same seed every call)."""
    @torch.inference_mode()
    def call() -> Any:
        return pipe(**pipeline_kwargs(run, output_type=output_type))
    return call


def encode_call(pipe: Any, run: Run) -> Callable[[], Any]:
    """A callable running only the text encoders on the fixed prompt."""
    device = run.device

    @torch.inference_mode()
    def call() -> Any:
        if run.model == "flux-dev":
            return pipe.encode_prompt(prompt=PROMPT, prompt_2=None, device=device,
                                      max_sequence_length=run.settings.max_sequence_length)
        return pipe.encode_prompt(prompt=PROMPT, device=device, do_classifier_free_guidance=True)
    return call


def denoiser_call(pipe: Any, inputs: dict[str, Any], module: torch.nn.Module | None = None) -> Callable[[], Any]:
    """A callable running one denoiser forward as the pipeline calls it (module defaults to the pipeline's own).

    SDXL's pipeline passes the UNet's `sample` and `timestep` positionally and the rest by name; a compiled
    module guards on that, so calling it the same way lets the pipeline reuse the graph."""
    net = module if module is not None else pipelines.denoiser(pipe)
    positional = [k for k in ("sample", "timestep") if "sample" in inputs]
    named = {k: v for k, v in inputs.items() if k not in positional}

    @torch.inference_mode()
    def call() -> Any:
        return net(*(inputs[k] for k in positional), **named)
    return call


def run_inputs(pipe: Any, run: Run, *, height: int | None = None, width: int | None = None,
               batch_size: int = 1) -> dict[str, Any]:
    """Denoiser inputs for batch_size images at the run's resolution (or the one given) and text length."""
    s = run.settings
    return pipelines.denoiser_inputs(pipe, height=height or s.height, width=width or s.width,
                                     max_sequence_length=s.max_sequence_length, guidance=s.guidance,
                                     seed=run.seed, batch_size=batch_size)


def vae_decode_call(pipe: Any, run: Run) -> Callable[[], Any]:
    """A callable decoding one latent of the run's resolution with the pipeline's VAE."""
    vae = pipe.vae
    gen = torch.Generator(device="cpu").manual_seed(run.seed)
    shape = (1, vae.config.latent_channels, run.settings.height // 8, run.settings.width // 8)
    latents = torch.randn(shape, generator=gen).to(run.device, vae.dtype)

    @torch.inference_mode()
    def call() -> Any:
        return vae.decode(latents, return_dict=False)[0]
    return call


def first_output(out: Any) -> torch.Tensor:
    """The tensor a denoiser or VAE call returned (they return tuples with return_dict=False)."""
    return out[0] if isinstance(out, (tuple, list)) else out
