"""labkit.scale.allreduce: the ring-allreduce cost model against hand-computed values, the fit, the extrapolation
against published tables (He et al.'s MACs, datasheet GPU peaks), and the explorer widget over it."""
import numpy as np
import pytest

from labkit.scale import allreduce
from labkit.scale.allreduce import AllreduceModel, fusion_buffers, ring_allreduce_time


def test_ring_allreduce_matches_hand_computed_values():
    # p=4, alpha=10 us, beta=1 ns/B, n=1 MB: 2*3*10e-6 + 2*(3/4)*1e6*1e-9 = 60 us + 1.5 ms
    assert ring_allreduce_time(1e6, 4, 1e-5, 1e-9) == pytest.approx(1.56e-3)
    # reduction term: (3/4) * 1e6 * 2e-10 = 150 us
    assert ring_allreduce_time(1e6, 4, 1e-5, 1e-9, gamma=2e-10) == pytest.approx(1.71e-3)
    # p=2: 2 alpha + n beta
    assert ring_allreduce_time(4096, 2, 1e-3, 1e-9) == pytest.approx(2e-3 + 4096e-9)
    assert ring_allreduce_time(1e9, 1, 1.0, 1.0) == 0.0  # one worker sends nothing
    # the wire term tends to 2 n beta as p grows: the ring's bandwidth optimality
    assert ring_allreduce_time(1e6, 10**6, 0.0, 1e-9) == pytest.approx(2e-3, rel=1e-5)


def test_ring_allreduce_rejects_bad_input():
    with pytest.raises(ValueError, match="p must be"):
        ring_allreduce_time(10, 0, 1e-6, 1e-9)
    with pytest.raises(ValueError, match="p must be"):
        ring_allreduce_time(10, 2.5, 1e-6, 1e-9)
    with pytest.raises(ValueError, match="n_bytes"):
        ring_allreduce_time(-1, 2, 1e-6, 1e-9)
    with pytest.raises(ValueError, match="alpha"):
        ring_allreduce_time(10, 2, -1e-6, 1e-9)
    with pytest.raises(ValueError, match="beta"):
        ring_allreduce_time(10, 2, 1e-6, -1e-9)
    with pytest.raises(ValueError, match="beta"):
        ring_allreduce_time(10, 2, 1e-6, float("nan"))
    with pytest.raises(ValueError, match="gamma"):
        ring_allreduce_time(10, 2, 1e-6, 1e-9, gamma=-1.0)


def test_tensor_fusion_packs_in_order_up_to_the_threshold():
    assert fusion_buffers([10, 20, 30, 100], threshold=50) == [30, 30, 100]
    assert fusion_buffers([10, 20, 30], threshold=0) == [10, 20, 30]  # fusion off
    assert fusion_buffers([10, 20, 30], threshold=64 * 2**20) == [60]
    # Horovod 0.28.1's default buffer is 128 * 1024 * 1024 bytes (horovod/common/operations.cc), not the 64 MB
    # its documentation gives: 100 MiB + 20 MiB of gradients travel in one buffer
    assert fusion_buffers([100 * 2**20, 20 * 2**20]) == [120 * 2**20]
    assert fusion_buffers([100 * 2**20, 20 * 2**20, 10 * 2**20]) == [120 * 2**20, 10 * 2**20]
    with pytest.raises(ValueError, match="threshold"):
        fusion_buffers([1], threshold=-1)


def test_fusion_saves_latency_not_bandwidth():
    net = AllreduceModel(alpha=1e-3, beta=1e-9)
    tensors = [1000] * 10
    unfused = net.fused_time(tensors, 2, threshold=0)   # 10 x (2 alpha + 1000 beta)
    fused = net.fused_time(tensors, 2)                  # 1 x (2 alpha + 10000 beta)
    assert unfused == pytest.approx(10 * (2e-3 + 1000e-9))
    assert fused == pytest.approx(2e-3 + 10000e-9)


def test_fit_recovers_alpha_and_beta():
    true = AllreduceModel(alpha=4e-4, beta=2.5e-9)
    sizes = np.array([4, 1024, 65536, 2**20, 2**22])
    fit = allreduce.fit_alpha_beta(sizes, true.time(sizes, 2), p=2)
    assert fit.alpha == pytest.approx(4e-4, rel=1e-6)
    assert fit.beta == pytest.approx(2.5e-9, rel=1e-6)
    with pytest.raises(ValueError, match="p >= 2"):
        allreduce.fit_alpha_beta(sizes, true.time(sizes, 2), p=1)


def test_fit_rejects_zero_or_negative_times():
    sizes = [4, 1024, 65536]
    for bad in ([1e-3, 0.0, 2e-3], [1e-3, -1e-3, 2e-3], [1e-3, float("nan"), 2e-3]):
        with pytest.raises(ValueError, match="times must be"):
            allreduce.fit_alpha_beta(sizes, bad, p=2)
    with pytest.raises(ValueError, match="n_bytes"):
        allreduce.fit_alpha_beta([4, -1, 8], [1e-3, 1e-3, 1e-3], p=2)


def test_step_time_overlap_hides_at_most_the_compute():
    net = AllreduceModel(alpha=0.0, beta=1e-9)  # 1e8 bytes on 2 ranks: 0.1 s of communication
    assert allreduce.step_time(2, 0.5, [1e8], net, overlap=0.0) == pytest.approx(0.6)
    assert allreduce.step_time(2, 0.5, [1e8], net, overlap=0.5) == pytest.approx(0.55)
    assert allreduce.step_time(2, 0.05, [1e8], net, overlap=1.0) == pytest.approx(0.1)  # comm-bound
    with pytest.raises(ValueError, match="overlap"):
        allreduce.step_time(2, 0.5, [1e8], net, overlap=1.5)


@pytest.mark.parametrize("model, gmacs, mparams", [
    # He et al. 2016, Table 1 (their "FLOPs" are multiply-adds); Simonyan & Zisserman 2015; Szegedy et al. 2016
    ("resnet50", 3.8, 25.6), ("resnet101", 7.6, 44.5), ("vgg16", 15.5, 138.4), ("inception_v3", 5.7, 23.8),
])
def test_model_spec_counts_agree_with_the_papers(model, gmacs, mparams):
    spec = allreduce.model_spec(model)
    assert spec["macs"] / 1e9 == pytest.approx(gmacs, rel=0.03)
    assert spec["params"] / 1e6 == pytest.approx(mparams, rel=0.01)
    assert 0 < spec["grad_bytes"] <= 4 * spec["params"]


def test_resnet101_is_the_same_count_everywhere():
    from labkit.flops import counter as flops
    assert allreduce.model_spec("resnet101")["macs"] == flops.count_named("resnet101").macs


def test_prediction_compute_term_and_trends():
    # 32 images on a P100 (10.6 TFLOP/s FP32, NVIDIA's datasheet) at 50%: 32 * 6 * MACs / 5.3e12 s
    macs = allreduce.model_spec("resnet50")["macs"]
    df = allreduce.predict([1, 8, 512], model="resnet50", gpu="P100", batch_per_gpu=32, utilization=0.5)
    assert df["compute_s"].iloc[0] == pytest.approx(32 * 6 * macs / 5.3e12)
    assert df["efficiency"].iloc[0] == pytest.approx(1.0)
    assert df["efficiency"].is_monotonic_decreasing
    # the Horovod paper's ordering at 512 GPUs: VGG-16 (138M parameters) scales worse than ResNet-101
    vgg = allreduce.predict([512], model="vgg16")["efficiency"].iloc[0]
    resnet = allreduce.predict([512], model="resnet101")["efficiency"].iloc[0]
    assert vgg < resnet < 1.0
    with pytest.raises(ValueError, match="model must be"):
        allreduce.predict([2], model="no_such_net")
    with pytest.raises(ValueError, match="network must be"):
        allreduce.predict([2], network="carrier pigeon")
    with pytest.raises(ValueError, match="device must be"):
        allreduce.predict([2], gpu="abacus")
    for bad in (dict(batch_per_gpu=0), dict(gpus=[0, 2]), dict(gpus_per_node=0), dict(compute_s=-1.0)):
        with pytest.raises(ValueError, match=f"{next(iter(bad))} must be"):
            allreduce.predict(**{"gpus": [2], **bad})


def test_given_compute_and_gradients_need_no_model():
    df = allreduce.predict([2], model="anything", compute_s=0.1, grad_bytes=1e8,
                           network="10GbE (TCP)", intra_node="10GbE (TCP)")
    # 2 alpha + n beta on 2 GPUs: 60 us + 1e8 / 1.1e9 s
    assert df["comm_s"].item() == pytest.approx(60e-6 + 1e8 / 1.1e9)


def test_published_numbers_typed_from_the_sources():
    pub = allreduce.published()
    row = lambda src, gpus: pub[pub["source"].str.contains(src) & (pub["gpus"] == gpus)]["efficiency"].item()  # noqa
    chameleon = row("Chameleon", 8)
    assert chameleon * 8 == pytest.approx(7.525, rel=1e-3)  # 1466.31 / 194.86 images/s on 8 vs 1 node
    matlab = row("MATLAB", 8)
    assert matlab == pytest.approx(0.614, abs=1e-3)  # +70% per doubling, three doublings
    assert not pub["source"].str.contains("seed").any()  # sources by title and author


def test_explorer_widget_reports_the_model(capsys):
    pytest.importorskip("ipywidgets")
    from labkit.widgets.scaling import explorer
    box = explorer()
    out = box.children[-1]
    # in a kernel the text lands in the Output widget; without one, ipywidgets passes it to stdout
    text = "".join(o.get("text", "") for o in out.outputs) + capsys.readouterr().out
    row = allreduce.predict([64], model="resnet101", gpu="P100", network="25GbE (RoCE)").iloc[0]
    assert f"efficiency {row.efficiency:.0%}" in text
