"""Exercise checkers: each reference answer passes, the placeholder is 'not answered yet', and every mistake a
checker claims to recognise is made here the way a learner would make it and gets its own hint.

Correct answers come from an oracle where one exists (TensorFlow's conv/pooling/patches, Keras's parameter
counts, a simulated ring allreduce, the paper's parameter formula, a brute-force Pareto front), otherwise from
the formula written out as the learner would.
"""
import math

import numpy as np
import pytest
import tensorflow as tf

from labkit.exercises import check
from labkit.exercises.verdict import NOT_ANSWERED

RNG = np.random.default_rng(0)


def _out(size, k, s, p):  # TensorFlow as the oracle for a conv's output size
    x = tf.zeros((1, size, size, 1))
    return int(tf.nn.conv2d(x, tf.zeros((k, k, 1, 1)), s, [[0, 0], [p, p], [p, p], [0, 0]]).shape[1])


def _ring_sent(n_values, p):
    """Run a ring allreduce (reduce-scatter + allgather) on p simulated ranks; bytes rank 0 sends (float32)."""
    data = [RNG.normal(size=n_values) for _ in range(p)]
    chunks = [np.array_split(d.copy(), p) for d in data]
    sent = 0
    for step in range(p - 1):  # reduce-scatter: rank r sends chunk (r - step) to r + 1, which adds it
        msgs = [(r, (r - step) % p, chunks[r][(r - step) % p].copy()) for r in range(p)]
        for r, c, m in msgs:
            chunks[(r + 1) % p][c] += m
        sent += msgs[0][2].size * 4
    for step in range(p - 1):  # allgather: rank r sends its finished chunk (r + 1 - step) to r + 1
        msgs = [(r, (r + 1 - step) % p, chunks[r][(r + 1 - step) % p].copy()) for r in range(p)]
        for r, c, m in msgs:
            chunks[(r + 1) % p][c] = m
        sent += msgs[0][2].size * 4
    total = sum(data)
    assert all(np.allclose(np.concatenate(chunks[r]), total) for r in range(p)), "the simulated ring is wrong"
    return sent


def _front(points):  # brute force: a point is beaten by one no worse on both axes and better on one
    return sorted(i for i, (m, a) in enumerate(points)
                  if not any(mj <= m and aj >= a and (mj < m or aj > a) for mj, aj in points))


def _sweep_net(**cfg):
    from labkit.models.cifar import sweep_net
    return sweep_net(**cfg)


def _transfer_case():
    from labkit.transfer import finetune as transfer
    base = _sweep_net(filters=4, filter_size=3, pool_size=2, classes=5)
    return base, transfer.transfer_model(base, 5, freeze_base=True)


def cases():
    """(checker name, numbers, correct answer, {mistake key: the learner's wrong answer})."""
    x, w, b = RNG.normal(size=(2, 5)), RNG.normal(size=(5, 3)), RNG.normal(size=3)
    dense = tf.keras.layers.Dense(3)
    dense.build((None, 5))
    dense.set_weights([w, b])
    img = RNG.normal(size=(1, 7, 8, 2))
    patches = tf.image.extract_patches(img, [1, 3, 3, 1], [1, 2, 2, 1], [1, 1, 1, 1], "VALID").numpy()
    n, size, k, s, c_out = 4, 32, 3, 2, 16
    ho = _out(size, k, s, 0)
    m, kk = n * ho * ho, k * k * 3
    pool = tuple(tf.keras.layers.MaxPooling2D(3, 2)(tf.zeros((1, 15, 15, 8))).shape[1:])
    pts = [(10, 0.5), (20, 0.7), (15, 0.4), (30, 0.7), (40, 0.9), (25, 0.75)]
    cfg = dict(filters=20, filter_size=5, pool_size=3, extra_conv=True)
    try:
        from labkit.sweep.networks import matlab_param_count
    except ImportError:
        from labkit.sweep.runner import matlab_param_count
    model = _sweep_net(**cfg)
    weights_only = sum(int(np.prod(v.shape)) for v in model.trainable_weights if "kernel" in v.name)
    base, frozen = _transfer_case()
    features = int(np.prod(frozen.get_layer("new_fc").input.shape[1:]))
    conv_keras = tf.keras.layers.Conv2D(64, 3)
    conv_keras.build((None, 8, 8, 32))
    return [
        ("conv_output_size", dict(size=20, kernel=3, stride=2, padding=4), _out(20, 3, 2, 4), {
            "no_plus_one": (20 + 8 - 3) // 2, "no_padding": (20 - 3) // 2 + 1,
            "one_side_padding": (20 + 4 - 3) // 2 + 1,
            "no_stride": 20 + 8 - 3 + 1, "ceil": math.ceil((20 + 8 - 3) / 2) + 1}),
        ("dense_output", dict(x=x, w=w, b=b), dense(x).numpy(), {
            "no_bias": x @ w, "transposed": (x @ w + b).T, "transposed_no_bias": w.T @ x.T}),
        ("pool_output_shape", dict(input_shape=(15, 15, 8), pool_size=3, strides=2), pool, {
            "wrong_rank": (7, 7), "channels": (7, 7, 1), "no_stride": (13, 13, 8), "no_plus_one": (6, 6, 8),
            "halved": None}),
        ("pool_output_shape", dict(input_shape=(16, 16, 8), pool_size=3, strides=2),
         tuple(tf.keras.layers.MaxPooling2D(3, 2)(tf.zeros((1, 16, 16, 8))).shape[1:]), {"halved": (8, 8, 8)}),
        ("im2col_shape", dict(input_shape=(n, size, size, 3), kernel_size=k, strides=s),
         tf.image.extract_patches(tf.zeros((n, size, size, 3)), [1, k, k, 1], [1, s, s, 1], [1, 1, 1, 1],
                                  "VALID").numpy().reshape(-1, kk).shape, {
            "transposed": (kk, m), "no_channels": (m, k * k), "input_pixels": (n * size * size, kk),
            "no_batch": (ho * ho, kk)}),
        ("patch", dict(x=img, kernel_size=3, pixel=(1, 2), strides=2), patches[0, 1, 2], {
            "not_flat": img[0, 2:5, 4:7, :], "channel_order": img[0, 2:5, 4:7, :].transpose(2, 0, 1).ravel(),
            "no_stride": img[0, 1:4, 2:5, :].ravel(), "swapped": img[0, 4:7, 2:5, :].ravel()}),
        ("gemm_flops", dict(input_shape=(n, size, size, 3), kernel_size=k, c_out=c_out, strides=s),
         2 * m * kk * c_out, {"macs": m * kk * c_out, "input_pixels": 2 * n * size * size * kk * c_out,
                              "no_kernel": 2 * m * 3 * c_out}),
        ("im2col_mib", dict(input_shape=(n, size, size, 3), kernel_size=k, strides=s), m * kk * 4 / 2**20, {
            "values_not_bytes": m * kk / 2**20, "mb_not_mib": m * kk * 4 / 1e6,
            "input_size": n * size * size * 3 * 4 / 2**20}),
        ("conv_macs", dict(input_hw=224, kernel=3, c_in=64, c_out=64), 224 * 224 * 3 * 3 * 64 * 64, {
            "flops": 2 * 224 * 224 * 9 * 64 * 64, "no_c_in": 224 * 224 * 9 * 64, "no_kernel": 224 * 224 * 64 * 64}),
        ("conv_macs", dict(input_hw=56, kernel=3, c_in=64, c_out=128, stride=2), 28 * 28 * 9 * 64 * 128, {}),
        ("conv_params", dict(kernel=3, c_in=32, c_out=64), conv_keras.count_params(), {
            "no_bias": 3 * 3 * 32 * 64, "no_c_in": 3 * 3 * 64 + 64, "bias_per_input": 3 * 3 * 32 * 64 + 32 * 64,
            "one_kernel_side": 3 * 32 * 64 + 64}),
        ("activation_mb", dict(shape=(224, 224, 64), batch_size=32), 32 * 224 * 224 * 64 * 4 / 1e6, {
            "no_batch": 224 * 224 * 64 * 4 / 1e6, "values_not_bytes": 32 * 224 * 224 * 64 / 1e6,
            "mib": 32 * 224 * 224 * 64 * 4 / 2**20}),
        ("ring_bytes_sent", dict(n_bytes=4 * 1200, workers=4), _ring_sent(1200, 4), {
            "no_fraction": 2 * 4 * 1200, "one_phase": 3 / 4 * 4 * 1200, "naive": 3 * 4 * 1200, "one_chunk": 1200}),
        ("scaled_lr", dict(base_lr=0.1, base_batch_size=256, batch_per_worker=64, workers=8), 0.1 * 512 / 256, {
            "unscaled": 0.1, "per_worker_batch": 0.1 * 64 / 256, "workers_only": 0.8, "sqrt": 0.1 * math.sqrt(2)}),
        ("warmup_lr", dict(base_lr=0.1, target_lr=0.8, step=100, warmup_steps=500), 0.1 + 0.7 * 100 / 500, {
            "no_warmup": 0.8, "from_zero": 0.8 * 100 / 500, "unscaled": 0.1}),
        ("efficiency", dict(images_per_sec_1=100.0, images_per_sec_n=340.0, workers=4), 340 / 400, {
            "speedup": 3.4, "inverted": 400 / 340, "percent": 85.0}),
        ("memory_footprint", cfg, 4 * matlab_param_count(cfg), {
            "params": matlab_param_count(cfg), "no_bias": 4 * weights_only, "bits": 32 * matlab_param_count(cfg),
            "kilobytes": 4 * matlab_param_count(cfg) / 1000, "kibibytes": 4 * matlab_param_count(cfg) / 1024}),
        # the oracle: j beats i when the front of the pair (i, j) is j alone (the brute force _front above)
        ("beaten_by", dict(points=pts, index=3),
         [j for j in range(len(pts)) if j != 3 and _front([pts[3], pts[j]]) == [1]],
         {"memory_only": [j for j in range(len(pts)) if j != 3 and pts[j][0] <= pts[3][0]],
          "accuracy_only": [j for j in range(len(pts)) if j != 3 and pts[j][1] >= pts[3][1]]}),
        ("beaten_by", dict(points=pts, index=5),
         [j for j in range(len(pts)) if j != 5 and _front([pts[5], pts[j]]) == [1]], {}),
        ("pareto_front", dict(points=pts), _front(pts), {
            "out_of_range": [0, 1, 6], "maximised_memory": _front([(-m_, a) for m_, a in pts]),
            "extra_or_missing": [0, 1, 2, 5, 4]}),
        ("frozen_layers", dict(model=frozen),
         [layer.name for layer in frozen.layers if layer.weights and layer.name != "new_fc"], {
             "unknown": ["conv1", "conv_2"], "head_frozen": ["conv1", "conv2", "new_fc"], "missing": ["conv1"]}),
        ("effective_lr", dict(lr=0.01, transfer_lr_drop=10, factor=20), 0.01 / 10 * 20, {
            "no_factor": 0.001, "no_drop": 0.2, "divided": 0.01 / 10 / 20}),
        ("head_params", dict(base=base, classes=5), features * 5 + 5, {
            "no_bias": features * 5, "everything": frozen.count_params(),
            "base": frozen.count_params() - features * 5 - 5}),
    ]


CASES = cases()
IDS = [f"{name}-{i}" for i, (name, *_) in enumerate(CASES)]


@pytest.mark.parametrize("name, numbers, correct, mistakes", CASES, ids=IDS)
def test_reference_solution_passes_and_placeholder_is_unanswered(name, numbers, correct, mistakes, capsys):
    fn = check.CHECKERS[name]
    assert fn.judge(correct, **numbers).status == "correct"
    ref = fn(None, **numbers)  # the notebook's call: prints a line, returns the reference for later cells
    assert capsys.readouterr().out.strip() == NOT_ANSWERED
    assert fn.judge(ref, **numbers).status == "correct"


@pytest.mark.parametrize("name, numbers, correct, mistakes", CASES, ids=IDS)
def test_each_recognised_mistake_gets_its_hint(name, numbers, correct, mistakes):
    fn = check.CHECKERS[name]
    for key, wrong in mistakes.items():
        if wrong is None:
            continue
        verdict = fn.judge(wrong, **numbers)
        assert (verdict.status, verdict.mistake) == ("mistake", key), (key, verdict)
        assert "\n" not in verdict.message and len(verdict.message) < 300


def test_every_claimed_mistake_is_tested():
    tested, claimed = {}, {}
    for name, numbers, _, mistakes in CASES:
        tested.setdefault(name, set()).update(k for k, v in mistakes.items() if v is not None)
        claimed.setdefault(name, set()).update(key for key, *_ in check.CHECKERS[name].spec(**numbers).mistakes)
    arithmetic = {name for name, fn in check.CHECKERS.items() if hasattr(fn, "spec")}  # code checkers: test_check_code
    assert set(tested) == arithmetic, "every checker needs a case"
    assert tested == claimed


BAD = [None, "12", "", float("nan"), float("inf"), np.zeros((3, 4)), [1, "a"], {"a": 1}, object(), True, -1, 1e300,
       [[1, 2], [3, 4]], np.array([np.nan]), ...]


@pytest.mark.parametrize("name, numbers, correct, mistakes", CASES, ids=IDS)
def test_bad_answers_get_a_line_never_a_traceback(name, numbers, correct, mistakes, capsys):
    fn = check.CHECKERS[name]
    for answer in BAD:
        if answer is True and isinstance(correct, bool):
            continue  # a yes/no question: True is a real answer there
        fn(answer, **numbers)
        line = capsys.readouterr().out
        assert line.count("\n") == 1 and not line.startswith("Correct"), (answer, line)
    assert fn.judge(None, **numbers).status == fn.judge(..., **numbers).status == "unanswered"


def test_a_wrong_answer_with_no_known_mistake_says_so_with_the_formula():
    verdict = check.conv_output_size.judge(3, size=32, kernel=5, stride=2, padding=2)
    assert verdict.status == "wrong" and "floor((size + 2 x padding - kernel) / stride) + 1" in verdict.message


def test_importing_check_does_not_import_tensorflow():
    import subprocess
    import sys
    code = "import sys, labkit.exercises.check, labkit.exercises.build; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
