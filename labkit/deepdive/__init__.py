"""The scaling deep dive (07_scaling_deep_dive): what 04's launches hide, taken apart.

    exchange      what Horovod's gradient exchange adds to a step, beside a barrier, one group, tf.distribute
    timeline      Horovod Timeline: where each gradient's time goes
    linkbench     rank script: allreduce calibration and interleaved compute / synced steps
    vcluster      Horovod across the virtual cluster of scripts/vcluster.sh: runs, link bytes, calibration
    nodescale     weak scaling over node counts on that cluster, against the ring model
    tfdist_train  one worker of tf.distribute.MultiWorkerMirroredStrategy, for the comparison
    plans         what 07 launches on this machine (`labkit plan`, the notebook's first cell)

`__all__` names the library modules; linkbench is run by the ranks, not imported.
Builds on labkit.scale (04) and labkit.flops (03); nothing in labkit builds on it.
"""

__all__ = ["exchange", "nodescale", "plans", "tfdist_train", "timeline", "vcluster"]
