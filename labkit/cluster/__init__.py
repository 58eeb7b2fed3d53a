"""Training on the cluster (08_training_on_the_cluster): what 04's throughput leaves out, measured on real workers.

    tta_train   the script every Horovod rank runs: train to a target, validate on every rank's shard
    tta         time to accuracy: launches per worker count, with and without LR scaling and warmup; the plot
    resume_start, resume_hvd   the resume exercise's Keras script without a checkpoint, and made resumable (run by
                the ranks)
    elastic     Horovod Elastic on the virtual cluster: a node taken away and given back mid-run, the time lost

`__all__` names the library modules; tta_train is run by the ranks, not imported.
Builds on labkit.scale (04: the launcher) and labkit.base (the warmup schedule, the one writer), elastic also on 07's
virtual cluster (labkit.deepdive.vcluster); nothing in labkit builds on it.
"""

__all__ = ["elastic", "tta"]
