"""Data-parallel training with Horovod, from one laptop to many nodes (04_horovod_scaling and its deep dive).

    launch        start Horovod ranks (horovodrun, mpirun, srun), stream results, kill the whole tree
    hvd_train     the one script the ranks run (python -m labkit.scale.hvd_train); imported by nothing
    scaling       `labkit scale`: images/s, speedup and efficiency per worker count, sync proof
    allreduce     the ring-allreduce cost model, its calibration, the extrapolation to many GPUs
    large_batch   one worker: throughput against batch size, and linear LR scaling with warmup
    probe         the machine's own parallel limit: N single-thread GEMM processes at once
    localscale    scaling on one machine taken apart: the exchange's cost, Gloo against MPI
    timeline      Horovod Timeline: where each gradient's time goes
    linkbench     rank script: allreduce calibration and interleaved compute / synced steps
    vcluster      Horovod across the virtual cluster of scripts/vcluster.sh: runs, link bytes, calibration
    nodescale     weak scaling over node counts on that cluster, against the ring model
    tfdist_train  one worker of tf.distribute.MultiWorkerMirroredStrategy, for the comparison
    gpu           the GPU path: one GPU per rank, mixed precision, model-FLOPs utilisation
    keras_single  a plain Keras training script (the learner's starting point in 04)
    keras_hvd     the same script made data-parallel with horovod.tensorflow.keras and model.fit
    keras_hvd_loop  the same as a custom loop with hvd.DistributedGradientTape
    fitbench      model.fit with Horovod's callbacks against the custom loop, in one launch (`labkit fit-bench`)

Uses labkit.flops (03) for model MACs and GPU peaks: a lesson may use an earlier lesson's API, never a later one's.
"""
