"""labkit.cluster: time to accuracy with real Horovod workers (tta_train, the rank script; tta, its launches).

The validation a rank reports is the whole test set's accuracy: every rank counts its own shard, hvd.allreduce
averages (correct, count), and the ratio of the averages weighs each shard by its examples. The hand computations
below are that arithmetic; the one launch (horovod + slow) checks it on two real ranks.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from labkit.cluster import tta
from labkit.cluster.tta_train import (
    accuracy_of,
    eval_steps,
    local_counts,
    parse_args,
    steps_per_epoch,
    validation_shard,
)
from labkit.scale import launch


def _probs(predicted, classes=3):
    return np.eye(classes)[predicted]


def test_validation_averaged_over_unequal_shards_is_the_whole_test_sets_accuracy():
    # 5 test examples on 2 ranks: rank 0 holds 0, 2, 4 (2 of 3 right), rank 1 holds 1, 3 (1 of 2 right)
    labels = np.array([0, 1, 2, 0, 1])
    predicted = np.array([0, 1, 1, 2, 1])  # right: examples 0, 1, 4
    shards = [validation_shard(5, r, 2) for r in range(2)]
    assert [list(s) for s in shards] == [[0, 2, 4], [1, 3]]
    counts = [local_counts(_probs(predicted[s]), labels[s]) for s in shards]
    assert [list(c) for c in counts] == [[2, 3], [1, 2]]
    averaged = np.mean(counts, axis=0)  # what hvd.allreduce(op=hvd.Average) gives every rank
    assert accuracy_of(averaged) == pytest.approx(3 / 5)  # not (2/3 + 1/2) / 2, one vote per rank
    assert accuracy_of(averaged) != pytest.approx((2 / 3 + 1 / 2) / 2)


def test_the_shards_cover_the_test_set_once():
    for n, size in ((1000, 1), (1001, 2), (7, 4)):
        together = np.concatenate([validation_shard(n, r, size) for r in range(size)])
        assert sorted(together) == list(range(n))


def test_a_rank_without_test_examples_still_counts_in_the_average():
    counts = [local_counts(_probs(np.array([1])), np.array([1])), np.zeros(2)]  # 1 test example, 2 ranks: one empty
    assert accuracy_of(np.mean(counts, axis=0)) == 1.0
    with pytest.raises(ValueError, match="count"):
        accuracy_of([0, 0])


def test_every_rank_steps_alike_and_validates_at_the_start_each_half_epoch_and_the_end():
    assert steps_per_epoch(4001, 2, 32) == 62  # 2000 examples on the smaller shard: 62 full batches
    assert eval_steps(125, 2, 2) == [0, 62, 125, 188, 250]
    with pytest.raises(ValueError, match="batch_size"):
        steps_per_epoch(100, 4, 32)


@pytest.mark.parametrize("argv, word", [(["--epochs", "0"], "--epochs"), (["--warmup-epochs", "5"], "--warmup-epochs"),
                                        (["--model", "nope"], "--model"), (["--lr", "0"], "--lr")])
def test_the_worker_refuses_bad_options_in_one_line(argv, word, capsys):
    with pytest.raises(SystemExit) as err:
        parse_args(argv)
    assert err.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(lines) == 1 and word in lines[0]


@pytest.mark.parametrize("kw, word", [({"workers": (2, 1)}, "workers"), ({"workers": (0,)}, "workers"),
                                      ({"target": 1.5}, "target"), ({"scale_lr": "yes"}, "scale_lr"),
                                      ({"scale_lr": False, "warmup": True}, "warmup"),
                                      ({"progress": 3}, "progress")])
def test_bad_arguments_are_refused_before_any_launch(kw, word, monkeypatch):
    def no_launch(*a, **k):
        raise AssertionError("launched before the arguments were checked")
    monkeypatch.setattr(launch, "launch", no_launch)
    with pytest.raises(ValueError, match=word) as err:
        tta.time_to_accuracy(**kw)
    assert "\n" not in str(err.value)


def test_one_worker_runs_once_and_warmup_only_with_scaling():
    assert tta.runs((1, 2)) == [(1, False, False), (2, False, False), (2, True, False), (2, True, True)]
    assert tta.runs((1, 2), scale_lr=True, warmup=False) == [(1, False, False), (2, True, False)]
    assert tta.label(2, True, True) == "2 workers, LR x2 + warmup" and tta.label(1, True, True) == "1 worker"


def test_every_profiles_settings_pass_their_check():
    for name in ("quick", "workshop", "full"):
        s = tta.TTASettings.for_profile(name).check()
        assert steps_per_epoch(s.num_examples, 2, s.batch_size) >= s.evals_per_epoch


def test_summary_takes_the_first_validation_at_the_target_and_compares_with_one_worker():
    df = pd.DataFrame({"run": ["1 worker"] * 3 + ["2 workers"] * 3, "workers": [1] * 3 + [2] * 3,
                       "train_s": [0, 2, 4, 0, 1, 2], "epoch": [0, 1, 2] * 2, "target": 0.5,
                       "val_acc": [0.1, 0.5, 0.6, 0.1, 0.4, 0.45]})
    s = tta.summary(df).set_index("run")
    assert s.loc["1 worker", "time_to_target_s"] == 2 and np.isnan(s.loc["2 workers", "time_to_target_s"])
    assert s.loc["2 workers", "vs_one_worker_points"] == pytest.approx(-15)


@pytest.mark.slow
@pytest.mark.horovod
@pytest.mark.skipif(launch.horovodrun_path() is None, reason="horovodrun not installed")
def test_two_real_workers_report_the_whole_test_sets_accuracy(tmp_path):
    args = ["--num-examples", "256", "--num-test", "101", "--batch-size", "16", "--epochs", "1",
            "--evals-per-epoch", "1", "--scale-lr", "--warmup-epochs", "0.5"]
    ranks = launch.launch(2, args, module=tta.MODULE, launcher="gloo", progress=False, timeout=240,
                          out_dir=tmp_path)
    assert [r["test_this_rank"] for r in ranks] == [51, 50]
    assert ranks[0]["checksum"] == ranks[1]["checksum"]  # the gradients were averaged: the weights agree
    # every rank got the same allreduced accuracy, a count over all 101 test images
    accs = [[p["val_acc"] for p in r["points"]] for r in ranks]
    assert accs[0] == accs[1] and len(accs[0]) == 2
    assert all(abs(a * 101 - round(a * 101)) < 1e-3 for a in accs[0])
    assert ranks[0]["steps_per_epoch"] == 8 and ranks[0]["lr_peak"] == pytest.approx(0.02)
    log = (tmp_path / "tta_log.json").read_text()
    assert '"val_acc"' in log and '"train_s"' in log
