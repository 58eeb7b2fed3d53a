"""labkit.hvd_train's Horovod-free pieces: LR rule, sharding, checksum, timing summary, argument checks."""
import numpy as np
import pytest

from labkit import hvd_train as ht


def test_goyal_warmup_ramps_linearly_to_the_scaled_lr():
    # lr 0.1, 8 workers, 100 warmup steps: 0.1 at step 0, 0.45 at step 50, 0.8 from step 100 on
    assert ht.scaled_lr(0, 0.1, 8, 100) == pytest.approx(0.1)
    assert ht.scaled_lr(50, 0.1, 8, 100) == pytest.approx(0.45)
    assert ht.scaled_lr(100, 0.1, 8, 100) == pytest.approx(0.8)
    assert ht.scaled_lr(1000, 0.1, 8, 100) == pytest.approx(0.8)
    assert ht.scaled_lr(0, 0.1, 8, 0) == pytest.approx(0.8)  # no warmup: scaled from the start
    assert ht.scaled_lr(7, 0.1) == pytest.approx(0.1)


def test_goyal_warmup_on_tensors_matches_python():
    tf = pytest.importorskip("tensorflow")
    for step in (0, 13, 50, 400):
        assert float(ht.scaled_lr(tf.constant(step, tf.int64), 0.1, 8, 100)) == \
            pytest.approx(ht.scaled_lr(step, 0.1, 8, 100))


@pytest.mark.parametrize("kwargs, name", [({"lr": 0}, "lr"), ({"scale": 0.5}, "scale"),
                                          ({"warmup_steps": -1}, "warmup_steps")])
def test_scaled_lr_names_the_bad_parameter(kwargs, name):
    args = {"lr": 0.1, "scale": 2, "warmup_steps": 10, **kwargs}
    with pytest.raises(ValueError, match=name):
        ht.scaled_lr(0, **args)


def test_shards_are_disjoint_and_cover_the_epoch():
    n, size = 103, 4
    shards = [ht.shard_indices(n, r, size) for r in range(size)]
    flat = sorted(i for s in shards for i in s)
    assert flat == list(range(n))                    # every example once per epoch, not N times
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    with pytest.raises(ValueError, match="rank"):
        ht.shard_indices(10, 4, 4)


def test_checksum_sees_a_one_ulp_change():
    w = [np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), np.ones(4, np.float32)]
    same = [a.copy() for a in w]
    assert ht.weights_checksum(w) == ht.weights_checksum(same)
    same[0][1, 2] = np.nextafter(same[0][1, 2], np.float32(2))
    assert ht.weights_checksum(w) != ht.weights_checksum(same)
    assert ht.weights_checksum([w[0].reshape(4, 3), w[1]]) != ht.weights_checksum(w)  # shape counts


def test_summarize_times_per_repeat_blocks():
    # 2 repeats of 2 steps, batch 10: blocks take 0.2 s and 0.4 s -> 100 and 50 images/s
    s = ht.summarize_times([0.1, 0.1, 0.2, 0.2], batch_size=10, steps=2)
    assert s["images_per_sec_repeats"] == pytest.approx([100.0, 50.0])
    assert s["images_per_sec"] == pytest.approx(75.0)
    assert s["images_per_sec_std"] == pytest.approx(np.std([100, 50], ddof=1))
    with pytest.raises(ValueError, match="steps"):
        ht.summarize_times([0.1], batch_size=10, steps=2)


def test_default_threads_split_the_cores_among_local_ranks():
    assert ht.default_threads(cores=16, local_size=4) == 4
    assert ht.default_threads(cores=2, local_size=2) == 1
    assert ht.default_threads(cores=2, local_size=8) == 1  # never zero
    with pytest.raises(ValueError, match="local_size"):
        ht.default_threads(cores=2, local_size=0)


def test_synthetic_data_is_the_same_on_every_rank_and_learnable():
    x1, y1 = ht.synthetic_data(64, seed=3)
    x2, y2 = ht.synthetic_data(64, seed=3)
    assert x1.shape == (64, 32, 32, 3) and x1.dtype == np.float32 and y1.dtype == np.int32
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(y1, y2)
    # a nearest-class-mean classifier beats chance by far: the labels carry signal
    means = np.stack([x1[y1 == c].mean(0) for c in range(10) if (y1 == c).any()])
    classes = [c for c in range(10) if (y1 == c).any()]
    pred = np.array(classes)[np.argmin(((x1[:, None] - means[None]) ** 2).sum((2, 3, 4)), axis=1)]
    assert (pred == y1).mean() > 0.5


def test_arguments_are_checked():
    with pytest.raises(SystemExit):
        ht.parse_args(["--batch-size", "0"])
    a = ht.parse_args(["--steps", "3", "--scale-lr"])
    assert a.steps == 3 and a.scale_lr and a.model == ht.DEFAULT_MODEL


def test_small_cnn_trains_one_step_without_horovod():
    tf = pytest.importorskip("tensorflow")
    model = ht.build_model("small_cnn")
    assert model.output_shape == (None, 10) and not ht._ends_in_softmax(model)
    x, y = ht.synthetic_data(8)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    before = ht.weights_checksum(model.get_weights())
    opt = tf.keras.optimizers.legacy.SGD(0.01)
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    assert ht.weights_checksum(model.get_weights()) != before
