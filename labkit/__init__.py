"""labkit: the helper package behind the high-performance CNN training course.

Its folders are the course's chapters:

    base/       00, 01: configuration, the machine, timing, training, the plans' mechanism
    data/       01 on: CIFAR-10 verified before it is read, and an offline set
    models/     01, 03: every network the course builds, by name
    conv/       02_im2col: convolution as one matrix multiply
    flops/      03_flops: parameters, MACs, FLOPs, memory, hardware
    scale/      04_horovod_scaling and its deep dive: Horovod data-parallel training
    sweep/      05_network_sweep: 16 networks in parallel workers, the Pareto front
    transfer/   06_transfer_learning: freezing and per-layer learning rates
    deepdive/   07_scaling_deep_dive: what 04's launches hide, taken apart
    exercises/  the exercises' checkers and the learner edition
    widgets/    the notebooks' interactive explorers
    doctor.py   `labkit doctor`: Python, TensorFlow, Horovod, GPUs, cores, memory, disk and data, checked
    plan.py     `labkit plan`: every lesson's launches on this machine
    cli.py      the `labkit` command: a thin shell over the packages

Imports point down the course: the base imports no lesson; a lesson may use an earlier lesson's API.

Importing labkit first keeps TensorFlow's C++ start-up log lines (oneDNN, CPU features) out of notebook
outputs; labkit.quiet() does the same for TensorFlow's Python-side warnings once TF is imported.
"""
import os as _os

# Must be set before TensorFlow is imported anywhere in the process (00_welcome). Only the log level:
# TensorFlow's performance features (oneDNN included) stay as a user runs them; the oneDNN start-up line is
# an INFO log, which level 2 already hides.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

__version__ = "0.1.0"


def quiet():
    """Silence TensorFlow's Python loggers and deprecation chatter (learners read outputs)."""
    import logging
    import warnings

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    try:
        import absl.logging

        absl.logging.set_verbosity(absl.logging.ERROR)
    except ImportError:  # absl comes with TensorFlow; without TF there is nothing to silence
        pass
    try:
        import tensorflow as tf

        tf.get_logger().setLevel("ERROR")
        tf.autograph.set_verbosity(0)
    except ImportError:
        pass
