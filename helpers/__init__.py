"""Shared measuring helpers for the fast-diffusion notebooks."""

import logging

# bitsandbytes' CPU backend looks for an optional kernel on the Hugging Face hub (the `kernels` package) and
# logs a warning when it is absent. This project never downloads at run time; the fallback computes the same.
logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
