"""helpers.lora: adapters in diffusers' format, the pre-swap check, the ordinary-load reference, and the library
behaviour that motivates the check."""

import pytest
import torch
from peft.utils import get_peft_model_state_dict

from helpers import compile_tools, lora, params, pipelines, workloads


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    pipe = pipelines.build_pipeline("flux-dev", "smoke", dtype=torch.float32)
    tmp = tmp_path_factory.mktemp("lora")
    layers = lora.target_layers(pipe.transformer)
    made = {r: lora.make_adapter(pipe, tmp / f"r{r}", r, seed=r) for r in (4, 8)}
    made["big"] = lora.make_adapter(pipe, tmp / "big", 16, seed=16)
    made["extra"] = lora.make_adapter(pipe, tmp / "extra", 4, seed=5,
                                      layers=layers + lora.target_layers(pipe.transformer, ("add_k_proj",)))
    made["subset"] = lora.make_adapter(pipe, tmp / "subset", 4, seed=6, layers=layers[:3])
    return made, layers


def _loaded(first, target_rank=8):
    pipe = pipelines.build_pipeline("flux-dev", "smoke", dtype=torch.float32)
    pipe.enable_lora_hotswap(target_rank=target_rank)
    pipe.load_lora_weights(str(first), adapter_name="style")
    return pipe


def test_adapter_files_match_peft_layout(files):
    made, layers = files
    assert layers and all(name.endswith(lora.ATTENTION_PROJECTIONS) for name in layers)
    sd = lora.read_adapter(made[4])
    assert lora.layer_ranks(sd) == {name: 4 for name in layers}
    pipe = pipelines.build_pipeline("flux-dev", "smoke", dtype=torch.float32)
    pipe.load_lora_weights(str(made[4]), adapter_name="a")
    ours = {k.removeprefix("transformer.") for k in sd}
    theirs = set(get_peft_model_state_dict(pipe.transformer, adapter_name="a"))
    assert ours == theirs, "our keys differ from peft's own state dict keys"
    assert sorted(lora.loaded_layers(pipe.transformer, "a")) == sorted(layers)
    net = pipe.transformer.get_submodule(layers[0])
    loaded_b = sd[f"transformer.{layers[0]}.lora_B.weight"]
    assert torch.equal(net.lora_B["a"].weight, loaded_b) and loaded_b.abs().max() > 0


def test_check_accepts_smaller_rank_and_subset(files):
    made, layers = files
    pipe = _loaded(made[8])
    assert lora.check_hotswap(made[4], pipe.transformer, "style", 8) == {n: 4 for n in layers}
    assert len(lora.check_hotswap(made["subset"], pipe.transformer, "style", 8)) == 3
    pipe.load_lora_weights(str(made[4]), adapter_name="style", hotswap=True)


def test_check_rejects_rank_above_target(files):
    made, _ = files
    pipe = _loaded(made[4])
    with pytest.raises(ValueError, match=r"big.*rank 16, above target_rank=8"):
        lora.check_hotswap(made["big"], pipe.transformer, "style", 8)


def test_check_rejects_untargeted_layer(files):
    made, _ = files
    pipe = _loaded(made[4])
    with pytest.raises(ValueError, match=r"extra.*add_k_proj.*is not a target of the loaded adapter 'style'"):
        lora.check_hotswap(made["extra"], pipe.transformer, "style", 8)


def test_check_rejects_unknown_adapter_and_empty_file(files, tmp_path):
    made, _ = files
    pipe = _loaded(made[4])
    with pytest.raises(ValueError, match="'other' is not loaded"):
        lora.check_hotswap(made[8], pipe.transformer, "other", 8)
    with pytest.raises(FileNotFoundError):
        lora.check_hotswap(tmp_path, pipe.transformer, "style", 8)


def test_library_alone_accepts_a_too_large_rank_and_drops_the_adapter_on_an_unknown_layer(files):
    """Why check_hotswap exists (diffusers 0.42.1, peft 0.21.2): if this starts failing, revisit the notebook's prose."""
    made, layers = files
    pipe = _loaded(made[4])
    pipe.load_lora_weights(str(made["big"]), adapter_name="style", hotswap=True)  # no error from the library
    assert pipe.transformer.get_submodule(layers[0]).lora_A["style"].weight.shape[0] == 16, "rank grew past 8"
    pipe = _loaded(made[4])
    with pytest.raises(RuntimeError, match="unexpected keys"):
        pipe.load_lora_weights(str(made["extra"]), adapter_name="style", hotswap=True)
    assert lora.loaded_layers(pipe.transformer, "style") == [], "the loaded adapter survived the failed swap"


def test_header_shapes_match_the_tensors(files):
    made, _ = files
    tensors = lora.read_adapter(made[8])
    assert lora.adapter_shapes(made[8]) == {k: list(v.shape) for k, v in tensors.items()}
    assert lora.layer_ranks(lora.adapter_shapes(made[8])) == lora.layer_ranks(tensors)


def _inputs(pipe):
    return pipelines.denoiser_inputs(pipe, height=64, width=64, max_sequence_length=16, guidance=3.5, seed=0)


def test_ordinary_load_restores_the_base_model_and_tells_adapters_apart(files):
    """The notebook's reference: hot-swapped == ordinary load of the same file, != ordinary load of another."""
    made, layers = files
    pipe = pipelines.build_pipeline("flux-dev", "smoke", dtype=torch.float32)
    call = workloads.denoiser_call(pipe, _inputs(pipe))
    base = workloads.first_output(call()).clone()
    fresh = {}
    for rank in (4, 8):
        with lora.ordinary_load(pipe, made[rank], f"fresh{rank}"):
            assert sorted(lora.loaded_layers(pipe.transformer, f"fresh{rank}")) == sorted(layers)
            fresh[rank] = workloads.first_output(call()).clone()
    assert lora.loaded_layers(pipe.transformer, "fresh8") == [] and not getattr(pipe.transformer, "peft_config", {})
    assert torch.equal(workloads.first_output(call()), base), "unloading did not restore the base model"
    pipe.enable_lora_hotswap(target_rank=8)  # allowed: no adapter is loaded any more
    pipe.load_lora_weights(str(made[4]), adapter_name="style")
    lora.check_hotswap(made[8], pipe.transformer, "style", 8)
    pipe.load_lora_weights(str(made[8]), adapter_name="style", hotswap=True)
    swapped = workloads.first_output(call())
    tol = compile_tools.PARITY_TOLERANCE["fp32"]
    assert compile_tools.relative_error(swapped, fresh[8]) <= tol
    assert compile_tools.relative_error(swapped, fresh[4]) > 10 * tol, "the reference cannot tell adapters apart"
    assert compile_tools.relative_error(swapped, base) > 10 * tol


def test_ordinary_load_unloads_even_when_the_block_fails(files):
    made, _ = files
    pipe = pipelines.build_pipeline("flux-dev", "smoke", dtype=torch.float32)
    with pytest.raises(RuntimeError, match="boom"), lora.ordinary_load(pipe, made[4], "x"):
        raise RuntimeError("boom")
    assert lora.loaded_layers(pipe.transformer, "x") == []


def _distance_of_file(pipe, folder, call, apart_from):
    """Independent re-measurement: load the saved file the ordinary way, distance to the nearest given output."""
    with lora.ordinary_load(pipe, folder, "remeasure"):
        out = workloads.first_output(call()).clone()
    return min(lora.output_distance(out, other) for other in apart_from)


def _assert_in_band(distance, gap, within=0.5):
    assert gap <= distance <= gap * (1 + within), f"distance {distance:.4g} outside [{gap:.4g}, {gap * (1 + within):.4g}]"


@pytest.mark.parametrize("dtype_name", ["fp32", "bf16"])
def test_separated_adapter_lands_at_the_intended_gap_and_keeps_the_parity_margin(tmp_path, dtype_name):
    """The scaled adapters' outputs are gap..1.5 gap from the base and from each other, re-measured from the files;
    so a model within the tolerance of one reference is more than 5 tolerances from every other (notebook 10)."""
    pipe = pipelines.build_pipeline("flux-dev", "smoke", dtype=params.DTYPES[dtype_name])
    call = workloads.denoiser_call(pipe, _inputs(pipe))
    base = workloads.first_output(call()).clone()
    tol = compile_tools.PARITY_TOLERANCE[dtype_name]
    gap = 8 * tol  # the smallest ADAPTER_GAP notebook 10 allows
    made = []
    for i, rank in enumerate((4, 8, 16)):
        earlier = [base] + [m.output for m in made]
        m = lora.separated_adapter(pipe, tmp_path / f"r{rank}", rank, seed=i, gap=gap, apart_from=earlier,
                                   output=lambda: workloads.first_output(call()))
        assert min(m.distances) == pytest.approx(_distance_of_file(pipe, m.folder, call, earlier), rel=1e-6)
        _assert_in_band(_distance_of_file(pipe, m.folder, call, earlier), gap)
        made.append(m)
    outs = [base] + [m.output for m in made]
    for a in range(len(outs)):
        for b in range(len(outs)):
            if a != b:  # in the notebook's own measure, both ways round
                assert compile_tools.relative_error(outs[a], outs[b]) >= gap
                # an output within tol of outs[a] (worst case: moved straight towards outs[b]) is > 5 tol from outs[b]
                worst = outs[a] + (outs[b] - outs[a]) * (tol * outs[a].float().norm() / (outs[b] - outs[a]).float().norm())
                assert compile_tools.relative_error(worst, outs[b]) > 5 * tol

    # a planted wrong value: the same random adapter at half the found scale, or twice it, is outside the band,
    # so the check above can fail (it does not pass whatever the scale)
    unit = lora.random_lora_state_dict(pipe.transformer, lora.target_layers(pipe.transformer), 16, seed=2,
                                       strength=1.0)
    for wrong in (0.5 * made[2].scale, 2 * made[2].scale):
        planted = lora.save_adapter(type(pipe), tmp_path / "planted", lora.scaled_state_dict(unit, wrong), 16)
        with pytest.raises(AssertionError, match="outside"):
            _assert_in_band(_distance_of_file(pipe, planted, call, [base] + [m.output for m in made[:2]]), gap)


def test_separated_adapter_says_when_no_scale_reaches_the_gap(tmp_path):
    pipe = pipelines.build_pipeline("flux-dev", "smoke", dtype=torch.float32)
    call = workloads.denoiser_call(pipe, _inputs(pipe))
    base = workloads.first_output(call()).clone()
    with pytest.raises(RuntimeError, match=r"no scale of the seed-0 rank-4 adapter puts its output between 50 and 75"):
        lora.separated_adapter(pipe, tmp_path / "far", 4, seed=0, gap=50.0, tries=4, apart_from=[base],
                               output=lambda: workloads.first_output(call()))
    with pytest.raises(ValueError, match="gap > 0"):
        lora.separated_adapter(pipe, tmp_path / "x", 4, seed=0, gap=0.0, apart_from=[base], output=call)


def test_adapters_share_one_alpha_so_their_scalings_differ(files):
    """Loaded the ordinary way, each layer scales B @ A by lora_alpha / r (16/4 = 4, 16/8 = 2): a swap between them
    must change the scaling, not only the weights. After a hot-swap the prepared model holds the new scaling."""
    made, layers = files
    pipe = pipelines.build_pipeline("flux-dev", "smoke", dtype=torch.float32)
    for r in (4, 8):
        pipe.load_lora_weights(str(made[r]), adapter_name=f"a{r}")
        assert pipe.transformer.get_submodule(layers[0]).scaling[f"a{r}"] == pytest.approx(lora.scaling(r))
    assert lora.scaling(4) != lora.scaling(8) == lora.LORA_ALPHA / 8
    swapped = _loaded(made[4])
    swapped.load_lora_weights(str(made[8]), adapter_name="style", hotswap=True)
    assert float(swapped.transformer.get_submodule(layers[0]).scaling["style"]) == pytest.approx(lora.scaling(8))


def test_the_update_keeps_its_strength_whatever_the_alpha():
    """B is drawn so that scaling x B @ A has the same size for any alpha (only the split between B and the
    scaling changes); a planted alpha that the draw ignores would change the product by alpha / rank."""
    pipe = pipelines.build_pipeline("flux-dev", "smoke", dtype=torch.float32)
    layer = lora.target_layers(pipe.transformer)[0]
    def update(alpha):
        sd = lora.random_lora_state_dict(pipe.transformer, [layer], 4, seed=1, alpha=alpha)
        return lora.scaling(4, alpha) * sd[f"{layer}.lora_B.weight"] @ sd[f"{layer}.lora_A.weight"]
    assert torch.allclose(update(4.0), update(16.0), rtol=1e-5, atol=1e-8)
    ignored = lora.scaling(4, 16.0) * update(4.0)  # planted: B drawn for alpha = rank, then scaled by 16 / 4
    assert not torch.allclose(update(16.0), ignored, rtol=1e-5, atol=1e-8)
