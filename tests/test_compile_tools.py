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
    w = coldstart.Workload("flux-dev", "smoke", "bf16", 0, 64, 64, 16, 3.5)
    with pytest.raises(ValueError, match="how="):
        coldstart.measure_fresh(w, "everything", "pipe.transformer.compile()", tmp_path, repeats=1, warmup=0, emulate_precision_casts=False)
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
