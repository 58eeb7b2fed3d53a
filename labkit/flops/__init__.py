"""Counting the work: parameters, MACs, FLOPs, memory, and the hardware that runs them (03_flops).

    counter     per-layer params, MACs, FLOPs and activation memory of any Keras model (this package's API)
    profiler    TensorFlow's own FLOP count: the oracle the counter is tested against
    hardware    GPUs and interconnects from their datasheets, and a roofline estimate of CNN time on them
"""
from labkit.flops.counter import (  # noqa: F401  (the package's API)
    ALL_COSTS,
    BYTES_PER_VALUE,
    FlopsReport,
    LayerCount,
    UnknownLayerWarning,
    cli_main,
    count,
    count_named,
    max_batch_size,
    memory_table,
    shapes_only,
    training_flops,
    training_state_bytes,
)

__all__ = [
    "ALL_COSTS",
    "BYTES_PER_VALUE",
    "FlopsReport",
    "LayerCount",
    "UnknownLayerWarning",
    "cli_main",
    "count",
    "count_named",
    "max_batch_size",
    "memory_table",
    "shapes_only",
    "training_flops",
    "training_state_bytes",
]
