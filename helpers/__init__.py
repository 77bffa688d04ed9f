"""Shared measuring helpers for the fast-diffusion notebooks."""

import logging

# bitsandbytes' CPU backend looks for an optional kernel on the Hugging Face hub (the `kernels` package) and
# logs a warning when it is absent. This project never downloads at run time; the fallback computes the same.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)


class _DropTorchvisionFallbackNotice(logging.Filter):
    """Drop transformers' notice that an image processor falls back to PIL because torchvision is absent."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "requires torchvision (not installed)" not in record.getMessage()


# diffusers imports the CLIP/SigLIP image processors for pipelines' optional image inputs, which these notebooks
# never use; this project does not install torchvision, so transformers announces a PIL
# fallback on every kernel start. The fallback is what transformers itself chooses; only the notice is dropped.
logging.getLogger("transformers.utils.import_utils").addFilter(_DropTorchvisionFallbackNotice())
