"""Unit tests of helpers.graph_breaks' break report, blockwise fp32 reference and return_dict tracing (CPU, seconds)."""

import io

import torch
from diffusers import FluxTransformer2DModel

from helpers import graph_breaks


def _tiny_flux(layers: int = 2, single_layers: int = 2):
    torch.manual_seed(0)
    model = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=layers, num_single_layers=single_layers,
                                   attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                   pooled_projection_dim=32, guidance_embeds=False, axes_dims_rope=(4, 6, 6)).eval()
    inputs = {"hidden_states": torch.randn(1, 16, 16), "encoder_hidden_states": torch.randn(1, 8, 32),
              "pooled_projections": torch.randn(1, 32), "timestep": torch.ones(1), "img_ids": torch.zeros(16, 3),
              "txt_ids": torch.zeros(8, 3), "return_dict": False}
    return model, inputs


def test_blockwise_fp32_reference_equals_a_whole_fp32_model():
    model, inputs = _tiny_flux()
    model.to(torch.bfloat16)
    low = {k: v.to(torch.bfloat16) if torch.is_tensor(v) else v for k, v in inputs.items()}
    before = [p.detach().clone() for p in model.parameters()]
    out = graph_breaks.fp32_reference(model, low)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    whole = model.float()
    with torch.no_grad():
        expected = whole(**{k: v.float() if torch.is_tensor(v) else v for k, v in low.items()})[0]
    assert out.dtype == torch.float32 and torch.equal(out, expected)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules()), "hooks must be removed"


def test_fp32_upcast_bytes_counts_one_block_and_the_rest():
    model, _ = _tiny_flux()
    blocks = [*model.transformer_blocks, *model.single_transformer_blocks]
    numel = [sum(p.numel() for p in b.parameters()) for b in blocks]
    total = sum(p.numel() for p in model.parameters())
    assert graph_breaks.fp32_upcast_bytes(model) == 4 * (total - sum(numel) + max(numel))
    assert graph_breaks.fp32_upcast_bytes(model) < 4 * total
    assert graph_breaks.fp32_reference_unavailable_reason(model) == ""  # a CPU has no such limit


def test_break_report_tables_add_up():
    model, inputs = _tiny_flux()
    graph_breaks.plant_breaks(model, io.StringIO())
    found = graph_breaks.find_breaks(model, inputs)
    assert len(found.graphs) == found.explain_graphs == found.explain_breaks + 1
    assert sum(g["ends with"].startswith("break") for g in found.graphs) == len(found.explain_reasons)
    by_key = {k: sum(e["count"] for e in found.counter_entries if e["counter key"] == k)
              for k in ("graph_break", "unimplemented")}
    assert by_key == {"graph_break": found.counter_graph_breaks, "unimplemented": found.counter_unimplemented}
    assert {e["planted kind"] for e in found.counter_entries} == set(graph_breaks.PLANTED)
    # the print in a block sits inside FluxTransformer2DModel.forward's loop over blocks: that frame is given up
    assert any(e["graph break in a loop"] for e in found.counter_entries)
    assert any(f.startswith("forward (transformer_flux.py") for f in found.frames_given_up), found.frames_given_up

    graph_breaks.apply_fixes(model, io.StringIO())
    fixed = graph_breaks.find_breaks(model, inputs)
    assert fixed.frames_given_up == [] and fixed.counter_entries == [] and len(fixed.graphs) == 1
    assert fixed.graphs[0]["ends with"] == "return"


def test_return_dict_output_dataclass_traces_without_a_break():
    model, inputs = _tiny_flux(1, 1)
    found = graph_breaks.find_breaks(model, {**inputs, "return_dict": True})
    assert found.explain_graphs == 1 and found.breaks == 0 and found.counter_unimplemented == 0
