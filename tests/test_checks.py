"""helpers.checks: the Checks cell holds only when every claim holds, and records its table as a row."""

import pytest

from helpers import checks, params, results
from helpers.environment import environment_card


def _writer(tmp_path):
    run = params.resolve("00_x", PROFILE="smoke", RESULTS_DIR=str(tmp_path))
    return results.ResultWriter(run, environment_card(run.device, run.dtype))


def test_all_claims_hold_records_the_table(tmp_path):
    c = checks.Checks()
    recompiles, drift = 0, 1.234567e-3
    c.add("zero recompiles", recompiles, 0, recompiles == 0)
    c.add("parity (relative L2)", drift, "< 0.01", drift < 0.01)
    writer = _writer(tmp_path)
    table = c.evaluate(writer)
    assert list(table.columns) == ["measured", "expected", "holds"] and (table["holds"] == "yes").all()
    assert table.loc["parity (relative L2)", "measured"] == "0.001235"
    (row,) = [r for r in results.read_rows(tmp_path).itertuples() if r.scenario == "checks"]
    assert row.status == "ok" and [x["claim"] for x in row.extra["checks"]] == list(table.index)


@pytest.mark.parametrize("planted", [1, float("nan")])
def test_a_planted_failure_raises_and_is_recorded(tmp_path, planted):
    c = checks.Checks()
    c.add("zero recompiles", 0, 0, True)
    c.add("drift below 0.01", planted, "< 0.01", planted < 0.01)
    writer = _writer(tmp_path)
    with pytest.raises(checks.ChecksFailed, match="1 of 2 claims do not hold:\n- drift below 0.01"):
        c.evaluate(writer)
    (row,) = [r for r in results.read_rows(tmp_path).itertuples() if r.scenario == "checks"]
    assert row.status == "failed" and row.extra["checks"][1]["holds"] is False


def test_an_empty_checks_cell_and_a_repeated_claim_are_refused():
    with pytest.raises(checks.ChecksFailed, match="checks nothing"):
        checks.Checks().evaluate()
    c = checks.Checks()
    c.add("a", 1, 1, True)
    with pytest.raises(ValueError, match="already listed"):
        c.add("a", 2, 2, True)


def test_values_read_as_text_not_python():
    c = checks.Checks()
    c.add("sizes", (26, 87), "two sizes", True)
    c.add("per backend", {"native": 0.5, "flash": [1, 2]}, {}, True)
    c.add("missing", [], set(), True)
    c.add("matches", {"finite": True}, False, False)  # a claim that fails: its table row reads 'no'
    t = c.table()
    assert t.loc["matches", "measured"] == "finite: yes" and t.loc["matches", "expected"] == "no"
    assert t.loc["matches", "holds"] == "no" and t.loc["sizes", "holds"] == "yes"
    assert t.loc["sizes", "measured"] == "26, 87"
    assert t.loc["per backend", "measured"] == "native: 0.5; flash: 1, 2" and t.loc["per backend", "expected"] == "none"
    assert t.loc["missing", "measured"] == "none" and t.loc["missing", "expected"] == "none"


def test_an_upper_bound_reads_as_words():
    """A bound of 0 says 'bit for bit', never '<= 0'; other bounds keep their figure and unit."""
    assert checks.at_most(0.0, "relative L2") == "0, bit for bit (relative L2)"
    assert checks.at_most(0) == "0, bit for bit"
    assert checks.at_most(0.03) == "<= 0.03" and checks.at_most(1e-5, "relative L2") == "<= 1e-05 (relative L2)"
