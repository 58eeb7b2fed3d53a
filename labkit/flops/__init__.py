"""Counting the work: parameters, MACs, FLOPs, memory, and the hardware that runs them (03_flops).

    counter     per-layer params, MACs, FLOPs and activation memory of any Keras model (this package's API)
    profiler    TensorFlow's own FLOP count: the oracle the counter is tested against
    hardware    GPUs and interconnects from their datasheets, and a roofline estimate of CNN time on them
"""
from labkit.flops.counter import (  # noqa: F401  (the package's API)
    BYTES_PER_VALUE,
    ALL_COSTS,
    UnknownLayerWarning,
    LayerCount,
    FlopsReport,
    count,
    shapes_only,
    count_named,
    training_state_bytes,
    max_batch_size,
    memory_table,
    training_flops,
    cli_main,
)
