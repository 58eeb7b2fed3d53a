"""Convolution as one matrix multiply (02_im2col).

    numpy_engine  the naive loops, im2col + one GEMM, the GEMM-based backward pass (this package's API)
    tf_engine     the same im2col method with TensorFlow's gather and matmul (engine="tf")
    shapes        output sizes by TensorFlow's rules, the argument checks, the chunk size
    bench         `labkit conv-bench`: naive / im2col / tf.nn.conv2d / bare GEMM on ResNet-50's layers
    plans         what 02 runs on this machine (`labkit plan`, the notebook's first cell)
"""
from labkit.conv.numpy_engine import (  # noqa: F401  (the package's API)
    CHUNK_BYTES,
    ENGINES,
    MIN_CHUNK_ROWS,
    PADDING_HELP,
    PARALLEL_MIN_ROWS,
    WORKSPACE_BYTES,
    ConvGeometry,
    blas_threads,
    col2im,
    conv2d_im2col,
    conv2d_im2col_backward,
    conv2d_naive,
    geometry,
    im2col,
    plan,
)

__all__ = [
    "CHUNK_BYTES",
    "ConvGeometry",
    "ENGINES",
    "MIN_CHUNK_ROWS",
    "PADDING_HELP",
    "PARALLEL_MIN_ROWS",
    "WORKSPACE_BYTES",
    "blas_threads",
    "col2im",
    "conv2d_im2col",
    "conv2d_im2col_backward",
    "conv2d_naive",
    "geometry",
    "im2col",
    "plan",
]
