"""labkit.conv."""
from labkit.conv.numpy_engine import (  # noqa: F401  (the package's API)
    CHUNK_BYTES,
    MIN_CHUNK_ROWS,
    PADDING_HELP,
    ConvGeometry,
    geometry,
    PARALLEL_MIN_ROWS,
    conv2d_naive,
    WORKSPACE_BYTES,
    im2col,
    col2im,
    blas_threads,
    plan,
    ENGINES,
    conv2d_im2col,
    conv2d_im2col_backward,
)
