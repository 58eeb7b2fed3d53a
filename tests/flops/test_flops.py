"""labkit.flops against published tables (typed in from the sources) and TensorFlow's own profiler."""
from __future__ import annotations

import json

import pytest

import labkit  # noqa: F401
import labkit.models
from labkit.flops import counter as flops
from labkit.flops import profiler as flops_tf

tf = pytest.importorskip("tensorflow")
L = tf.keras.layers
ALL = dict(count_bias=True, count_bn=True, count_activations=True, count_pooling=True, count_elementwise=True)


# ---------------------------------------------------------------- published numbers
def test_vgg16_macs_exact():
    # 15.47 G MACs = 15,470,264,320 at 224x224 (the PyTorch torchvision documentation, VGG16_Weights: "GFLOPS 15.47")
    report = flops.count_named("vgg16")
    assert report.macs == 15_470_264_320
    assert report.flops == 2 * report.macs


@pytest.mark.parametrize("name,gmacs", [("vgg11", 7.61), ("vgg13", 11.31), ("vgg19", 19.63),
                                         ("alexnet", 0.71), ("resnet50_v1.5", 4.09)])
def test_macs_match_torchvision_table(name, gmacs):
    # the PyTorch torchvision documentation's model tables (torchvision.models, "GFLOPS" column) call these
    # "GFLOPS" but count multiply-adds
    assert round(flops.count_named(name).macs / 1e9, 2) == gmacs


@pytest.mark.parametrize("name,gmacs", [
    ("resnet18", 1.8), ("resnet34", 3.6), ("resnet50", 3.8),
    pytest.param("resnet101", 7.6, marks=pytest.mark.slow),
    pytest.param("resnet152", 11.3, marks=pytest.mark.slow),
])
def test_resnets_match_he_et_al_table_1(name, gmacs):
    # He, Zhang, Ren & Sun 2016, "Deep Residual Learning for Image Recognition", Table 1 "FLOPs"
    # (multiply-adds x 10^9), printed with one decimal: within 2 %
    macs = flops.count_named(name).macs / 1e9
    assert abs(macs - gmacs) / gmacs < 0.02


def test_resnet50_v1_vs_v1_5():
    # v1 (Keras, Caffe) strides the first 1x1 conv of a stage; v1.5 the 3x3: 3.86 vs 4.09 G MACs
    assert round(flops.count_named("resnet50").macs / 1e9, 2) == 3.86
    assert round(flops.count_named("resnet50_v1.5").macs / 1e9, 2) == 4.09


def test_alexnet_grouped_macs_by_hand_and_the_lectures_1_5_gflops():
    # output H x W x C_out x k x k x C_in / groups per conv layer, then the three FC layers (paper's shapes)
    conv = [(55, 96, 11, 3), (27, 256, 5, 48), (13, 384, 3, 256), (13, 384, 3, 192), (13, 256, 3, 192)]
    expected = sum(h * h * c_out * k * k * c_in for h, c_out, k, c_in in conv) + 9216 * 4096 + 4096 * 4096 + 4096 * 1000
    report = flops.count_named("alexnet_grouped")
    assert report.macs == expected
    assert round(report.macs / 1e9, 2) == 0.72
    # the lecture's "1.5 GFLOPS" is 2 x 0.72 G MACs = 1.45 GFLOPs (within 5 %), not the MACs (52 % off)
    assert abs(report.flops / 1e9 - 1.5) / 1.5 < 0.05
    assert abs(report.macs / 1e9 - 1.5) / 1.5 > 0.5


def test_lecture_vgg_50_epochs_exceeds_an_exaflop():
    # "Training VGG for 50 epochs on ImageNet uses more than 1 ExaFlop": 1,281,167 training images (ILSVRC-2012)
    total = flops.training_flops(flops.count_named("vgg16"), images=1_281_167, epochs=50)
    assert total == pytest.approx(3 * 2 * 15.47e9 * 1_281_167 * 50, rel=1e-3)
    assert total > 1e18


def test_params_equal_keras_count_params():
    model = labkit.models.get("resnet18", input_shape=(32, 32, 3), classes=10)
    report = flops.count(model)
    assert report.params == model.count_params()
    assert report.trainable_params == sum(int(tf.size(w)) for w in model.trainable_weights)


# ---------------------------------------------------------------- TensorFlow's profiler as oracle
def _mixed_model():
    """Grouped, strided non-square, dilated, depthwise, separable, transposed convs and a nested model."""
    x = tf.keras.Input((20, 18, 6))
    y = L.Conv2D(8, (3, 5), strides=(2, 1), padding="same", groups=2)(x)
    y = L.Conv2D(8, 3, dilation_rate=2, padding="valid", activation="relu")(y)
    y = L.DepthwiseConv2D(3, depth_multiplier=2, padding="same")(y)
    y = L.SeparableConv2D(12, 3, strides=2, padding="same")(y)
    y = L.Conv2DTranspose(6, 3, strides=2, padding="same")(y)
    y = L.AveragePooling2D(2, padding="same")(y)
    inner = tf.keras.Sequential([tf.keras.Input(y.shape[1:]), L.Conv2D(4, 1), L.BatchNormalization()],
                                name="inner")
    y = L.Concatenate()([inner(y), y])
    y = L.Flatten()(y)
    y = L.Dense(7, activation="softmax")(y)
    return tf.keras.Model(x, y, name="mixed")


def _conv1d_model():
    x = tf.keras.Input((30, 4))
    y = L.Conv1D(6, 5, strides=2, padding="same")(x)
    y = L.MaxPooling1D(2)(y)
    return tf.keras.Model(x, L.Dense(3)(L.Flatten()(y)), name="conv1d")


PROFILER_MODELS = {
    "mixed": _mixed_model,
    "conv1d": _conv1d_model,
    "resnet18": lambda: labkit.models.get("resnet18", input_shape=(32, 32, 3), classes=10),
    "resnet50": lambda: labkit.models.get("resnet50", input_shape=(32, 32, 3), classes=10),
    "alexnet_grouped": lambda: labkit.models.get("alexnet_grouped", input_shape=(67, 67, 3), classes=10),
}


@pytest.fixture(scope="module")
def profiled():
    cache = {}

    def get(name):
        if name not in cache:
            model = PROFILER_MODELS[name]()
            cache[name] = (model, flops_tf.tf_profiler_flops(model))
        return cache[name]

    return get


@pytest.mark.parametrize("name", sorted(PROFILER_MODELS))
def test_conv_and_dense_flops_equal_tf_profiler(name, profiled):
    model, by_type = profiled(name)
    report = flops.count(model)
    assert report.complete
    tf_conv_dense = sum(by_type.get(op, 0) for op in flops_tf.TF_MAC_OPS)
    assert tf_conv_dense > 0
    assert report.flops == 2 * report.macs == tf_conv_dense


@pytest.mark.parametrize("name", ["resnet50", "alexnet_grouped", "mixed"])
def test_optional_costs_follow_tf_profiler_rules(name, profiled):
    model, by_type = profiled(name)
    base = flops.count(model).flops
    assert flops.count(model, count_bias=True).flops - base == by_type.get("BiasAdd", 0)
    pool_ops = by_type.get("MaxPool", 0) + by_type.get("AvgPool", 0) + by_type.get("Mean", 0)
    assert flops.count(model, count_pooling=True).flops - base == pool_ops
    assert flops.count(model, count_elementwise=True).flops - base == by_type.get("AddV2", 0)


def test_options_are_off_by_default_and_add_up():
    model = PROFILER_MODELS["resnet18"]()
    base = flops.count(model)
    assert base.options == {k: False for k in ALL}
    each = sum(flops.count(model, **{k: True}).flops - base.flops for k in ALL)
    assert flops.count(model, **ALL).flops - base.flops == each > 0


# ---------------------------------------------------------------- hand-checked rules
def test_rules_by_hand():
    x = tf.keras.Input((8, 6, 4))
    y = L.Conv2D(10, (3, 2), strides=2, padding="valid", use_bias=False, name="c")(x)  # 3x3x10 output
    y = L.Conv2DTranspose(5, 3, strides=2, padding="same", name="t")(y)                # 6x6x5
    y = L.BatchNormalization(name="bn")(y)
    y = L.ReLU(name="r")(y)
    y = L.MaxPooling2D(2, name="p")(y)                                                  # 3x3x5
    y = L.GlobalAveragePooling2D(name="g")(y)
    y = L.Dense(4, activation="softmax", name="d")(y)
    rows = {r.name: r for r in flops.count(tf.keras.Model(x, y), **ALL).rows}
    assert rows["c"].macs == 3 * 3 * 10 * (3 * 2 * 4) and rows["c"].flops == 2 * rows["c"].macs
    assert rows["t"].macs == 3 * 3 * 10 * 9 * 5 and rows["t"].flops == 2 * rows["t"].macs + 6 * 6 * 5
    assert rows["bn"].flops == 2 * 6 * 6 * 5 and rows["bn"].params == 4 * 5
    assert rows["r"].flops == 6 * 6 * 5
    assert rows["p"].flops == 3 * 3 * 5 * 4
    assert rows["g"].flops == 3 * 3 * 5
    assert rows["d"].macs == 5 * 4 and rows["d"].flops == 2 * 20 + 4 + 5 * 4  # bias, softmax 5/element
    assert rows["c"].output_shape == (3, 3, 10) and rows["c"].activations == 90 and rows["c"].inputs == 192


def test_shared_layer_counts_macs_per_call_and_params_once():
    dense = L.Dense(3, name="shared")
    a, b = tf.keras.Input((5,)), tf.keras.Input((5,))
    model = tf.keras.Model([a, b], L.Add()([dense(a), dense(b)]))
    report = flops.count(model)
    shared = [r for r in report.rows if r.name == "shared"]
    assert len(shared) == 2 and sum(r.macs for r in shared) == 2 * 15
    assert report.params == model.count_params() == 18


def test_unknown_layer_is_listed_and_warned_never_silently_zero():
    x = tf.keras.Input((4, 4, 2))
    y = L.Lambda(lambda t: t * 2.0, name="double")(x)
    y = L.Dense(3)(L.Flatten()(y))
    with pytest.warns(flops.UnknownLayerWarning, match="double"):
        report = flops.count(tf.keras.Model(x, y))
    assert report.unknown == [("double", "Lambda")]
    assert not report.complete and "INCOMPLETE" in str(report)
    assert report.to_dict()["unknown_layers"] == [["double", "Lambda"]]


def test_dataframe_and_dict_have_contract_columns():
    report = flops.count(_conv1d_model())
    df = report.to_dataframe()
    for column in ("name", "type", "output_shape", "params", "macs", "flops", "activations"):
        assert column in df.columns
    assert df["macs"].sum() == report.macs and len(df) == len(report.rows)
    d = report.to_dict()
    assert {"model", "params", "macs", "flops", "layers"} <= set(d)
    json.dumps(d)


# ---------------------------------------------------------------- memory
def test_memory_by_hand():
    x = tf.keras.Input((4, 4, 3))
    y = L.Conv2D(2, 3, padding="same", name="c")(x)   # 32 outputs, 56 params
    y = L.Flatten(name="f")(y)                          # a view: no new memory
    y = L.Dense(5, name="d")(y)                         # 5 outputs, 165 params
    report = flops.count(tf.keras.Model(x, y))
    assert report.param_bytes == 4 * (56 + 165)
    assert report.activation_bytes(training=True) == 4 * (48 + 32 + 5)
    assert report.activation_bytes(training=False) == 4 * (48 + 32)
    state = flops.training_state_bytes(report, optimizer_slots=1)  # weights, gradients, momentum
    assert state == 3 * 4 * 221
    memory = state + 10 * 4 * 85 + 7
    assert flops.max_batch_size(report, memory) == 10
    assert flops.max_batch_size(report, memory, training=False) == (memory - 4 * 221) // (4 * 80)
    assert flops.max_batch_size(report, 100) == 0


def test_vgg16_parameter_memory_is_553_mb():
    # 138,357,544 x 4 bytes (the MATLAB paper's footprint rule)
    assert flops.count_named("vgg16").param_bytes == 553_430_176


# ---------------------------------------------------------------- bad input
def test_count_rejects_non_models():
    with pytest.raises(TypeError, match="model"):
        flops.count("vgg16")
    with pytest.raises(TypeError, match="model"):
        flops_tf.tf_profiler_flops(L.Dense(3))


def test_count_rejects_unbuilt_and_subclassed_models():
    with pytest.raises(ValueError, match="not built"):
        flops.count(tf.keras.Sequential([L.Dense(3)]))

    class Sub(tf.keras.Model):
        def __init__(self):
            super().__init__()
            self.d = L.Dense(2)

        def call(self, x):
            return self.d(x)

    sub = Sub()
    sub(tf.zeros((1, 3)))
    with pytest.raises(ValueError, match="subclassed"):
        flops.count(sub)


def test_count_rejects_undefined_sizes():
    x = tf.keras.Input((None, None, 3))
    with pytest.raises(ValueError, match="input_shape"):
        flops.count(tf.keras.Model(x, L.Conv2D(2, 3)(x)))


def test_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="input_size"):
        flops.count_named("vgg16", input_size=0)
    with pytest.raises(ValueError, match="model name"):
        flops.count_named("vgg17")
    report = flops.count(_conv1d_model())
    with pytest.raises(ValueError, match="memory_bytes"):
        flops.max_batch_size(report, -1)
    with pytest.raises(ValueError, match="optimizer_slots"):
        flops.training_state_bytes(report, optimizer_slots=-1)
    with pytest.raises(ValueError, match="reserve_bytes"):
        flops.max_batch_size(report, 1e9, reserve_bytes=-1)
    for kwargs, name in (({"images": -5}, "images"), ({"images": 0}, "images"), ({"images": 10, "epochs": 0}, "epochs"),
                         ({"images": True}, "images")):
        with pytest.raises(ValueError, match=name):
            flops.training_flops(report, **kwargs)


# ---------------------------------------------------------------- CLI
def test_cli_json_vgg16(capsys):
    assert flops.cli_main(["vgg16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "vgg16" and out["params"] == 138_357_544 and out["macs"] == 15_470_264_320
    assert out["flops"] == 2 * out["macs"]
    assert out["layers"][1]["name"] == "block1_conv1" and out["layers"][1]["output_shape"] == [224, 224, 64]


def test_cli_table_and_input_size(capsys):
    assert flops.cli_main(["resnet18", "--input-size", "64"]) == 0
    out = capsys.readouterr().out
    assert "conv1_conv" in out and "G MACs" in out


def test_cli_unknown_model_lists_names(capsys):
    with pytest.raises(SystemExit) as info:
        flops.cli_main(["vgg17"])
    assert info.value.code == 2
    assert "vgg16" in capsys.readouterr().err


def test_cli_help(capsys):
    with pytest.raises(SystemExit) as info:
        flops.cli_main(["--help"])
    assert info.value.code == 0
    assert "--input-size" in capsys.readouterr().out


def test_shapes_only_counts_equal_a_real_model():
    real = flops.count(labkit.models.get("resnet18", input_shape=(40, 40, 3), classes=10), **ALL)
    shapes = flops.count_named("resnet18", 40, classes=10, **ALL)
    assert shapes.rows == real.rows and shapes.trainable_params == real.trainable_params


def test_local_response_normalization_rule():
    # window n = 5: 5 squares + 5 adds, then bias add, power and divide = 13 FLOPs per element
    rows = {r.name: r for r in flops.count_named("alexnet_grouped", count_bn=True).rows}
    assert rows["norm1"].flops == 13 * 55 * 55 * 96
    assert {r.name: r for r in flops.count_named("alexnet_grouped").rows}["norm1"].flops == 0


def test_cli_classes(capsys):
    assert flops.cli_main(["resnet18", "--input-size", "32", "--classes", "10", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["layers"][-1]["output_shape"] == [10] and out["input_shape"] == [32, 32, 3]


def test_nested_model_called_twice_counts_twice_with_params_once():
    inner = tf.keras.Sequential([tf.keras.Input((6,)), L.Dense(4, name="d")], name="inner")
    a, b = tf.keras.Input((6,)), tf.keras.Input((6,))
    model = tf.keras.Model([a, b], L.Concatenate()([inner(a), inner(b)]))
    report = flops.count(model)
    assert [r.name for r in report.rows if r.kind == "dense"] == ["inner/d", "inner/d"]
    assert report.macs == 2 * 24 and report.params == model.count_params() == 28
