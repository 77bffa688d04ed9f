"""helpers/__init__ drops a few named library log notices and nothing else."""

import logging

import helpers


def test_drop_notice_drops_only_its_text(caplog):
    logger = logging.getLogger("torchao")
    with caplog.at_level(logging.INFO, logger="torchao"):
        logger.warning("Failed to load the fp8 extension")
        logger.warning("something else from torchao")
    assert [r.getMessage() for r in caplog.records] == ["something else from torchao"]
    assert any(isinstance(f, helpers._DropNotice) for f in logger.filters)
