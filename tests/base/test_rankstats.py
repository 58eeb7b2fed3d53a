"""labkit.base.rankstats.weights_checksum, the sync proof every data-parallel verdict rests on: it must see every array.

A checksum that skipped one array (the last, say: `weights[:-1]`) would call two ranks in sync whose last layer
differs; these tests change one array at a time, the last included, and one layer of a real Keras model.
Also rankstats.summarize_times: a rank's images/s per repeat block.
"""
import numpy as np
import pytest

from labkit.base import rankstats


def _arrays():
    rng = np.random.default_rng(0)
    return [rng.standard_normal(s).astype(np.float32) for s in ((3, 3, 2, 4), (4,), (16, 5), (5,))]


@pytest.mark.parametrize("i", range(4))
def test_a_change_in_any_one_array_changes_the_checksum(i):
    w = _arrays()
    changed = [a.copy() for a in w]
    flat = changed[i].reshape(-1)
    flat[-1] = np.nextafter(flat[-1], np.float32(np.inf))  # one ulp, in the array's last element
    assert rankstats.weights_checksum(w) == rankstats.weights_checksum([a.copy() for a in w])
    assert rankstats.weights_checksum(changed) != rankstats.weights_checksum(w)


def test_a_missing_or_extra_array_changes_the_checksum():
    w = _arrays()
    assert rankstats.weights_checksum(w[:-1]) != rankstats.weights_checksum(w)
    assert rankstats.weights_checksum([*w, np.zeros(0, np.float32)]) != rankstats.weights_checksum(w)


def test_only_the_last_dense_layer_of_a_keras_model_changed():
    """Two copies of small_cnn that differ only in the last layer (its kernel, then only its bias): not in sync."""
    import tensorflow as tf

    from labkit import models
    tf.keras.utils.set_random_seed(0)
    model = models.get("small_cnn", input_shape=(32, 32, 3), classes=10)
    last = model.layers[-1]
    assert isinstance(last, tf.keras.layers.Dense) and last.trainable_weights[-1] is model.trainable_weights[-1]
    before = rankstats.weights_checksum([v.numpy() for v in model.trainable_weights])
    for v in last.trainable_weights:  # the kernel, then the bias: the model's very last array
        saved = v.numpy()
        v.assign_add(np.full(v.shape, 1e-3, v.dtype.as_numpy_dtype))
        assert rankstats.weights_checksum([w.numpy() for w in model.trainable_weights]) != before, v.name
        v.assign(saved)
    assert rankstats.weights_checksum([v.numpy() for v in model.trainable_weights]) == before


def test_checksum_sees_a_one_ulp_change():
    w = [np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), np.ones(4, np.float32)]
    same = [a.copy() for a in w]
    assert rankstats.weights_checksum(w) == rankstats.weights_checksum(same)
    same[0][1, 2] = np.nextafter(same[0][1, 2], np.float32(2))
    assert rankstats.weights_checksum(w) != rankstats.weights_checksum(same)
    assert rankstats.weights_checksum([w[0].reshape(4, 3), w[1]]) != rankstats.weights_checksum(w)  # shape counts


def test_summarize_times_per_repeat_blocks():
    # 2 repeats of 2 steps, batch 10: blocks take 0.2 s and 0.4 s -> 100 and 50 images/s
    s = rankstats.summarize_times([0.1, 0.1, 0.2, 0.2], batch_size=10, steps=2)
    assert s["images_per_sec_repeats"] == pytest.approx([100.0, 50.0])
    assert s["images_per_sec"] == pytest.approx(75.0)
    assert s["images_per_sec_std"] == pytest.approx(np.std([100, 50], ddof=1))
    with pytest.raises(ValueError, match="steps"):
        rankstats.summarize_times([0.1], batch_size=10, steps=2)
