"""How the sources trained their CIFAR-10 networks, scaled to the run profile: the MATLAB cloud white paper's
options for its sweep family (sweep_net, 01's and 05's networks) and those of MATLAB's cloud-training example for
its conv-block network (convblock_net). (01_cnn_basics)

    from labkit.models import recipes
    opts = recipes.sweep_options()        # lr, momentum, drop_factor, drop_period, l2, epochs, batch_size, n_train...
    recipes.convblock_options("full", num_gpus=4)  # batch 256 per GPU, LR scaled with the batch
"""
from __future__ import annotations

from labkit.base import config

# trainingOptions of the MATLAB white paper "Deep Learning in the Cloud", verbatim
SWEEP_TRAINING = {"lr": 0.001, "momentum": 0.9, "drop_factor": 0.1, "drop_period": 30, "l2": 0.004, "epochs": 40,
                  "batch_size": 100}
# the options of MATLAB's example "Train Network in the Cloud Using Automatic Parallel Support", one GPU: batch 256,
# LR 0.1 x batch/256, 50 epochs, drop x0.1 at 45, L2 1e-10
CONVBLOCK_TRAINING = {"lr": 0.1, "momentum": 0.9, "drop_factor": 0.1, "drop_period": 45, "l2": 1e-10, "epochs": 50,
                      "batch_size": 256, "augment": True}


def sweep_options(profile: str | None = None) -> dict:
    """The options of the MATLAB cloud white paper scaled to the profile: fewer epochs and images, so a larger LR
    to make up for it. (01_cnn_basics)

    full is the paper's recipe on all of CIFAR-10 (40 epochs x 500 steps of LR 0.001). quick and workshop take
    ~1/100 and ~1/20 of the steps, so they start at a larger LR (0.02, 0.01) and still drop it x0.1 before the
    end, as the paper does.
    """
    opts = dict(SWEEP_TRAINING, augment=False)
    opts.update(config.by_profile(
        quick={"lr": 0.02, "epochs": 4, "drop_period": 3, "n_train": 5000, "n_test": 1000},
        workshop={"lr": 0.01, "epochs": 10, "drop_period": 8, "n_train": 10000, "n_test": 2000},
        full={"n_train": 50000, "n_test": 10000},
        smoke={"lr": 0.02, "epochs": 10, "drop_period": 8, "n_train": 1000, "n_test": 500}, name=profile))
    return opts


def convblock_options(profile: str | None = None, num_gpus: int = 1) -> dict:
    """The options of MATLAB's cloud-training example (batch 256 per GPU, LR scaled with batch); full reproduces
    its 0.8938 set-up. (01_cnn_basics)

    It costs ~17x the FLOPs per image of the MATLAB cloud white paper's network: quick skips training it (epochs
    0), workshop runs a token amount.
    """
    from labkit.base.training import scaled_lr  # here: importing the recipes does not load TensorFlow
    opts = dict(CONVBLOCK_TRAINING)
    opts["batch_size"] = 256 * num_gpus
    opts["lr"] = scaled_lr(0.1, opts["batch_size"], base_batch_size=256)
    opts["bn_momentum"] = 0.99  # Keras's default; the workshop's ~120 steps need faster-moving test statistics
    opts.update(config.by_profile(quick={"batch_size": 100, "lr": 0.05},
                                  workshop={"batch_size": 100, "lr": 0.05, "bn_momentum": 0.9}, full={}, name=profile))
    # the sizes one by one, so that what quick leaves out (it trains nothing: 0) stays out at smoke scale
    # (config.by_profile's rule, which a dict of sizes would bypass)
    sizes = {"epochs": (0, 4, opts["epochs"], 1), "drop_period": (1, 3, opts["drop_period"], 1),
             "n_train": (0, 3000, 50000, 512), "n_test": (0, 1000, 10000, 256)}
    for key, (quick, workshop, full, smoke) in sizes.items():
        opts[key] = config.by_profile(quick=quick, workshop=workshop, full=full, smoke=smoke, name=profile)
    return opts
