"""helpers.transfer_cp (notebook 16's context-parallel probe) over two gloo processes: a text length the degree does not
divide is refused by the plain config and tried again with `ulysses_anything=True`; the split runs the weights its
column runs (Flux-1-Dev: the trained smoke model, as notebook 13 splits it)."""

from pathlib import Path

from helpers import compile_tools, params, transfer, transfer_cp

TOL = compile_tools.PARITY_TOLERANCE["bf16"]


def test_an_uneven_split_is_tried_again_with_ulysses_anything():
    got = transfer_cp.run_split("qwen-image", "smoke", "bf16", 0, 128, 128, 32)
    assert "error" not in got, got  # a launch or split error, shown whole
    assert got["text_tokens"] % 2 == 1 and transfer.NOT_DIVISIBLE in got["plain_error"], got
    assert got["change"] == transfer.ULYSSES_ANYTHING and got["drift"] <= TOL, got
    outcome, figure, message = transfer.verdict_context_parallel({"cp_plan": 4} | got, TOL)
    assert outcome == "needs a change" and "ulysses_anything=True" in figure and "plain config fails" in message
    # planted: the same split drifting past the tolerance is no change that works
    assert transfer.verdict_context_parallel({"cp_plan": 4} | got | {"drift": 10 * TOL}, TOL)[0] == "fails"


def test_the_split_runs_the_weights_of_its_column():
    weights, _ = params.resolve_weights("auto", "flux-dev", "smoke")
    got = transfer_cp.run_split("flux-dev", "smoke", "bf16", 0, 128, 128, 32, weights=str(weights))
    assert got["weights"] == Path(weights).name and got["dtype"] == "bf16" and "change" not in got, got
    assert got["drift"] <= TOL
    figure = transfer.verdict_context_parallel({"cp_plan": 4} | got, TOL)[1]
    assert f"({Path(weights).name} weights, bf16)" in figure
