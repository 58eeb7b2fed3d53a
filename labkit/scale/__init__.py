"""Data-parallel training with Horovod, from one laptop to many nodes (04_horovod_scaling).

    horovod_info  which Horovod this environment has: its horovodrun and what it was built with
    mpi           which MPI Horovod links (PyPI's Open MPI in .venv, or the system's) and its mpirun
    hosts         where the ranks run: hosts and slots, the launcher's choice, core binding
    launch        start Horovod ranks (horovodrun, mpirun, srun), stream results, kill the whole tree
    hvd_train     the one script the ranks run (python -m labkit.scale.hvd_train); imported by nothing
    settings      RunSettings: one run's settings, their defaults and checks, the workers' command line
    scaling       `labkit scale`: images/s, speedup and efficiency per worker count, sync proof
    allreduce     the ring-allreduce cost model, its calibration, the extrapolation to many GPUs
    large_batch   one worker: throughput against batch size, and linear LR scaling with warmup
    probe         the machine's own parallel limit: N single-thread GEMM processes at once
    localscale    scaling on one machine taken apart: the machine's limit, the exchange, Gloo against MPI
    gpu           the GPU path: one GPU per rank, mixed precision, model-FLOPs utilisation
    plans         what 04 launches on this machine: worker counts, batch per worker (`labkit plan`)
    keras_single  a plain Keras training script (the learner's starting point in 04)
    keras_hvd     the same script made data-parallel with horovod.tensorflow.keras and model.fit
    keras_hvd_loop  the same as a custom loop with hvd.DistributedGradientTape

`__all__` names the library modules; hvd_train and the keras_* scripts are run, not imported.
Uses labkit.flops (03) for model MACs and GPU peaks: a lesson may use an earlier lesson's API, never a later one's.
The deep dive of 07 (labkit.deepdive) builds on it.
"""

__all__ = ["allreduce", "gpu", "horovod_info", "hosts", "large_batch", "launch", "localscale", "mpi", "plans", "probe",
           "scaling", "settings"]
