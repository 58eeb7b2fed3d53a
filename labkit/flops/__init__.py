"""labkit.flops."""
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
