"""labkit.transfer: per-layer learning-rate factors (oracle: stock Keras SGD), freezing, new heads."""
import numpy as np
import pytest
import tensorflow as tf

import labkit  # noqa: F401
from labkit.transfer import finetune as transfer


def two_layer_model(seed=0):
    tf.keras.utils.set_random_seed(seed)
    inputs = tf.keras.Input((6,))
    x = tf.keras.layers.Dense(5, activation="tanh", name="d1")(inputs)
    outputs = tf.keras.layers.Dense(3, activation="softmax", name="d2")(x)
    return tf.keras.Model(inputs, outputs)


def batch(n=16, seed=1):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 6)).astype("float32"), rng.integers(0, 3, n).astype("int32")


def step(model, optimizer, steps=1):
    """`steps` SGD steps on a fixed batch; returns {variable name: how far it moved}."""
    x, y = batch()
    before = {v.name: v.numpy().copy() for v in model.trainable_variables}
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy()
    for _ in range(steps):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return {v.name: v.numpy() - before[v.name] for v in model.trainable_variables}


def test_factor_zero_does_not_move_and_factor_k_moves_k_times_as_far():
    reference = step(two_layer_model(), tf.keras.optimizers.SGD(0.1))  # stock Keras: the oracle
    model = two_layer_model()
    moved = step(model, transfer.sgd_with_lr_factors(model, {"d1": 0, "d2": 3}, learning_rate=0.1, momentum=0.0))
    for name in ("d1/kernel:0", "d1/bias:0"):
        assert np.all(moved[name] == 0.0), name
    for name in ("d2/kernel:0", "d2/bias:0"):
        assert np.abs(reference[name]).max() > 1e-4  # the oracle did move
        np.testing.assert_allclose(moved[name], 3 * reference[name], rtol=1e-4, atol=1e-6)


def test_transfer_example_weight_and_bias_factors():
    reference = step(two_layer_model(), tf.keras.optimizers.SGD(0.01))
    model = two_layer_model()
    opt = transfer.sgd_with_lr_factors(model, {"d2": transfer.HEAD_LR_FACTORS}, learning_rate=0.01,
                                       momentum=0.0)
    moved = step(model, opt)
    np.testing.assert_allclose(moved["d2/kernel:0"], 10 * reference["d2/kernel:0"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(moved["d2/bias:0"], 20 * reference["d2/bias:0"], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(moved["d1/kernel:0"], reference["d1/kernel:0"], rtol=1e-4, atol=1e-6)


def test_factor_with_momentum_equals_scaled_learning_rate():
    # with momentum, a factor k on every variable is the same optimizer as lr * k (all updates are linear)
    reference = step(two_layer_model(), tf.keras.optimizers.SGD(0.05 * 4, momentum=0.9), steps=4)
    model = two_layer_model()
    opt = transfer.sgd_with_lr_factors(model, {"d1": 4, "d2": 4}, learning_rate=0.05, momentum=0.9)
    moved = step(model, opt, steps=4)
    for name, delta in reference.items():
        np.testing.assert_allclose(moved[name], delta, rtol=1e-4, atol=1e-6)


def test_factors_apply_inside_model_fit():
    model = two_layer_model()
    model.compile(transfer.sgd_with_lr_factors(model, {"d1": 0.0}, learning_rate=0.5, momentum=0.9),
                  loss="sparse_categorical_crossentropy")
    before = {v.name: v.numpy().copy() for v in model.trainable_variables}
    x, y = batch(64)
    model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    assert np.array_equal(model.get_layer("d1").kernel.numpy(), before["d1/kernel:0"])
    assert not np.allclose(model.get_layer("d2").kernel.numpy(), before["d2/kernel:0"])


def test_factor_errors_name_the_problem():
    model = two_layer_model()
    with pytest.raises(ValueError, match="'nope'.*d1"):
        transfer.variable_factors(model, {"nope": 2})
    with pytest.raises(ValueError, match="gamma"):
        transfer.variable_factors(model, {"d1": {"gamma": 2}})
    with pytest.raises(ValueError, match=">= 0"):
        transfer.variable_factors(model, {"d1": -1})
    with pytest.raises(ValueError, match=">= 0"):
        transfer.variable_factors(model, {"d1": float("nan")})
    with pytest.raises(ValueError, match="weight_decay"):
        transfer.FactorSGD({}, weight_decay=1e-4)
    assert transfer.FactorSGD({"d1/kernel:0": 2.0}).get_config()["lr_factors"] == {"d1/kernel:0": 2.0}


def test_freeze_keeps_only_named_layers_trainable():
    model = transfer.freeze(two_layer_model(), keep=["d2"])
    assert [v.name for v in model.trainable_variables] == ["d2/kernel:0", "d2/bias:0"]
    assert transfer.param_counts(model) == {"trainable": 5 * 3 + 3, "frozen": 6 * 5 + 5}
    frozen_before = model.get_layer("d1").kernel.numpy().copy()
    head_before = model.get_layer("d2").kernel.numpy().copy()
    model.compile(tf.keras.optimizers.SGD(0.5), loss="sparse_categorical_crossentropy")
    x, y = batch(64)
    model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    assert np.array_equal(model.get_layer("d1").kernel.numpy(), frozen_before)
    assert not np.allclose(model.get_layer("d2").kernel.numpy(), head_before)
    with pytest.raises(ValueError, match="keep"):
        transfer.freeze(model, keep=["d3"])
    transfer.freeze(model, keep=["d1", "d2"])
    assert len(model.trainable_variables) == 4


def test_transfer_model_new_head_on_pretrained_features():
    from labkit.models.cifar import sweep_net

    base = sweep_net(filters=4, filter_size=3, pool_size=2, classes=5)
    x = np.random.default_rng(0).normal(size=(8, 32, 32, 3)).astype("float32")
    # oracle: the base's own activations at the input of its classifier
    want = tf.keras.Model(base.input, base.get_layer("fc").input)(x).numpy()
    features = transfer.feature_extractor(base)
    np.testing.assert_allclose(features(x).numpy(), want, rtol=1e-5, atol=1e-6)
    model = transfer.transfer_model(base, 7, freeze_base=True)
    assert model.output_shape == (None, 7) and model.layers[-1].name == transfer.HEAD
    assert [v.name for v in model.trainable_variables] == ["new_fc/kernel:0", "new_fc/bias:0"]
    np.testing.assert_allclose(transfer.feature_extractor(model)(x).numpy(), want, rtol=1e-5, atol=1e-6)
    # the copy is independent: training the transfer model cannot change the pretrained base
    model.get_layer("conv1").kernel.assign(tf.zeros_like(model.get_layer("conv1").kernel))
    assert np.abs(base.get_layer("conv1").kernel.numpy()).max() > 0
    with pytest.raises(ValueError, match="Dense"):
        transfer.feature_extractor(tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.ReLU()]))


def test_strategies_follow_the_transfer_examples_recipe():
    from labkit.models.cifar import sweep_net

    base = sweep_net(filters=4, filter_size=3, pool_size=2, classes=5)
    frozen, opt_frozen = transfer.make_strategy("frozen", base, 5, lr=0.01)
    assert [v.name for v in frozen.trainable_variables] == ["new_fc/kernel:0", "new_fc/bias:0"]
    finetune, opt = transfer.make_strategy("finetune", base, 5, lr=0.01)
    assert len(finetune.trainable_variables) == len(base.trainable_variables)
    assert opt.lr_factors == {"new_fc/kernel:0": 10.0, "new_fc/bias:0": 20.0}
    assert np.isclose(float(opt.learning_rate), 0.001)
    np.testing.assert_array_equal(finetune.get_layer("conv1").kernel.numpy(), base.get_layer("conv1").kernel.numpy())
    scratch, opt_scratch = transfer.make_strategy("scratch", base, 5, lr=0.01)
    assert not np.allclose(scratch.get_layer("conv1").kernel.numpy(), base.get_layer("conv1").kernel.numpy())
    assert np.isclose(float(opt_scratch.learning_rate), 0.01)
    with pytest.raises(ValueError, match="strategy"):
        transfer.make_strategy("distill", base, 5)


def test_split_and_subset():
    x = np.arange(20)[:, None]
    y = np.array([0, 1, 2, 3] * 5)
    xs, ys = transfer.split_classes(x, y, [3, 1])
    assert set(ys) == {0, 1} and all(y[x_[0]] == (3 if label == 0 else 1) for x_, label in zip(xs, ys))
    xp, yp = transfer.per_class_subset(x, y, 2)
    assert np.bincount(yp).tolist() == [2, 2, 2, 2] and np.array_equal(y[xp[:, 0]], yp)
    with pytest.raises(ValueError, match="n_per_class"):
        transfer.per_class_subset(x, y, 0)


def test_imagenet_weights_missing_says_how_to_stage(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    assert transfer.imagenet_weights_path("resnet50") is None
    with pytest.raises(FileNotFoundError, match="include_top=False"):
        transfer.imagenet_base("resnet50")
    with pytest.raises(ValueError, match="name"):
        transfer.imagenet_weights_path("alexnet")


@pytest.mark.slow
def test_imagenet_base_loads_staged_weights(tmp_path, monkeypatch):
    monkeypatch.setenv("LABKIT_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    # stage a weights file the way a download would leave it (random weights stand in for ImageNet's)
    staged = tf.keras.applications.MobileNetV2(weights=None, include_top=False, input_shape=(96, 96, 3))
    (tmp_path / "data" / "models").mkdir(parents=True)
    staged.save_weights(str(tmp_path / "data" / "models" / transfer.IMAGENET_WEIGHTS["mobilenet_v2"][1]))
    base = transfer.imagenet_base("mobilenet_v2", input_shape=(96, 96, 3))
    for a, b in zip(staged.weights, base.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_measure_factors_reports_the_factors():
    model = two_layer_model()
    x, y = batch()
    ratios = transfer.measure_factors(model, {"d1": {"kernel": 0, "bias": 2}, "d2": 5}, x, y, learning_rate=0.1)
    assert ratios["d1/kernel:0"] == 0.0
    np.testing.assert_allclose([ratios["d1/bias:0"], ratios["d2/kernel:0"], ratios["d2/bias:0"]], [2, 5, 5],
                               rtol=1e-3)


@pytest.mark.parametrize("kwargs, word", [
    ({"lr": 0}, "lr"), ({"transfer_lr_drop": -1}, "transfer_lr_drop"),
    ({"head_factors": {"kernel": -1}}, "factor"), ({"head_factors": 10}, "head_factors"),
    ({"strategy": "distill"}, "strategy")])
def test_make_strategy_bad_input_before_any_model_is_built(kwargs, word, monkeypatch):
    def no_build(*a, **k):
        raise AssertionError("a model was built before the arguments were checked")

    monkeypatch.setattr(transfer, "transfer_model", no_build)
    args = {"strategy": "frozen", **kwargs}
    with pytest.raises(ValueError, match=word):
        transfer.make_strategy(args.pop("strategy"), None, 5, **args)


def test_param_counts_by_hand():
    m = tf.keras.Sequential([tf.keras.layers.Input((4,)), tf.keras.layers.Dense(3),
                             tf.keras.layers.BatchNormalization()])
    # dense 4*3+3 = 15, BN gamma+beta 6 trainable, moving mean+variance 6 not
    assert transfer.param_counts(m) == {"trainable": 21, "frozen": 6}
    transfer.freeze(m)
    assert transfer.param_counts(m) == {"trainable": 0, "frozen": 27}
