"""Shared measuring helpers for the fast-diffusion notebooks."""

import logging
import warnings

# bitsandbytes' CPU backend looks for an optional kernel on the Hugging Face hub (the `kernels` package) and
# logs a warning when it is absent. This project never downloads at run time; the fallback computes the same.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)


class _DropNotice(logging.Filter):
    """Drop a logger's records that contain one fixed piece of text; every other record passes."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


# Import-time notices that say nothing about what the notebooks run, printed in every kernel; only these texts are
# dropped, each logger's other records pass:
# - diffusers imports the CLIP/SigLIP image processors for pipelines' optional image inputs, which these notebooks
#   never use; this project does not install torchvision, so transformers announces a PIL fallback.
# - torchao (notebook 12; diffusers imports it whenever it is installed) tries to load its CUDA-only extensions
#   (fp8 / mx kernels) and logs each failure on a CPU build; on a GPU they load.
# - torchao registers two Enum classes with pytree, which torch 2.13 reports as no longer needed.
# - diffusers' torchao quantizer looks for tensor classes to allow when loading torchao-serialized checkpoints,
#   which this project never loads, and notes that torchao 0.18 no longer has them.
# - diffusers warns at every enable_cache(FasterCacheConfig(...)) that FasterCache is experimental: notebooks 14 and
#   16 say so where they list it, once, instead of the paragraph each call prints.
# - diffusers warns at every set_attention_backend / attention_backend that attention backends are experimental:
#   notebook 02 says so once, where it introduces them.
for _logger, _text in (("transformers.utils.import_utils", "requires torchvision (not installed)"),
                       ("diffusers.hooks.faster_cache", "FasterCache is a purely experimental feature"),
                       ("diffusers.models.modeling_utils", "Attention backends are an experimental feature"),
                       ("torchao", "Failed to load"),
                       ("torch.utils._pytree", "is an Enum subclass and is now natively supported"),
                       ("diffusers.quantizers.torchao.torchao_quantizer", "Unable to import `torchao` Tensor objects")):
    logging.getLogger(_logger).addFilter(_DropNotice(_text))

# torch.export rebuilds tree specs through its own deprecated LeafSpec check when a program holding torchao's tensor
# subclasses is exported and packaged (notebook 12); the FutureWarning is about torch's code, not the notebook's.
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)
