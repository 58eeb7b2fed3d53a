"""labkit.scale.large_batch: one-worker batch-size and LR-scaling experiments."""
import numpy as np
import pytest

from labkit.scale import large_batch


def test_throughput_vs_batch_rows_and_units():
    df = large_batch.throughput_vs_batch([2, 8], steps=2, repeats=1, warmup_steps=1)
    assert list(df.batch_size) == [2, 8]
    # images/s is batch / step time, so the two columns must agree
    np.testing.assert_allclose(df.images_per_sec, df.batch_size / df.step_time_s, rtol=0.35)


def test_throughput_vs_batch_refuses_zero_batch():
    with pytest.raises(ValueError, match="batch"):
        large_batch.throughput_vs_batch([0], steps=1, repeats=1)


def test_lr_scaling_curves_four_configs_with_scaled_peaks():
    df = large_batch.lr_scaling_curves(batch_size=8, k=2, lr=0.01, epochs=1, num_examples=64, num_val=50)
    # validation accuracy is a count over the 50 held-out images; training time only grows
    assert ((df.val_acc * 50).round(6) % 1 == 0).all() and df.val_acc.between(0, 1).all()
    assert all(g.train_s.is_monotonic_increasing for _, g in df.groupby("config"))
    assert df.groupby("config").warmup.first().sum() == 1  # only the last configuration warms up
    peaks = df.groupby("config").lr_peak.first()
    assert len(peaks) == 4
    # the linear rule: k times the batch gets k times the LR; the naive large batch keeps the small LR
    assert sorted(peaks.round(6).tolist()) == [0.01, 0.01, 0.02, 0.02]
    assert np.isfinite(df.loss).all()


def test_lr_scaling_curves_refuses_bad_k():
    with pytest.raises(ValueError, match="k"):
        large_batch.lr_scaling_curves(k=0)


@pytest.mark.parametrize("kw, word", [({"warmup_epochs": 9, "epochs": 2}, "warmup_epochs"), ({"num_val": 0}, "num_val"),
                                      ({"num_examples": 10}, "num_examples")])
def test_lr_scaling_curves_bad_input_names_the_parameter(kw, word):
    with pytest.raises(ValueError, match=word):
        large_batch.lr_scaling_curves(**kw)
