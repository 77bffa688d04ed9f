"""The README's TL;DR is made from the committed rows: it equals report.readme_tldr(), and the same code gives other
lines for other rows (so the test cannot pass on a stale or hand-written copy)."""

from helpers import paths, report


def _region(text: str) -> str:
    start, end = report.TLDR_MARKERS
    return text.split(start, 1)[1].split(end, 1)[0].strip()


def test_the_readme_tldr_is_the_rows_headline():
    readme = (paths.ROOT / "README.md").read_text()
    assert all(m in readme for m in report.TLDR_MARKERS), "README.md lacks its TL;DR region"
    assert _region(readme) == report.readme_tldr(), "README's TL;DR is stale: run python -m helpers.report"


def test_the_tldr_follows_the_rows(tmp_path):
    committed = report.readme_tldr()
    assert "measured by this project:" in committed  # the H200 rows of 00, 03 and 04 are committed
    without_rows = report.readme_tldr(results_dir=tmp_path)  # a planted empty results folder: no GPU figure
    assert "measured by this project:" not in without_rows
    assert without_rows.count("not yet measured on a GPU by notebook ") == len(report.TLDR_LINES)
    readme = f"x\n{report.TLDR_MARKERS[0]}\n{committed}\n{report.TLDR_MARKERS[1]}\ny"
    assert _region(report.replace_readme_region(readme, without_rows, report.TLDR_MARKERS)) == without_rows
