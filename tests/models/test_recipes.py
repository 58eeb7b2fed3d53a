"""labkit.models.recipes: the sources' training options, scaled to the profile."""
import pytest

from labkit.models import recipes


def test_options_follow_the_seeds_and_profile():
    full = recipes.sweep_options("full")
    assert (full["lr"], full["drop_factor"], full["drop_period"], full["l2"], full["epochs"], full["batch_size"]) \
        == (0.001, 0.1, 30, 0.004, 40, 100)
    quick = recipes.sweep_options("quick")
    assert quick["epochs"] < full["epochs"] and quick["n_train"] < full["n_train"]
    assert quick["drop_period"] < quick["epochs"]  # the drop still happens, as in the paper
    s2 = recipes.convblock_options("full", num_gpus=4)
    assert (s2["batch_size"], s2["lr"], s2["epochs"], s2["drop_period"]) == (1024, pytest.approx(0.4), 50, 45)
    assert s2["augment"] is True


@pytest.mark.parametrize("profile, epochs, n_train", [("quick", 0, 0), ("workshop", 1, 512), ("full", 1, 512)])
def test_smoke_scale_shrinks_the_conv_block_training_and_leaves_quicks_omission(monkeypatch, profile, epochs, n_train):
    """quick does not train the conv-block network; at smoke scale it still does not (the 1-CPU box and the
    read-only course run 01 in quick at smoke scale), while workshop and full train it for one small epoch."""
    monkeypatch.setenv("LABKIT_SMOKE", "1")
    opts = recipes.convblock_options(profile)
    assert (opts["epochs"], opts["n_train"]) == (epochs, n_train)
    monkeypatch.setenv("LABKIT_SMOKE", "0")
    assert recipes.convblock_options(profile)["epochs"] == {"quick": 0, "workshop": 4, "full": 50}[profile]


def test_importing_the_recipes_leaves_tensorflow_unloaded():
    import subprocess
    import sys
    code = "import sys, labkit.models.recipes as r; r.sweep_options('full'); print('tensorflow' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"
