"""Unit tests of the checks notebooks 03 and 04 assert with, each shown to fail on a planted wrong value, and of the
helpers that make 04's steady comparison (one process, interleaved rounds, switching compiled states)."""

import pytest
import torch

from helpers import coldstart, compile_tools, measure
from helpers.compile_tools import CompileCounts
from tests.test_compile_tools import Stack  # three repeated blocks with eager code around them

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_cuda_graph_twin_from_torch_table_and_from_planted_tables():
    assert compile_tools.cuda_graph_twin("reduce-overhead") == "default"
    assert compile_tools.cuda_graph_twin("max-autotune") == "max-autotune-no-cudagraphs"
    assert compile_tools.cuda_graph_twin("default") == compile_tools.cuda_graph_twin("max-autotune-no-cudagraphs") == ""
    # planted: if reduce-overhead also turned on autotuning, its twin would no longer be default
    planted = {m: compile_tools.mode_options(m) for m in compile_tools.COMPILE_MODES}
    planted["reduce-overhead"] = {"triton.cudagraphs": True, "max_autotune": True}
    assert compile_tools.cuda_graph_twin("reduce-overhead", planted) == ""
    planted["max-autotune"] = {"triton.cudagraphs": True, "max_autotune": True, "other": 1}
    assert compile_tools.cuda_graph_twin("max-autotune", planted) == ""


def test_mode_skip_reason_only_off_cuda_and_only_when_the_twin_is_measured():
    reason = compile_tools.mode_skip_reason("reduce-overhead", CPU, ["default", "reduce-overhead"])
    assert "runs but captures no CUDA graph" in reason and "'default'" in reason
    assert compile_tools.mode_skip_reason("reduce-overhead", CPU, ["reduce-overhead"]) == ""  # runs, and says so
    assert compile_tools.mode_skip_reason("reduce-overhead", CUDA, ["default", "reduce-overhead"]) == ""
    assert compile_tools.mode_skip_reason("default", CPU, list(compile_tools.COMPILE_MODES)) == ""
    assert "max-autotune-no-cudagraphs" in compile_tools.mode_skip_reason(
        "max-autotune", CPU, ["max-autotune-no-cudagraphs", "max-autotune"])


def test_reduce_overhead_on_a_cpu_runs_skips_the_cuda_graph_and_builds_the_default_kernels():
    """The skip reason's claim, checked: same kernels as default (no new kernel file), one CUDA-graph skip."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    x = torch.randn(8, 4)
    with compile_tools.fresh_cache():
        compile_tools.reset()
        with compile_tools.counting() as default:
            torch.compile(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU()), dynamic=False)(x)
        built = coldstart.kernel_files(cache_dir())
        assert default.cudagraph_skips == 0, default  # the notebook's check (skips >= 1) fails on default
        compile_tools.reset()
        with compile_tools.counting() as c:
            out = torch.compile(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU()), dynamic=False,
                                mode="reduce-overhead")(x)
        assert coldstart.kernel_files(cache_dir()) == built > 0  # the default compile's kernel, reused
    assert c.graphs == 1 and c.cudagraph_skips >= 1 and out.shape == (8, 4), c
    compile_tools.reset()


def test_cold_compile_problem_fails_on_each_planted_value():
    ok = CompileCounts(graphs=1, cache_misses=3)
    assert compile_tools.cold_compile_problem(ok) == ""
    assert "compiled no graph" in compile_tools.cold_compile_problem(CompileCounts(graphs=0, cache_misses=3))
    assert "graph break" in compile_tools.cold_compile_problem(
        CompileCounts(graphs=2, cache_misses=3, graph_breaks=1, break_reasons={"print": 1}))
    assert "not cold" in compile_tools.cold_compile_problem(CompileCounts(graphs=1, cache_hits=1, cache_misses=3))
    assert "not cold" in compile_tools.cold_compile_problem(CompileCounts(graphs=1, cache_misses=0))


def test_words_follow_the_measured_value():
    assert compile_tools.speed_word(1.30) == "faster" and compile_tools.speed_word(0.70) == "slower"
    assert compile_tools.speed_word(1.02) == compile_tools.speed_word(0.98) == "about as fast"
    assert compile_tools.share_word(0.95) == "almost all" and compile_tools.share_word(0.6) == "most"
    assert compile_tools.share_word(0.3) == "less than half"


SCRIPT = """
import json, os, sys
from pathlib import Path

from helpers import coldstart


def compile_denoiser(pipe, how):
    pipe.compiled = how


if __name__ == "__main__":
    cfg = json.loads(sys.argv[1])
    kernel = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]) / "k.so"
    kernel.parent.mkdir(parents=True)
    kernel.write_bytes(b"")
    print("noise before the answer")
    print(coldstart._MARK + json.dumps({"how": cfg["how"], "first_call_s": 1.0, "steady_samples_s": [0.5],
          "rel_error": 0.0, "graphs": 1, "ops_captured": 3, "recompiles_after_first": 0, "artifacts_loaded": False,
          "artifacts_saved_bytes": 0, "startup_s": 0.1, "eager_samples_s": [1.0], "step_profile": {},
          "extra": {"launched": cfg["launched_at"] > 0, "seed": cfg["seed"]}}))
"""


def test_run_script_runs_the_notebook_script_in_a_new_process_with_its_cache_env(tmp_path):
    script = tmp_path / "cold_start.py"
    script.write_text(SCRIPT)
    cache = coldstart.fresh_cache_dir()
    try:
        r = coldstart.run_script(script, {"how": "regional", "seed": 7}, env=coldstart.cache_env(cache),
                                 cache_dir=cache)
    finally:
        coldstart.remove_dirs([cache])
    assert r.how == "regional" and r.extra["seed"] == 7 and r.extra["launched"] is True
    assert r.extra["kernel_files_built"] == 1 and r.process_wall_s > 0 and r.cache_dir == str(cache)
    assert r.speedup_vs_eager == 2.0 and r.row_fields()["compile_s"] == 1.0 and "2.00x" in r.line("regional", steady=True) and "2.00x" not in r.line("regional")
    module = coldstart.load_script(script)  # imported, its __main__ block not run
    pipe = type("Pipe", (), {})()
    module.compile_denoiser(pipe, "full")
    assert pipe.compiled == "full"
    broken = tmp_path / "broken.py"
    broken.write_text("raise SystemExit(3)\n")
    with pytest.raises(RuntimeError, match="exit 3"):
        coldstart.run_script(broken, {"how": "full"}, env={}, cache_dir=tmp_path)


def test_switching_compiled_states_in_one_process_compiles_nothing_more():
    compile_tools.reset()
    net, x = Stack(), torch.randn(2, 4)
    net.compile(fullgraph=True, backend="eager")
    net(x)
    full = compile_tools.compiled_state(net)
    compile_tools.set_compiled_state(net, {})
    for block in net.blocks:
        block.compile(fullgraph=True, backend="eager")
    net(x)
    regional = compile_tools.compiled_state(net)
    assert list(full) == [net] and set(regional) == set(net.blocks)
    states = {"eager": {}, "full": full, "regional": regional}
    seen: list[str] = []

    def setup(label: str) -> None:
        seen.append(label)
        compile_tools.set_compiled_state(net, states[label])

    with compile_tools.counting() as c:
        timings = measure.time_interleaved({k: (lambda: net(x)) for k in states}, CPU, repeats=3,
                                           warmup=1, setup=setup)
        p_full = (setup("full"), coldstart.step_profile(lambda: net(x), CPU, calls=1))[1]
        p_regional = (setup("regional"), coldstart.step_profile(lambda: net(x), CPU, calls=1))[1]
    assert c.graphs == 0, c
    with compile_tools.counting() as planted:  # a new shape in the full state: the notebook's check would fail
        setup("full")
        net(torch.randn(5, 4))
    assert planted.graphs == 1, planted
    seen.pop()
    assert seen[:6] == ["eager", "full", "regional"] * 2 and len(seen) == 14  # interleaved, 4 rounds, + 2
    assert all(t.method == "perf_counter" and len(t.samples_s) == 3 for t in timings.values())
    assert p_full["region_calls"] == 1 and p_regional["region_calls"] == 3
    compile_tools.set_compiled_state(net, {})
    assert compile_tools.compiled_state(net) == {}
    compile_tools.reset()


def test_steady_compare_medians_and_speedups():
    r = coldstart.SteadyCompare(samples_s={"eager": [4.0, 6.0, 5.0], "full": [2.0, 2.5, 3.0], "regional": [5.0]},
                                graphs_while_timing=0, step_profiles={}, rel_errors={}, first_call_s={})
    assert r.median_s("eager") == 5.0 and r.speedup_vs_eager("full") == 2.0 and r.speedup_vs_eager("regional") == 1.0
    assert r.timing("full", 1).median_s == 2.5 and r.timing("full", 1).warmup == 1


def test_precision_cast_emulation_changes_no_fp32_kernel():
    """Why 03 skips the emulated compile in fp32: in fp32 the same kernels are built (no new file)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.GELU())

    x = torch.randn(4, 8)
    with compile_tools.fresh_cache():
        built = {}
        for emulate in (True, False):
            compile_tools.reset()
            with compile_tools.precision_casts(emulate):
                torch.compile(model(), dynamic=False)(x)
            built[emulate] = coldstart.kernel_files(cache_dir())
        assert built[False] == built[True] > 0, built
        compile_tools.reset()  # control: in bf16 the emulation does change the generated kernel
        for emulate in (True, False):
            with compile_tools.precision_casts(emulate):
                torch.compile(model().to(torch.bfloat16), dynamic=False)(x.to(torch.bfloat16))
            compile_tools.reset()
        assert coldstart.kernel_files(cache_dir()) > built[True] + 1


def test_speed_phrase_reads_as_english():
    assert compile_tools.speed_phrase(1.5, "eager") == "faster than eager"
    assert compile_tools.speed_phrase(0.5, "the full one") == "slower than the full one"
    assert compile_tools.speed_phrase(1.01, "eager") == "about as fast as eager"
