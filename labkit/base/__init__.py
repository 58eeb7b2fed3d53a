"""The base every lesson stands on (00_welcome, 01_cnn_basics): configuration, the machine, timing, training.

    config      run profile (quick / workshop / full), seeds, the data directory
    machine     usable cores, thread limits, numpy's BLAS, TensorFlow's oneDNN switch
    timing      timing done right: warm-up, repeats, load average, the machine's GEMM rate
    horovod     which Horovod this environment has: its horovodrun and what it was built with
    mpi         which MPI Horovod links (PyPI's Open MPI in .venv, or the system's) and the mpirun that goes with it
    doctor      `labkit doctor`: what is installed and working, with a one-line fix for each problem
    training    the training step, LR schedules, live progress, resume, evaluation
    progress    progress bars whose final state is what a saved notebook keeps
    rankstats   per-rank results of a data-parallel run: weights checksum, step-time summary
    resultsfile the one writer of every file labkit writes (atomic, symlinks followed, space checked first);
                the sweep's results file (JSON lines, locked, merged) on top

The base imports no lesson package; the lessons (conv, flops, scale, sweep, transfer) import it.
"""
