"""SaveConfig / SaveConfigMode semantics (smdebug's) and collection defaults."""

import pytest
from trainguard import Collection, CollectionKeys, SaveConfig, SaveConfigMode, modes
from trainguard.hook.config import DEFAULT_TENSOR_INTERVAL, build_collections, default_collection


def due(cfg: SaveConfig, mode, steps=range(30)):
    return [s for s in steps if cfg.should_save_step(mode, s)]


def test_interval_start_end():
    cfg = SaveConfig(save_interval=5, start_step=10, end_step=25)
    assert due(cfg, modes.TRAIN) == [10, 15, 20]


def test_save_steps_alone_and_with_interval():
    assert due(SaveConfig(save_steps=[3, 7]), modes.TRAIN) == [3, 7]
    assert due(SaveConfig(save_interval=10, save_steps=[3]), modes.TRAIN) == [0, 3, 10, 20]


def test_per_mode_configs_like_smdebug():
    cfg = SaveConfig(
        mode_save_configs={modes.TRAIN: SaveConfigMode(save_interval=2), "eval": {"save_interval": 3}},
        save_interval=7,
    )
    assert due(cfg, modes.TRAIN, range(7)) == [0, 2, 4, 6]
    assert due(cfg, modes.EVAL, range(7)) == [0, 3, 6]
    assert due(cfg, modes.PREDICT, range(15)) == [0, 7, 14]


@pytest.mark.parametrize("bad", [0, -1, 1.5])
def test_bad_interval_rejected_with_clear_message(bad):
    with pytest.raises(ValueError, match="save_interval must be a positive integer"):
        SaveConfigMode(save_interval=bad)


def test_positional_interval_gets_a_clear_error():
    with pytest.raises(TypeError, match=r"did you mean SaveConfig\(save_interval=10\)"):
        SaveConfig(10)


def test_defaults_scalars_every_step_tensors_every_10():
    cols = build_collections(None, None, None, None)
    assert set(cols) == set(CollectionKeys.DEFAULT_INCLUDED)
    assert due(cols["losses"].save_config, modes.TRAIN, range(5)) == [0, 1, 2, 3, 4]
    assert due(cols["gradients"].save_config, modes.TRAIN, range(120)) == [0, 50, 100]
    assert DEFAULT_TENSOR_INTERVAL == 50
    assert cols["gradients"].percentiles == (5.0, 50.0, 95.0)
    assert cols["relu_output"].unit_active
    assert default_collection("tanh_input").unit_band == (-9.4999, 9.4999)
    assert default_collection("sigmoid_input").unit_band == (-23.0, 16.99999)
    assert default_collection("labels").values


def test_hook_save_config_applies_to_collections_without_their_own():
    own = Collection("gradients", SaveConfig(save_interval=3), save_full=True)
    cols = build_collections(["losses", "weights"], ["fc.*"], SaveConfig(save_interval=4), [own])
    assert due(cols["losses"].save_config, modes.TRAIN, range(9)) == [0, 4, 8]
    assert due(cols["gradients"].save_config, modes.TRAIN, range(7)) == [0, 3, 6]
    assert cols["gradients"].save_full
    assert cols["default"].include_regex == ["fc.*"]
