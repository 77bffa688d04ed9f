"""Unit tests of helpers.compile_tools and helpers.coldstart on a tiny module (eager backend: no C++ compile)."""

import json

import pytest
import torch
import torch.fx.experimental._config

from helpers import coldstart, compile_tools


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)) * 2


def test_counting_sees_first_compile_and_a_shape_recompile():
    compile_tools.reset()
    m = torch.compile(Tiny(), backend="eager", dynamic=False)
    with compile_tools.counting() as first:
        m(torch.randn(2, 4))
    with compile_tools.counting() as same:
        m(torch.randn(2, 4))
    with compile_tools.counting() as other:
        m(torch.randn(3, 4))
    assert first.graphs == 1 and first.ops_captured >= 3 and first.graph_breaks == 0
    assert same.recompiles == 0
    assert other.recompiles == 1


def test_error_on_recompile_raises_on_new_shape():
    compile_tools.reset()
    m = torch.compile(Tiny(), backend="eager", dynamic=False)
    m(torch.randn(2, 4))
    with compile_tools.error_on_recompile(), pytest.raises(Exception, match="[Rr]ecompil"):
        m(torch.randn(5, 4))


def test_recompile_limit_raises_beyond_limit():
    compile_tools.reset()
    m = torch.compile(Tiny(), backend="eager", dynamic=False)
    with compile_tools.recompile_limit(1):
        m(torch.randn(2, 4))
        with pytest.raises(compile_tools.RecompileLimitHit):
            m(torch.randn(6, 4))


def test_mark_dynamic_and_no_duck_shapes_restore():
    compile_tools.reset()
    before = torch.fx.experimental._config.use_duck_shape
    m = torch.compile(Tiny(), backend="eager", dynamic=True)
    with compile_tools.no_duck_shapes():
        assert torch.fx.experimental._config.use_duck_shape is False
        m(torch.randn(2, 4))
        with compile_tools.counting() as c, compile_tools.error_on_recompile():
            for n in (3, 5, 7):
                m(torch.randn(n, 4))
    assert c.recompiles == 0
    assert torch.fx.experimental._config.use_duck_shape == before
    x = compile_tools.mark_dynamic({"x": torch.randn(3, 4)}, {"x": 0})["x"]
    assert 0 in getattr(x, "_dynamo_dynamic_indices", set())


def test_uncompile_and_relative_error():
    m = Tiny()
    m.compile(backend="eager")
    assert m._compiled_call_impl is not None
    assert compile_tools.uncompile(m)._compiled_call_impl is None
    outer = torch.nn.Sequential(Tiny(), Tiny())
    for block in outer:  # a regional compile: every block compiled, the container not
        block.compile(backend="eager")
    assert len(compile_tools.compiled_state(outer)) == 2
    assert not compile_tools.compiled_state(compile_tools.uncompile(outer))  # the blocks too
    a = torch.ones(10)
    assert compile_tools.relative_error(a, a) == 0
    assert compile_tools.relative_error(a * 1.1, a) == pytest.approx(0.1, rel=1e-5)
    assert set(compile_tools.PARITY_TOLERANCE) == {"bf16", "fp16", "fp32"}


def test_precision_casts_patches_and_restores():
    import torch._inductor.config as ic

    before = ic.emulate_precision_casts
    with compile_tools.precision_casts(not before):
        assert ic.emulate_precision_casts is (not before)
    assert ic.emulate_precision_casts is before


def test_coldstart_cache_env_and_fresh_dir(tmp_path):
    d = coldstart.fresh_cache_dir()
    assert d.is_dir() and not any(d.iterdir())
    env = coldstart.cache_env(d)
    assert env["TORCHINDUCTOR_CACHE_DIR"].startswith(str(d)) and env["TRITON_CACHE_DIR"].startswith(str(d))
    coldstart.remove_dirs([d])
    assert not d.exists()
    with pytest.raises(ValueError, match="how="):
        coldstart.run_script(tmp_path / "x.py", {"how": "everything"}, env={}, cache_dir=tmp_path)
    r = coldstart.ColdStart(how="full", first_call_s=1.0, steady_samples_s=[3.0, 1.0, 2.0, 9.0], rel_error=0.0,
                            graphs=1, ops_captured=10, recompiles_after_first=0, artifacts_loaded=False,
                            artifacts_saved_bytes=0, process_wall_s=2.0, startup_s=0.5, cache_dir=str(tmp_path),
                            eager_samples_s=[6.0, 4.0, 5.0])
    assert r.steady_median_s == 2.5 and r.eager_median_s == 5.0 and r.speedup_vs_eager == 2.0
    assert json.loads(json.dumps(r.__dict__))["how"] == "full"


class Stack(torch.nn.Module):
    """Three repeated blocks with eager code around them, like a denoiser's embeddings and output projection."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Tiny() for _ in range(3)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + 1
        for block in self.blocks:
            x = block(x)
        return x.sum(-1)


def test_step_profile_counts_regions_guards_and_eager_ops_between_them():
    x, cpu = torch.randn(2, 4), torch.device("cpu")
    compile_tools.reset()
    whole = Stack()
    whole.compile(fullgraph=True, backend="eager")
    whole(x)
    p = coldstart.step_profile(lambda: whole(x), cpu, calls=2)
    assert p["region_calls"] == p["guard_calls"] == 1 and p["eager_ops_outside"] == 0, p
    regional = Stack()
    for block in regional.blocks:
        block.compile(fullgraph=True, backend="eager")
    regional(x)
    p = coldstart.step_profile(lambda: regional(x), cpu, calls=2)
    assert p["region_calls"] == p["guard_calls"] == 3, p
    assert p["eager_ops_outside"] == 2 and p["eager_ops_outside_s"] > 0, p  # x + 1 and the sum, outside the blocks
    assert p["wall_s"] >= p["graph_s"] + p["region_wrapper_s"] + p["guard_s"] + p["eager_ops_outside_s"] > 0, p
    compile_tools.reset()


def test_counting_sees_a_data_dependent_branch():
    def branchy(x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # a Python `if` on a tensor value: dynamo breaks the graph here
            return x * 2
        return x - 1

    compile_tools.reset()
    fn = torch.compile(branchy, backend="eager")
    with compile_tools.counting() as c:
        assert torch.equal(fn(torch.ones(4)), torch.full((4,), 2.0))
    assert c.graph_breaks >= 1 and c.graphs >= 1, c
    assert c.graph_breaks == sum(c.break_reasons.values()) and 1 <= c.unimplemented <= c.graph_breaks
    assert any("data-dependent" in r.lower() for r in c.break_reasons), c.break_reasons  # filed as unimplemented
    compile_tools.reset()


def test_fresh_cache_makes_the_first_compile_cold_and_counts_cache_lookups():
    """Inductor (C++ on a CPU) once: a fresh cache misses, the same graph compiled again in it hits."""
    x = torch.randn(2, 4)
    with compile_tools.fresh_cache():
        compile_tools.reset()
        with compile_tools.counting() as cold:
            torch.compile(Tiny(), dynamic=False)(x)
        torch._dynamo.reset()  # forget the compiled graph, keep the on-disk cache of this block
        with compile_tools.counting() as warm:
            torch.compile(Tiny(), dynamic=False)(x)
    assert cold.cache_misses >= 1 and cold.cache_hits == 0, cold
    assert warm.cache_hits >= 1, warm


class _Rows:
    """A stand-in for a ResultWriter: keeps what record() was given."""

    def __init__(self) -> None:
        self.rows: dict[str, dict] = {}

    def record(self, scenario: str, **fields) -> None:
        self.rows[scenario] = fields


def test_measure_compile_counts_the_first_call_the_pipeline_and_later_calls_and_restores_the_stance():
    compile_tools.reset()
    m, x = Tiny(), torch.randn(2, 4)
    eager_out = m(x).detach().clone()
    m.compile(fullgraph=True, backend="eager")

    def pipeline():  # a "pipeline": the compiled module called several times with the same shapes
        return [m(x) for _ in range(3)]

    r = compile_tools.measure_compile(lambda: m(x), pipeline, eager_out, torch.device("cpu"), mode="default",
                                      repeats=2, warmup=1)
    assert r.first.graphs == 1 and r.pipe_first.graphs == 0 and r.later.graphs == 0
    assert r.rel_error == 0 and r.finite and r.mode == "default" and r.emulate_precision_casts is False
    assert set(r.timed) == set(compile_tools.STEADY_CALLS) and all(len(t.samples_s) == 2 for t in r.timed.values())
    assert torch._dynamo.eval_frame._stance.stance == "default", "the stance is put back after timing"
    with compile_tools.precision_casts(True):  # the helper records the emulation it compiled under
        compile_tools.reset()
        compile_tools.uncompile(m).compile(fullgraph=True, backend="eager")
        assert compile_tools.measure_compile(lambda: m(x), pipeline, eager_out, torch.device("cpu"), mode="default",
                                             repeats=1, warmup=0).emulate_precision_casts is True


def test_force_eager_stance_runs_the_compiled_module_eagerly_without_compiling():
    compile_tools.reset()
    m, x = Tiny(), torch.randn(2, 4)
    m.compile(backend="eager")
    with compile_tools.counting() as c:
        compile_tools.run_as("eager step")
        m(x)
        compile_tools.run_as("compiled step")
        m(x)
    torch.compiler.set_stance("default")
    assert c.graphs == 1, "force_eager skipped dynamo; the compiled call compiled once"


def test_compiled_run_speedups_amdahl_payback_and_rows():
    from helpers.measure import Timing

    def t(*s: float) -> Timing:
        return Timing(samples_s=list(s), warmup=0, method="perf_counter")

    counts = compile_tools.CompileCounts(graphs=1, cache_misses=2)
    timed = {"eager step": t(0.2), "compiled step": t(0.1), "eager pipeline": t(1.0), "compiled pipeline": t(0.6)}
    r = compile_tools.CompiledRun("default", False, 10.1, counts, 1e-3, True, compile_tools.CompileCounts(),
                                  compile_tools.CompileCounts(), timed)
    assert r.speedup("step") == pytest.approx(2.0) and r.speedup("pipeline") == pytest.approx(1 / 0.6)
    assert r.step_share(4) == pytest.approx(0.8) and r.step_share(10) == 1.0
    assert r.amdahl(4) == pytest.approx(1 / (0.2 + 0.8 / 2))
    assert r.payback_images() == pytest.approx((10.1 - 0.1) / 0.4)
    slower = compile_tools.CompiledRun("default", False, 10.0, counts, 0.0, True, counts, counts,
                                       timed | {"compiled pipeline": t(2.0)})
    assert slower.payback_images() == float("inf")
    rows = _Rows()
    r.record(rows, "default, no precision-cast emulation", tolerance=3e-2, flops=10**9, peak_tflops=1.0)
    step = rows.rows["denoiser step compiled (default, no precision-cast emulation)"]
    whole = rows.rows["pipeline compiled (default, no precision-cast emulation)"]
    assert step["timing"] is timed["compiled step"] and step["speedup"] == pytest.approx(2.0)
    assert step["eager_samples_s"] == [0.2] and step["fraction_of_peak"] == pytest.approx(1e9 / 0.1 / 1e12)
    assert step["cache_misses_first_call"] == 2 and step["emulate_precision_casts"] is False
    assert whole["speedup"] == pytest.approx(1 / 0.6) and whole["eager_latency_median_s"] == 1.0
    assert r.summary()["rel. L2 error vs eager"] == "1.00e-03"
