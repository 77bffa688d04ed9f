"""helpers.lora: adapters in diffusers' format, the pre-swap check, and the library behaviour that motivates it."""

import pytest
import torch
from peft.utils import get_peft_model_state_dict

from helpers import lora, pipelines


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
    lora.hotswap(pipe, made[4], "style", 8)


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


def test_relative_difference():
    b = torch.tensor([1.0, -2.0])
    assert lora.relative_difference(b, b) == 0.0
    assert lora.relative_difference(torch.tensor([1.0, -1.0]), b) == pytest.approx(0.5)
