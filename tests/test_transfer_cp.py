"""helpers.transfer_cp (notebook 16's context-parallel probe) over two gloo processes: a text length the degree does not
divide is refused by the plain config and tried again with `ulysses_anything=True`; the split runs the weights its
column runs (Flux-1-Dev: the trained smoke model, as notebook 13 splits it)."""

from pathlib import Path

import torch

from helpers import compile_tools, params, pipelines, transfer, transfer_cp

TOL = compile_tools.PARITY_TOLERANCE["bf16"]


def test_an_uneven_split_is_tried_again_with_ulysses_anything():
    got = transfer_cp.run_split("qwen-image", "smoke", "bf16", 0, 128, 128, 32, prompt=pipelines.PROMPT)
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


def test_the_split_encodes_the_notebooks_prompt(monkeypatch):
    """Qwen-Image's text length is its prompt's own, so whether the plain split divides depends on the prompt: the
    split must encode the notebook's PROMPT, not a fixed one."""
    seen = {}
    monkeypatch.setattr(transfer_cp, "run_split", lambda *args, **kwargs: seen.update(kwargs))
    transfer_cp.splitter("qwen-image", "smoke", "bf16", 0, 128, 128, 32, torch.device("cpu"), prompt="a fox")()
    assert seen["prompt"] == "a fox"
    pipe = pipelines.build_pipeline("qwen-image", "smoke", dtype=torch.bfloat16)
    fox = "a photo of a red fox reading a newspaper"  # notebook 16's PROMPT
    length = {p: pipelines.denoiser_inputs(pipe, height=128, width=128, prompt=p)["encoder_hidden_states"].shape[1]
              for p in (pipelines.PROMPT, fox)}
    assert length[pipelines.PROMPT] % 2 == 1 and length[fox] != length[pipelines.PROMPT], length


def test_a_rank_dying_at_teardown_after_the_result_is_written_keeps_the_result(monkeypatch):
    """gloo can abort a rank at exit ("terminate called without an active exception"): where rank 0 wrote its result
    first, the result stands and the teardown is named; where nothing was written, the launch error is the result."""
    from helpers import parallel

    def launch(result: str | None):
        def fake(nproc: int, *target: str, timeout_s: float = 600) -> str:
            if result is not None:
                Path(target[9]).write_text(result)  # OUT_JSON, as main's rank 0 writes it
            raise RuntimeError("torchrun exited 1:\n`enable_parallelism` is an experimental feature.\n"
                               "terminate called without an active exception\nTraceback (most recent call last):")
        monkeypatch.setattr(parallel, "torchrun", fake)
        return transfer_cp.run_split("flux-dev", "smoke", "bf16", 0, 128, 128, 32)

    kept = launch('{"drift": 0.001, "degree": 2}')
    assert kept["drift"] == 0.001 and "error" not in kept
    assert kept["teardown_error"] == "torchrun exited 1: terminate called without an active exception"
    assert launch(None) == {"error": "torchrun exited 1:"}
