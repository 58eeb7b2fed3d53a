"""The scaling explorer: GPUs x model x GPU type x network x overlap -> predicted efficiency (04_horovod_scaling).

A view over labkit.scale.allreduce.predict (the ring-allreduce step-time model); it adds no numbers of its own.
"""
from __future__ import annotations


def explorer():
    """A widget: GPUs x model x GPU type x network x overlap -> predicted efficiency and images/s."""
    import ipywidgets as W

    from labkit.flops import hardware
    from labkit.scale import allreduce

    out = W.Output()
    gpus = W.SelectionSlider(options=[2 ** k for k in range(10)], value=64, description="GPUs")
    model = W.Dropdown(options=list(allreduce.MODELS), value="resnet101", description="model")
    gpu = W.Dropdown(options=list(hardware.DEVICES), value="P100", description="GPU")
    net = W.Dropdown(options=[k for k in allreduce.NETWORKS if "in node" not in k], value="25GbE (RoCE)",
                     description="network")
    overlap = W.FloatSlider(value=0.0, min=0.0, max=1.0, step=0.1, description="overlap")

    def update(*_):
        row = allreduce.predict([gpus.value], model=model.value, gpu=gpu.value, network=net.value,
                                overlap=overlap.value).iloc[0]
        with out:
            out.clear_output(wait=True)
            print(f"{gpus.value} x {gpu.value}, {model.value}, {net.value}, overlap {overlap.value:.0%}: "
                  f"efficiency {row.efficiency:.0%}, {row.images_per_sec:,.0f} images/s "
                  f"(compute {row.compute_s * 1e3:.0f} ms + exposed comm "
                  f"{(row.step_s - row.compute_s) * 1e3:.0f} ms per step)")

    for w in (gpus, model, gpu, net, overlap):
        w.observe(update, names="value")
    update()
    return W.VBox([W.HBox([gpus, model]), W.HBox([gpu, net]), overlap, out])
