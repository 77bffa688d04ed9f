"""helpers/__init__ drops a few named library notices (log records, one warning) and nothing else."""

import logging
import subprocess
import sys

import helpers
from helpers import paths


def test_drop_notice_drops_only_its_text(caplog):
    logger = logging.getLogger("torchao")
    with caplog.at_level(logging.INFO, logger="torchao"):
        logger.warning("Failed to load the fp8 extension")
        logger.warning("something else from torchao")
    assert [r.getMessage() for r in caplog.records] == ["something else from torchao"]
    assert any(isinstance(f, helpers._DropNotice) for f in logger.filters)


SCRIPT = """
import warnings
import helpers
from helpers import paths
for text in ("`isinstance(treespec, LeafSpec)` is deprecated, use TreeSpec", "some other deprecation"):
    try:
        warnings.warn(text, FutureWarning)
        print("ignored:", text)
    except FutureWarning:
        print("shown:", text)
"""


def test_only_the_named_warning_is_ignored():
    # a fresh interpreter: pytest restores the warning filters after collection, so in-process they are not ours
    out = subprocess.run([sys.executable, "-W", "error::FutureWarning", "-c", SCRIPT], capture_output=True,
                         text=True, check=True, cwd=paths.ROOT).stdout.splitlines()
    assert out == ["ignored: `isinstance(treespec, LeafSpec)` is deprecated, use TreeSpec",
                   "shown: some other deprecation"]
