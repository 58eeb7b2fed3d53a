"""ipywidgets explorers used by the notebooks, one submodule each:
  labkit.widgets.im2col  - kernel size / stride / padding / dilation -> patches, im2col shape, FLOPs (02_im2col)
  labkit.widgets.kernels - hand-picked convolution kernels applied to a real image (01_cnn_basics)
  labkit.widgets.scaling - GPUs / model / GPU type / network / overlap -> predicted scaling efficiency
                           (04_horovod_scaling)
"""

__all__ = ["im2col", "kernels", "scaling"]
