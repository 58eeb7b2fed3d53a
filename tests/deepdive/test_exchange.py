"""labkit.deepdive.exchange: what Horovod's gradient exchange adds to a step on one machine."""
from __future__ import annotations

import pandas as pd
import pytest

from helpers import fake_paired, fake_run, no_separate_launch
from labkit.deepdive import exchange
from labkit.scale import scaling


def test_exchange_cost_is_the_step_time_difference(monkeypatch):
    # compute b/6.4 ms; the barrier alone adds 1 ms, the gradients 6 ms, as one group 3 ms; tf.distribute 2 ms
    extra = {False: 0, "barrier": 1, True: 6, "one_group": 3}
    fake, launches = fake_run(lambda n, sync, b: b / 6.4 + extra[sync]), []

    def run(nps, *, extra=(), batch_size=64, **kw):  # the variants alone are launches of their own
        assert "--barrier" in extra or "--num-groups" in extra, extra
        launches.append(("run", batch_size))
        return fake(nps, extra=extra, batch_size=batch_size, **kw)
    monkeypatch.setattr(scaling, "run", run)
    monkeypatch.setattr(scaling, "run_paired", fake_paired(fake, launches))
    calls = []

    def fake_tfdist(np_, *, model, batch_size, steps, timeout):
        calls.append((np_, model, batch_size, steps))
        return [{"median_step_s": (batch_size / 6.4 + 2 + i) / 1e3, "cpu_step_time_s": 0.5e-3 * (i + 1),
                 "checksum_trainable": "same"} for i in range(np_)]
    from labkit.deepdive import tfdist_train
    monkeypatch.setattr(tfdist_train, "run_local", fake_tfdist)
    cost = exchange.exchange_cost([64, 256], variants=exchange.EXCHANGE_VARIANTS, steps=5, repeats=2)
    assert cost.exchange_ms.tolist() == pytest.approx([6, 6])
    assert cost.horovod_ms.tolist() == pytest.approx([6, 6])
    assert cost.barrier_ms.tolist() == pytest.approx([1, 1])
    assert cost.one_group_ms.tolist() == pytest.approx([3, 3])
    assert cost.tf_distribute_ms.tolist() == pytest.approx([3, 3])  # a synchronous step waits for the slower worker
    assert cost.tf_distribute_cpu_ms.tolist() == pytest.approx([1.0, 1.0])  # the median of the two workers' (2 of them)
    assert cost.horovod_cpu_ms.tolist() == pytest.approx([0.9 * 16, 0.9 * 46])
    assert cost.horovod_vs_no_sync.tolist() == pytest.approx([10 / 16, 40 / 46])
    assert cost.one_group_vs_no_sync.tolist() == pytest.approx([10 / 13, 40 / 43])
    assert cost.tf_distribute_in_sync.all() and cost.horovod_in_sync.all() and "barrier_in_sync" not in cost
    assert calls == [(2, "small_cnn", 64, 10), (2, "small_cnn", 256, 10)]  # as many timed steps as Horovod's
    # per batch: one paired launch (with and without the exchange) and one per Horovod variant
    assert launches == [("paired", 64), ("run", 64), ("run", 64), ("paired", 256), ("run", 256), ("run", 256)]
    assert "vs_best_no_sync" not in cost  # one setting at several batches: no fastest baseline to compare
    launches.clear()
    plain = exchange.exchange_cost([64])
    assert "barrier_ms" not in plain.columns and "tf_distribute_ms" not in plain.columns
    assert launches == [("paired", 64)]  # one launch by default


@pytest.mark.parametrize("call, word", [
    (lambda: exchange.exchange_cost([]), "batches"),
    (lambda: exchange.exchange_cost([64], np_=1), "np_"),
    (lambda: exchange.exchange_cost([64], variants=["nccl"]), "variants"),
])
def test_bad_input_names_the_parameter(call, word):
    with pytest.raises(ValueError, match=word):
        call()


def test_exchange_cost_reports_the_communication_threads(monkeypatch):
    # workers report their threads: Gloo's network thread takes 0.5 ms per step idle, 3 and 5 ms with the exchange
    def run(nps, *, sync=True, batch_size=64, extra=(), **kw):
        gloo = [3.0, 5.0] if sync else [0.5, 0.5]
        ranks = [{"thread_cpu_ms_per_step": {"training": 9.0, "horovod_background": 0.4 + sync * 0.2,
                                             "gloo_network": g}} for g in gloo]
        return pd.DataFrame([{"np": 2, "step_time_s": 0.012 if sync else 0.009, "cpu_step_time_s": 0.01,
                              "in_sync": sync, "ranks": ranks}])
    monkeypatch.setattr(scaling, "run", no_separate_launch)
    monkeypatch.setattr(scaling, "run_paired", fake_paired(run))
    cost = exchange.exchange_cost([64]).iloc[0]
    assert cost.no_sync_gloo_cpu_ms == pytest.approx(0.5) and cost.horovod_gloo_cpu_ms == pytest.approx(4.0)
    assert cost.no_sync_hvd_thread_cpu_ms == pytest.approx(0.4) and cost.horovod_hvd_thread_cpu_ms == pytest.approx(0.6)
    # a worker whose kernel hid the split: no columns rather than a made-up number
    monkeypatch.setattr(scaling, "run_paired", fake_paired(lambda nps, **kw: pd.DataFrame([{
        "np": 2, "step_time_s": 0.01, "cpu_step_time_s": 0.01, "in_sync": True,
        "ranks": [{"thread_cpu_ms_per_step": {"training": 9.0, "communication": 1.0}}] * 2}])))
    assert not any("gloo" in c for c in exchange.exchange_cost([64]).columns)
    # a worker without the report (no /proc): no columns rather than a made-up number
    monkeypatch.setattr(scaling, "run_paired", fake_paired(fake_run(lambda n, sync, b: 10.0)))
    assert not any("gloo" in c for c in exchange.exchange_cost([64]).columns)
