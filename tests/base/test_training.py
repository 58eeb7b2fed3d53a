"""labkit.base.training: the piecewise LR against MATLAB's rule, SGDM + L2 against a hand update, resume after a
simulated kill, the progress callback inside and outside Jupyter, evaluation against TensorFlow."""
from __future__ import annotations

import io
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import labkit  # noqa: F401
from labkit.base import training
from labkit.data import loading as data
from labkit.models import cifar


def tiny_model(seed=0):
    tf.keras.utils.set_random_seed(seed)
    return cifar.sweep_net(filters=4, filter_size=3, pool_size=2, input_shape=(8, 8, 3), classes=3)


def tiny_data(n=24, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8), rng.integers(0, 3, n)


# --- schedules -------------------------------------------------------------------------------------------


def test_piecewise_matches_matlab_rule():
    # MATLAB: the LR is multiplied by DropFactor every DropPeriod epochs
    s = training.PiecewiseLR(0.001, steps_per_epoch=500, drop_factor=0.1, drop_period=30)
    for epoch in (0, 1, 29, 29.998, 30, 31, 39, 59, 60):
        expected = 0.001 * 0.1 ** (int(epoch) // 30)
        assert s.at_epoch(epoch) == pytest.approx(expected, rel=1e-6), epoch
    assert float(s(499)) == pytest.approx(0.001) and float(s(500 * 30 - 1)) == pytest.approx(0.001)
    assert float(s(500 * 30)) == pytest.approx(0.0001)


def test_warmup_ramps_linearly_then_follows_the_schedule():
    s = training.PiecewiseLR(0.8, steps_per_epoch=10, drop_period=3, warmup_epochs=2, warmup_from=0.25)
    assert float(s(0)) == pytest.approx(0.8 * (0.25 + 0.75 * 1 / 20))
    assert float(s(9)) == pytest.approx(0.8 * (0.25 + 0.75 * 10 / 20))
    assert float(s(19)) == pytest.approx(0.8) and float(s(25)) == pytest.approx(0.8)
    assert float(s(30)) == pytest.approx(0.08)


def test_scaled_lr_is_the_convblock_examples_rule():
    assert training.scaled_lr(0.1, 1024) == pytest.approx(0.4)  # 4 GPUs x 256: 0.1 * 1024 / 256
    with pytest.raises(ValueError, match="batch_size"):
        training.scaled_lr(0.1, 0)


@pytest.mark.parametrize("kwargs, word", [({"lr": 0}, "lr"), ({"steps_per_epoch": 0}, "steps_per_epoch"),
                                          ({"drop_factor": 1.5}, "drop_factor"), ({"drop_period": 0}, "drop_period")])
def test_schedule_bad_input_names_the_parameter(kwargs, word):
    args = {"lr": 0.1, "steps_per_epoch": 10, **kwargs}
    with pytest.raises(ValueError, match=word):
        training.PiecewiseLR(**args)


# --- SGDM + L2 -------------------------------------------------------------------------------------------


def test_sgdm_with_l2_matches_matlabs_update_by_hand():
    # MATLAB sgdm: v <- m v - lr (grad(loss) + l2 w) for weights, no L2 on biases; w <- w + v
    x, y = tiny_data(6)
    model = tiny_model()
    lr, m, l2 = 0.05, 0.9, 0.01
    training.compile_sgdm(model, lr=lr, momentum=m, l2=l2)
    xn = data.normalize(x)
    w0 = [w.numpy() for w in model.trainable_weights]
    is_kernel = [w.name.endswith("kernel:0") for w in model.trainable_weights]
    velocity = [np.zeros_like(w) for w in w0]
    expected = [w.copy() for w in w0]
    probe = tiny_model()
    for _ in range(2):
        probe.set_weights(expected)
        with tf.GradientTape() as tape:
            ce = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(y, probe(xn)))
        grads = tape.gradient(ce, probe.trainable_weights)
        for i, g in enumerate(grads):
            g = g.numpy() + (l2 * expected[i] if is_kernel[i] else 0)
            velocity[i] = m * velocity[i] - lr * g
            expected[i] = expected[i] + velocity[i]
        model.train_on_batch(xn, y)
    for got, want in zip(model.trainable_weights, expected):
        np.testing.assert_allclose(got.numpy(), want, rtol=2e-4, atol=1e-6)


def test_l2_term_in_the_loss_and_recompile_replaces_it():
    x, y = tiny_data(6)
    model = tiny_model()
    training.compile_sgdm(model, l2=0.004)
    kernels = [w.numpy() for w in model.trainable_weights if w.name.endswith("kernel:0")]
    expected = 0.5 * 0.004 * sum((k ** 2).sum() for k in kernels)
    assert float(sum(model.losses)) == pytest.approx(expected, rel=1e-5)
    ce = float(tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(y, model(data.normalize(x)))))
    assert model.evaluate(data.normalize(x), y, verbose=0)[0] == pytest.approx(ce + expected, rel=1e-4)
    training.compile_sgdm(model, l2=0.0)
    assert model.evaluate(data.normalize(x), y, verbose=0)[0] == pytest.approx(ce, rel=1e-4)


def test_compile_sgdm_bad_input():
    with pytest.raises(ValueError, match="momentum"):
        training.compile_sgdm(tiny_model(), momentum=1.0)
    with pytest.raises(ValueError, match="l2"):
        training.compile_sgdm(tiny_model(), l2=-1)
    with pytest.raises(ValueError, match="lr"):
        training.compile_sgdm(tiny_model(), lr=0)


def test_schedule_drives_the_optimizer():
    x, y = tiny_data(8)
    model = training.compile_sgdm(tiny_model(), lr=0.1, steps_per_epoch=2, drop_period=1, drop_factor=0.5)
    seen = []

    class Record(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append(training.current_lr(self.model.optimizer))

    model.fit(data.make_dataset(x, y, 4, shuffle=False), epochs=3, verbose=0, callbacks=[Record()])
    assert seen == pytest.approx([0.1, 0.05, 0.025])


# --- resume ----------------------------------------------------------------------------------------------


def _compiled(seed):
    model = tiny_model(seed)
    return training.compile_sgdm(model, lr=0.05, l2=0.004, steps_per_epoch=3, drop_period=2)


def test_interrupted_run_resumes_from_its_last_epoch_and_matches_an_uninterrupted_one(tmp_path):
    x, y = tiny_data(24)
    ds = data.make_dataset(x, y, 8, shuffle=False)
    reference = _compiled(0)
    initial = reference.get_weights()
    training.fit(reference, ds, epochs=4, progress=False)

    first = _compiled(0)
    first.set_weights(initial)
    with pytest.raises(training.TrainingInterrupted):
        training.fit(first, ds, epochs=4, backup_dir=tmp_path / "backup", callbacks=[training.SimulatedKill(2)],
                     progress=False)
    assert (tmp_path / "backup").exists()

    resumed = _compiled(7)  # a fresh process would start from other random weights: the backup must win
    history = training.fit(resumed, ds, epochs=4, backup_dir=tmp_path / "backup", progress=False)
    assert history.epoch == [2, 3]  # epochs 1-2 were not repeated
    assert int(resumed.optimizer.iterations) == 4 * 3
    for a, b in zip(reference.get_weights(), resumed.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert not list((tmp_path / "backup").glob("**/*.index"))  # finished: backup removed


@pytest.mark.slow
def test_resume_after_a_real_sigkill(tmp_path):
    script = textwrap.dedent(f"""
        import os, signal, sys
        import labkit, numpy as np, tensorflow as tf
        from labkit.data import loading as data
        from labkit.base import training
        from labkit.models import cifar
        tf.keras.utils.set_random_seed(int(sys.argv[1]))
        rng = np.random.default_rng(0)
        x, y = rng.integers(0, 256, (24, 8, 8, 3), dtype=np.uint8), rng.integers(0, 3, 24)
        model = cifar.sweep_net(filters=4, filter_size=3, pool_size=2, input_shape=(8, 8, 3), classes=3)
        training.compile_sgdm(model, lr=0.05, steps_per_epoch=3, drop_period=2)
        class Kill(tf.keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                if sys.argv[2] == "kill" and epoch == 1:
                    os.kill(os.getpid(), signal.SIGKILL)
        h = training.fit(model, data.make_dataset(x, y, 8, shuffle=False), epochs=4,
                         backup_dir={str(tmp_path / 'b')!r}, callbacks=[Kill()], progress=False)
        print("EPOCHS", h.epoch)
    """)
    path = tmp_path / "job.py"
    path.write_text(script)
    killed = subprocess.run([sys.executable, str(path), "0", "kill"], capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9
    resumed = subprocess.run([sys.executable, str(path), "1", "run"], capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "EPOCHS [2, 3]" in resumed.stdout


def test_simulated_kill_bad_input():
    with pytest.raises(ValueError, match="after_epochs"):
        training.SimulatedKill(0)


# --- progress --------------------------------------------------------------------------------------------


def test_progress_outside_jupyter_prints_one_line_per_epoch():
    x, y = tiny_data(16)
    stream = io.StringIO()
    model = training.compile_sgdm(tiny_model(), lr=0.05)
    cb = training.LiveProgress(stream=stream)
    assert cb.mode == "text"  # pytest is not a Jupyter kernel
    model.fit(data.make_dataset(x, y, 8), epochs=3, validation_data=data.make_dataset(x, y, 8, shuffle=False),
              callbacks=[cb], verbose=0)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("epoch   1/3") and "val_acc" in lines[0] and "lr 0.05" in lines[0]


def test_progress_in_jupyter_updates_one_display_in_place(monkeypatch):
    import IPython.display
    import matplotlib.pyplot as plt

    shown, updates = [], []

    class Handle:
        def update(self, obj):
            updates.append(obj)

    def fake_display(obj, display_id=None):
        shown.append(obj)
        return Handle()

    monkeypatch.setattr(IPython.display, "display", fake_display)
    x, y = tiny_data(16)
    model = training.compile_sgdm(tiny_model(), lr=0.05)
    cb = training.LiveProgress(mode="plot", interval=0.0)
    open_before = plt.get_fignums()
    model.fit(data.make_dataset(x, y, 8), epochs=2, validation_data=data.make_dataset(x, y, 8, shuffle=False),
              callbacks=[cb], verbose=0)
    assert len(shown) == 1  # one figure, created once ...
    assert len(updates) >= 2 + 1  # ... redrawn at least at each epoch's end and at the end
    assert all(u.data[:8] == b"\x89PNG\r\n\x1a\n" for u in updates)
    assert plt.get_fignums() == open_before  # no pyplot figures pile up
    assert [r["epoch"] for r in cb.epochs_log] == [1, 2] and "val_accuracy" in cb.epochs_log[0]


def test_progress_bad_mode():
    with pytest.raises(ValueError, match="mode"):
        training.LiveProgress(mode="gui")


# --- evaluation ------------------------------------------------------------------------------------------


def test_evaluate_matches_tensorflow():
    x, y = tiny_data(40)
    model = training.compile_sgdm(tiny_model(), lr=0.05)
    ev = training.evaluate(model, x, y)
    pred = model.predict(data.normalize(x), verbose=0).argmax(-1)
    np.testing.assert_array_equal(ev.confusion, tf.math.confusion_matrix(y, pred, num_classes=3).numpy())
    assert ev.accuracy == pytest.approx(float((pred == y).mean()))
    assert ev.confusion.sum() == 40 and np.trace(ev.confusion) == round(ev.accuracy * 40)
    np.testing.assert_array_equal(ev.misclassified(), np.flatnonzero(pred != y))
    with pytest.raises(ValueError, match="one label per image"):
        training.evaluate(model, x, y[:5])


def test_plots_build():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x, y = tiny_data(20)
    model = training.compile_sgdm(tiny_model(), lr=0.05)
    ev = training.evaluate(model, x, y)
    ax = training.plot_confusion(ev, ["a", "b", "c"], note="synthetic data, quick profile")
    assert ax.get_title().endswith("correct; synthetic data, quick profile)"), ax.get_title()
    training.plot_misclassified(x, ev, ["a", "b", "c"], n=4)
    fig = training.plot_filters(model, note="synthetic data, quick profile")
    assert len([a for a in fig.axes if a.images]) == 4
    assert fig._suptitle.get_text().endswith("filters (synthetic data, quick profile)")
    plt.close("all")


# ---- the one warmup schedule, the one train step, per-rank results ------------------------------------

def test_warmup_lr_ramps_linearly_to_the_scaled_lr():
    # Goyal et al. 2017: lr 0.1, 8 workers, 100 warmup steps -> 0.1 at 0, 0.45 at 50, 0.8 from 100 on
    assert training.warmup_lr(0, 0.1, 8, 100) == pytest.approx(0.1)
    assert training.warmup_lr(50, 0.1, 8, 100) == pytest.approx(0.45)
    assert training.warmup_lr(100, 0.1, 8, 100) == pytest.approx(0.8)
    assert training.warmup_lr(1000, 0.1, 8, 100) == pytest.approx(0.8)
    assert training.warmup_lr(0, 0.1, 8, 0) == pytest.approx(0.8)  # no warmup: scaled from the start
    assert training.warmup_lr(7, 0.1) == pytest.approx(0.1)


def test_warmup_lr_on_tensors_and_as_keras_schedule_match_python():
    sched = training.WarmupLR(0.1, 8, 100)
    for step in (0, 13, 50, 400):
        want = training.warmup_lr(step, 0.1, 8, 100)
        assert float(training.warmup_lr(tf.constant(step, tf.int64), 0.1, 8, 100)) == pytest.approx(want)
        assert float(sched(tf.constant(step, tf.int64))) == pytest.approx(want)
    assert training.WarmupLR.from_config(sched.get_config()).get_config() == sched.get_config()


@pytest.mark.parametrize("kwargs, name", [({"lr": 0}, "lr"), ({"scale": 0.5}, "scale"),
                                          ({"warmup_steps": -1}, "warmup_steps")])
def test_warmup_lr_names_the_bad_parameter(kwargs, name):
    args = {"lr": 0.1, "scale": 2, "warmup_steps": 10, **kwargs}
    with pytest.raises(ValueError, match=name):
        training.warmup_lr(0, **args)
    with pytest.raises(ValueError, match=name):
        training.WarmupLR(**args)


def test_train_step_matches_keras_train_on_batch():
    # oracle: Keras's own train_on_batch from the same weights, same optimizer, same batch
    x = np.random.default_rng(0).normal(size=(8, 32, 32, 3)).astype(np.float32)
    y = np.arange(8, dtype=np.int32) % 10
    tf.random.set_seed(1)
    a = cifar.small_cnn()
    b = tf.keras.models.clone_model(a)
    b.set_weights(a.get_weights())
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=False)
    step = training.make_train_step(a, tf.keras.optimizers.legacy.SGD(0.05, momentum=0.9), loss_fn)
    b.compile(tf.keras.optimizers.legacy.SGD(0.05, momentum=0.9), loss_fn)
    for _ in range(2):
        la = float(step(tf.constant(x), tf.constant(y)))
        lb = float(b.train_on_batch(x, y))
        assert la == pytest.approx(lb, rel=1e-4)
    for wa, wb in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_allclose(wa, wb, rtol=1e-4, atol=1e-6)


def test_train_step_without_autograph_gives_autograph_s_weights_bit_for_bit():
    """make_train_step traces without AutoGraph (a start-up cost, not a speed one): the oracle is the same step
    traced with it, from the same weights on the same batches."""
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(8, 16, 16, 3)).astype(np.float32), np.arange(8, dtype=np.int32) % 10
    a = cifar.small_cnn(input_shape=(16, 16, 3))
    b = tf.keras.models.clone_model(a)
    b.set_weights(a.get_weights())
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy()
    ours = training.make_train_step(a, tf.keras.optimizers.legacy.SGD(0.05, momentum=0.9), loss_fn)
    assert ours.function_spec is not None and not ours._autograph
    with_autograph = training.make_train_step(b, tf.keras.optimizers.legacy.SGD(0.05, momentum=0.9), loss_fn)
    with_autograph = tf.function(with_autograph.python_function, autograph=True)
    for _ in range(3):
        assert float(ours(tf.constant(x), tf.constant(y))) == float(with_autograph(tf.constant(x), tf.constant(y)))
    for wa, wb in zip(a.get_weights(), b.get_weights()):
        np.testing.assert_array_equal(wa, wb)


def test_train_step_applies_the_tape_wrapper():
    calls = []

    def wrapper(tape):
        calls.append(type(tape).__name__)
        return tape

    model = cifar.small_cnn(input_shape=(8, 8, 3))
    step = training.make_train_step(model, tf.keras.optimizers.legacy.SGD(0.01),
                                    tf.keras.losses.SparseCategoricalCrossentropy(), tape_wrapper=wrapper)
    step(tf.zeros([2, 8, 8, 3]), tf.zeros([2], tf.int32))
    assert calls and set(calls) == {"GradientTape"}  # called at tracing (again when slots get created)
    with pytest.raises(TypeError, match="tape_wrapper"):
        training.make_train_step(model, None, None, tape_wrapper="hvd")


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_predict_bad_batch_size(bad):
    with pytest.raises(ValueError, match="batch_size"):
        training.predict(cifar.small_cnn(input_shape=(8, 8, 3)), np.zeros((2, 8, 8, 3), np.float32),
                         batch_size=bad)


def test_random_batch_shapes_and_bad_input():
    x, y = data.random_batch(4, image_size=16, classes=7, seed=3)
    assert x.shape == (4, 16, 16, 3) and x.dtype == np.float32 and y.dtype == np.int32
    assert 0 <= y.min() and y.max() < 7
    np.testing.assert_array_equal(x, data.random_batch(4, image_size=16, classes=7, seed=3)[0])
    with pytest.raises(ValueError, match="image_size"):
        data.random_batch(4, image_size=0)


def test_filter_smoothness_tells_noise_from_smooth_patterns():
    rng = np.random.default_rng(0)
    noise = rng.normal(size=(5, 5, 3, 200))
    assert abs(training.filter_smoothness(noise).mean()) < 0.05  # independent weights: no correlation
    ramp = np.add.outer(np.arange(5.0), np.arange(5.0))[:, :, None, None].repeat(3, axis=2)  # a smooth gradient
    checker = (-1.0) ** np.add.outer(np.arange(5), np.arange(5))[:, :, None, None]
    s = training.filter_smoothness(np.concatenate([ramp, checker.repeat(3, axis=2)], axis=3))
    assert s[0] > 0.7 and s[1] == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="HWIO"):
        training.filter_smoothness(np.zeros((5, 5, 3)))
