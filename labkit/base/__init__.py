"""The base every lesson stands on (00_welcome, 01_cnn_basics): configuration, the machine, timing, training.

    checks      the one validator of numeric arguments: one line naming the parameter
    config      run profile (quick / workshop / full), seeds, the data directory
    machine     usable cores, thread limits, numpy's BLAS, TensorFlow's oneDNN switch
    blas        one line when numpy's BLAS runs a generic kernel on a CPU that has better
    timing      timing done right: warm-up, repeats, load average, the machine's GEMM rate
    observe     invariants and observations: what this machine showed against the reference machine, in one line
    plans       launches fitted to this machine's cores, memory and load (each lesson's own: its plans module)
    pixels      the pixel transform every model sees (CIFAR-10's per-channel mean and std)
    training    the training step, LR schedules, live progress, resume, evaluation
    progress    progress bars whose final state is what a saved notebook keeps
    rankstats   per-rank results of a data-parallel run: weights checksum, step-time summary
    resultsfile the one writer of every file labkit writes (atomic, symlinks followed, space checked first),
                and the lock for a file that several processes update

The base imports nothing of labkit but itself (tests/test_layers.py reads every import, those inside functions too).
"""

__all__ = ["blas", "checks", "config", "machine", "observe", "pixels", "plans", "progress", "rankstats", "resultsfile",
           "timing", "training"]
