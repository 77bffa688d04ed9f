"""The environment of the kernels that write executed copies (make reproduce, the GPU run): standard library only,
since the GPU run imports it before its wheels are installed."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path

# An IPython startup file for the kernels that write executed copies: a progress bar stored in a notebook keeps only
# its first state ("0%| 0/2"), which reads as if nothing ran, so those kernels draw none; live notebooks keep them.
QUIET_PROGRESS = """import tqdm.asyncio, tqdm.auto, tqdm.autonotebook


class _NoBar(tqdm.asyncio.tqdm):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **(kwargs | {"disable": True}))


tqdm.auto.tqdm = tqdm.autonotebook.tqdm = _NoBar
"""


def quiet_progress(env: Mapping[str, str]) -> dict[str, str]:
    """env plus an IPYTHONDIR whose startup file turns tqdm's progress bars off in the kernels it starts."""
    startup = Path(tempfile.mkdtemp(prefix="ipython-")) / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-quiet-progress.py").write_text(QUIET_PROGRESS)
    return dict(env) | {"IPYTHONDIR": str(startup.parent.parent)}
