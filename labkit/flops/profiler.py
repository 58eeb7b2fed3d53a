"""TensorFlow's own FLOP count of a Keras model: the oracle labkit.flops is tested against (03_flops).

    from labkit import flops
    from labkit.flops import profiler as flops_tf
    by_op = flops_tf.tf_profiler_flops(model)     # {op type: float_ops} of the frozen inference graph
    assert sum(by_op.get(op, 0) for op in flops_tf.TF_MAC_OPS) == flops.count(model).flops
"""
from __future__ import annotations

from labkit.flops.counter import _is_model

# the profiler's op types whose float_ops are 2 x the MACs of labkit's conv and dense rows
TF_MAC_OPS = ("Conv2D", "Conv3D", "DepthwiseConv2dNative", "Conv2DBackpropInput", "MatMul", "BatchMatMulV2")


def tf_profiler_flops(model) -> dict:
    """TensorFlow's profiler count of the model's frozen inference graph at batch 1: {op type: float_ops}.

    The oracle for count(): its TF_MAC_OPS entries (Conv2D, MatMul, ...) add up to 2 x MACs; BiasAdd,
    MaxPool/AvgPool/Mean, AddV2 and Softmax are the optional costs. The profiler has no rule for
    ReLU or fused batch norm. Freezing embeds every weight in the graph and TensorFlow's converter needs
    about 40 bytes per parameter: prefer small models and input sizes.
    """
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    if not _is_model(model):
        raise TypeError(f"model must be a built tf.keras Model; got {type(model).__name__}")
    # Keras runs grouped convolutions inside an XLA-compiled function the profiler cannot see into;
    # trace them as plain Conv2D ops instead (only traced here, never executed).
    patched = [layer for layer in model._flatten_layers(include_self=False)
               if getattr(layer, "groups", 1) > 1 and hasattr(layer, "convolution_op")]
    for layer in patched:
        layer._jit_compiled_convolution_op = layer.convolution_op
    try:
        specs = [tf.TensorSpec((1,) + tuple(t.shape[1:]), t.dtype) for t in model.inputs]
        fn = tf.function(lambda *x: model(list(x) if len(x) > 1 else x[0], training=False))
        frozen = convert_variables_to_constants_v2(fn.get_concrete_function(*specs))
    finally:
        for layer in patched:
            del layer._jit_compiled_convolution_op
    graph = frozen.graph
    builder = tf.compat.v1.profiler.ProfileOptionBuilder
    options = builder(builder.float_operation()).with_empty_output().build()
    profile = tf.compat.v1.profiler.profile(graph=graph, cmd="scope", options=options)
    by_type: dict = {}
    stack = list(profile.children)  # the scope view nests ops whose names extend another op's name
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.float_ops:
            op_type = graph.get_operation_by_name(node.name).type
            by_type[op_type] = by_type.get(op_type, 0) + int(node.float_ops)
    return by_type
