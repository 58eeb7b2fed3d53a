"""Checkers for exercises whose answer is code: the learner's function runs on inputs the checker makes.

Called in the cell after an exercise as `fn = check.NAME(fn)`: the checker calls the learner's function on
shapes and values the learner did not choose (seeded random), compares with an oracle (TensorFlow, the course's
own train step, labkit.flops, a brute force), prints ONE line (correct / the usual mistake named / wrong, with
the smallest input that fails / not answered yet) and returns the reference function, so the lesson goes on
with it. The learner edition's placeholder (`answer = None` as the function's body) returns None, which is
"not answered yet". The checkers share labkit.exercises.check's registry (CHECKERS), so `labkit exercises list` and the
learner edition's builder know them; `check.NAME.judge(fn)` returns the Verdict instead. (01_cnn_basics)
"""
from __future__ import annotations

import functools

import numpy as np

from labkit.exercises.verdict import CHECKERS, NOT_ANSWERED, Verdict, _describe

__all__ = ["conv_macs_function", "im2col_function", "training_step"]


# ------------------------------------------------------------------------------------ the machinery
def _correct(text):
    return "correct", "Correct! " + text, None


def _mistake(key, text):
    return "mistake", "Not quite: " + text, key


def _wrong(text):
    return "wrong", "Not quite: " + text, None


def _unanswered():
    return "unanswered", NOT_ANSWERED, None


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _error(err) -> str:
    """An exception as the learner should read it: its type and the line of its message that names the cause."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()] or [""]
    first = lines[-1] if lines[0].startswith("in user code") else lines[0]  # a tf.function's: the cause is last
    name = type(err).__name__
    if first.startswith(name + ":"):
        first = first[len(name) + 1:].strip()
    return f"{name}: {_one_line(first, 160)}" if first else name


def _is_placeholder(fn) -> bool:
    """True for a function whose body uses no name at all (`answer = None`): the learner edition's stub."""
    code = getattr(fn, "__code__", None)
    return code is not None and not code.co_names and all(c is None or isinstance(c, str) for c in code.co_consts)


def _code_checker(reference, mistakes=()):
    """Register `judge(fn, rng) -> (status, message, mistake)` as check.NAME(fn, seed=0), which prints one line
    and returns reference() (the function the lesson goes on with)."""
    def wrap(judge_fn):
        def judge(answer=None, seed: int = 0) -> Verdict:
            ref = reference()
            if answer is None or answer is Ellipsis:
                return Verdict("unanswered", NOT_ANSWERED, ref)
            if not callable(answer):
                return Verdict("unreadable", f"Could not use your answer: expected the function you wrote, got "
                                             f"{_describe(answer)}.", ref)
            if callable(getattr(answer, "python_function", None)):  # a tf.function: bound to the first model it
                import tensorflow as tf  # saw, so each check gets a fresh one

                answer = tf.function(answer.python_function)
            try:
                status, message, mistake = judge_fn(answer, np.random.default_rng(seed))
            except Exception as err:  # the checker answers with a line, whatever the learner's code did
                status, message, mistake = ("unreadable", f"Could not check your function: {_error(err)}.", None)
            return Verdict(status, _one_line(message), ref, mistake)

        @functools.wraps(judge_fn)
        def run(answer=None, seed: int = 0):
            verdict = judge(answer, seed)
            print(verdict.message)
            return verdict.expected

        run.judge, run.mistakes = judge, tuple(mistakes)
        CHECKERS[judge_fn.__name__] = run
        return run
    return wrap


def _close(a, b, rtol=1e-4, atol=1e-6) -> bool:
    """Two lists of arrays equal, shape for shape, to float32 tolerance."""
    return len(a) == len(b) and all(np.shape(u) == np.shape(v) and np.allclose(u, v, rtol=rtol, atol=atol)
                                    for u, v in zip(a, b))


# ------------------------------------------------------------------------------------ 01_cnn_basics
def train_step_reference(model, optimizer, loss_fn, x, y):
    """One training step: forward and loss under the tape, gradients, the optimizer's update; returns the loss."""
    import tensorflow as tf

    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))  # training=True: batch norm uses (and updates) batch statistics
    grads = tape.gradient(loss, model.trainable_weights)
    optimizer.apply_gradients(zip(grads, model.trainable_weights))
    return loss


def _step_case(seed):
    """A small model with batch norm (so training=True matters): a maker of (model, optimizer) with the same
    initial weights, two batches, the loss, and the case in words."""
    import tensorflow as tf

    L, init = tf.keras.layers, tf.keras.initializers
    rng = np.random.default_rng(seed)
    n, h, w, c, classes = 6, 5, 6, 2, 4

    def build():  # every layer named and seeded: the check leaves the notebook's layer names and seeds alone
        return tf.keras.Sequential([
            tf.keras.Input((h, w, c), name="check_x"),
            L.Conv2D(3, (2, 3), kernel_initializer=init.GlorotUniform(seed), name="check_conv"),
            L.BatchNormalization(name="check_bn"), L.ReLU(name="check_relu"), L.Flatten(name="check_flatten"),
            L.Dense(classes, kernel_initializer=init.GlorotUniform(seed + 1), name="check_fc")], name="check_step")

    w0 = build().get_weights()

    def fresh():
        model = build()
        model.set_weights(w0)
        return model, tf.keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)

    batches = [(tf.constant(rng.normal(size=(n, h, w, c)).astype(np.float32)),
                tf.constant(rng.integers(0, classes, size=n).astype(np.int32))) for _ in range(2)]
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    what = (f"a batch of {n} images {h}x{w}x{c}, {classes} classes, a Conv2D(3, (2, 3)) -> BatchNormalization -> "
            "ReLU -> Dense model with SGD(0.1, momentum 0.9)")
    return fresh, batches, loss_fn, what


@functools.lru_cache(maxsize=4)
def _step_oracle(seed):
    """The course's own step (a tf.function) twice from the case's weights: losses and weights after each; and
    the weights after one step in inference mode (training=False). Cached: the case depends on the seed only."""
    import tensorflow as tf

    from labkit.base import training

    fresh, batches, loss_fn, _ = _step_case(seed)
    model, opt = fresh()
    step = training.make_train_step(model, opt, loss_fn)
    losses, weights = [], []
    for x, y in batches:
        losses.append(float(step(x, y)))
        weights.append(model.get_weights())
    model, opt = fresh()
    x, y = batches[0]
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=False))
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_weights), model.trainable_weights))
    return losses, weights, model.get_weights()


def _no_gradients(err) -> bool:
    return "No gradients provided" in str(err) or "NoneType" in str(err)


@_code_checker(lambda: train_step_reference, mistakes=(
    "tape_outside", "not_applied", "forgot_optimizer", "wrong_sign", "training_false", "loss_not_returned"))
def training_step(fn, rng):
    """train_step(model, optimizer, loss_fn, x, y): one step with tf.GradientTape, against the course's step.

    (01_cnn_basics)
    """
    seed = int(rng.integers(1 << 30))
    fresh, batches, loss_fn, what = _step_case(seed)
    model, opt = fresh()
    trainable0 = [v.numpy() for v in model.trainable_weights]
    (x1, y1), (x2, y2) = batches
    try:
        loss1 = fn(model, opt, loss_fn, x1, y1)
    except Exception as err:
        if _no_gradients(err):
            return _mistake("tape_outside", "no gradients reached the weights. The forward pass and the loss must "
                                            "be computed INSIDE `with tf.GradientTape() as tape:`; the tape only "
                                            "differentiates what it saw.")
        return _wrong(f"your function raised {_error(err)} on {what}.")
    if loss1 is None and _is_placeholder(fn):
        return _unanswered()
    w1, trainable1 = model.get_weights(), [v.numpy() for v in model.trainable_weights]
    if _close(trainable1, trainable0, rtol=0, atol=0):
        return _mistake("not_applied", "the weights did not change: the gradients are never applied. Finish with "
                                       "optimizer.apply_gradients(zip(grads, model.trainable_weights)).")
    if int(opt.iterations.numpy()) == 0:
        return _mistake("forgot_optimizer", "the weights moved, but not through the optimizer you were given (its "
                                            "step count is still 0): update with optimizer.apply_gradients(...), "
                                            "so its learning rate and momentum apply.")
    ref_losses, ref_weights, inference_weights = _step_oracle(seed)
    ref1 = ref_weights[0]
    ref_delta = [ref1[i] - a for i, a in zip(_trainable_index(model), trainable0)]
    if _close([b - a for b, a in zip(trainable1, trainable0)], [-d for d in ref_delta]):
        return _mistake("wrong_sign", "your step went uphill: the weights moved by +lr x gradient. Apply the "
                                      "gradients themselves; the optimizer subtracts them.")
    if not _close(w1, ref1):
        if _close(w1, inference_weights):
            return _mistake("training_false", "the forward pass ran in inference mode: call model(x, training=True) "
                                              "while training, so batch norm uses the batch's statistics and "
                                              "updates its moving averages.")
        return _wrong(f"after one step from the same weights on {what}, your weights differ from the reference "
                      "step's. Forward and loss under the tape, tape.gradient(loss, model.trainable_weights), "
                      "optimizer.apply_gradients.")
    try:
        got = float(np.asarray(loss1, dtype=float).reshape(()))
    except (TypeError, ValueError):
        got = None
    if got is None or not np.isclose(got, ref_losses[0], rtol=1e-4, atol=1e-6):
        return _mistake("loss_not_returned", f"the weights are right, but your function returned "
                                             f"{_describe(loss1)}; return the batch's loss ({ref_losses[0]:.4f} "
                                             "here), computed before the update.")
    try:
        fn(model, opt, loss_fn, x2, y2)
    except Exception as err:
        return _wrong(f"the first step was right, the second raised {_error(err)}.")
    if not _close(model.get_weights(), ref_weights[1]):
        return _wrong("the first step is right but the second is not: momentum lives in the optimizer's state, so "
                      "use the optimizer passed in (never a new one) at every step.")
    return _correct(f"two steps on {what} equal the course's training step: loss {ref_losses[0]:.4f} -> "
                    f"{ref_losses[1]:.4f} (a new batch), every weight and batch-norm statistic the same.")


def _trainable_index(model):
    """Positions of the trainable variables in model.get_weights() (the order of model.weights)."""
    index = {id(v): i for i, v in enumerate(model.weights)}
    return [index[id(v)] for v in model.trainable_weights]


# ------------------------------------------------------------------------------------ 02_im2col
def im2col_reference(x, kh, kw):
    """The (N*H_out*W_out, kh*kw*C) im2col matrix of x for a kh x kw kernel, stride 1, VALID (labkit.conv.im2col)."""
    from labkit import conv
    return conv.im2col(x, (kh, kw))


def _im2col_cases(rng):
    """(N, H, W, C, kh, kw), smallest first: non-square kernels, H != W and H_out != W_out, C > 1."""
    cases = [(1, 3, 5, 2, 2, 3)]
    while len(cases) < 5:
        kh, kw = (int(v) for v in rng.choice(np.arange(1, 5), size=2, replace=False))
        n, c = int(rng.integers(1, 4)), int(rng.integers(2, 5))
        h, w = kh + int(rng.integers(1, 6)), kw + int(rng.integers(1, 6))
        if h != w and h - kh != w - kw and (n, h, w, c, kh, kw) not in cases:
            cases.append((n, h, w, c, kh, kw))
    return sorted(cases, key=lambda t: t[0] * t[1] * t[2] * t[3])


def _patches(x, kh, kw):
    """TensorFlow's patches, (N, H_out, W_out, kh, kw, C): the oracle's im2col matrix before the reshape."""
    import tensorflow as tf

    n, h, w, c = x.shape
    p = tf.image.extract_patches(x, [1, kh, kw, 1], [1, 1, 1, 1], [1, 1, 1, 1], "VALID").numpy()
    return p.reshape(n, h - kh + 1, w - kw + 1, kh, kw, c)


def _im2col_mistakes(x, p, kh, kw):
    """[(mistake, its matrix before the reshape, hint)]: the usual ways an im2col goes wrong, from the patches p."""
    h, w = x.shape[1:3]
    ho, wo = h - kh + 1, w - kw + 1
    last = (f"the last window position counts too: a {kh}x{kw} window fits H - kh + 1 = {ho} times down and "
            f"W - kw + 1 = {wo} times across (range(H - kh + 1)).")
    variants = [
        ("channel_order", p.transpose(0, 1, 2, 5, 3, 4), "each row must list the patch as (row, column, "
         "channel), the order of w.reshape(-1, C_out) on HWIO weights: x[n, i:i+kh, j:j+kw, :].reshape(-1), "
         "not channels first."),
        ("channel_order", p.transpose(0, 1, 2, 3, 5, 4), "each row must list the patch as (row, column, "
         "channel), channels last, as x[n, i:i+kh, j:j+kw, :].reshape(-1) does."),
        ("off_by_one", p[:, :-1, :-1], last), ("off_by_one", p[:, :-1], last), ("off_by_one", p[:, :, :-1], last),
        ("hw_swapped", p.transpose(0, 2, 1, 3, 4, 5), "rows must follow the output pixels row by row (i = row "
         "outer loop, j = column inner), as the NHWC output is laid out; yours go column by column."),
        ("hw_swapped", p.transpose(0, 1, 2, 4, 3, 5), "each patch must be read row by row (kh rows of kw "
         "values); yours reads it column by column."),
    ]
    if h >= kw and w >= kh:  # the window slid kw tall and kh wide
        variants.append(("hw_swapped", _patches(x, kw, kh), f"the window is kh = {kh} rows TALL and kw = {kw} "
                                                            "columns WIDE; yours is the other way round."))
    return variants


@_code_checker(lambda: im2col_reference, mistakes=("channel_order", "off_by_one", "hw_swapped", "not_2d"))
def im2col_function(fn, rng):
    """my_im2col(x, kh, kw), stride 1 / VALID: im2col(x) @ w.reshape(-1, C_out) against tf.nn.conv2d. (02_im2col)"""
    import tensorflow as tf

    cases = _im2col_cases(rng)
    for n, h, w, c, kh, kw in cases:
        x = rng.standard_normal((n, h, w, c)).astype(np.float32)
        filters = rng.standard_normal((kh, kw, c, kh * kw * c + 1)).astype(np.float32)  # C_out > K: all of cols seen
        what = f"x of shape {(n, h, w, c)} and a {kh}x{kw} kernel"
        try:
            got = fn(x, kh, kw)
        except Exception as err:
            return _wrong(f"your function raised {_error(err)} for {what}.")
        if got is None:
            return _unanswered() if _is_placeholder(fn) else _wrong(f"your function returned None for {what}: end "
                                                                    "it with `return` and the matrix.")
        try:
            got = np.asarray(got, dtype=np.float64)
        except (TypeError, ValueError):
            return _wrong(f"your function returned {_describe(got)} for {what}; return a numpy array.")
        p = _patches(x, kh, kw)
        ho, wo, k = h - kh + 1, w - kw + 1, kh * kw * c
        expected = p.reshape(n * ho * wo, k)
        conv = tf.nn.conv2d(x, filters, 1, "VALID").numpy().reshape(-1, filters.shape[-1])
        if got.shape == expected.shape and np.allclose(got @ filters.reshape(k, -1), conv, rtol=1e-4, atol=1e-4):
            continue
        need = f"({n} x {ho} x {wo}, {kh} x {kw} x {c}) = {expected.shape}"
        if got.shape != expected.shape and got.size == expected.size and \
                np.allclose(got.reshape(expected.shape), expected, atol=1e-6):
            return _mistake("not_2d", f"right values, wrong shape {got.shape} for {what}: reshape to "
                                      f"(N*H_out*W_out, kh*kw*C) = {need}.")
        variants = _im2col_mistakes(x, p, kh, kw)
        for key, variant, hint in variants:
            variant = variant.reshape(-1, k)
            if variant.shape == expected.shape and np.allclose(variant, expected):
                continue  # this mistake gives the right answer here: not recognisable
            if got.shape == variant.shape and np.allclose(got, variant, atol=1e-6):
                return _mistake(key, f"for {what}: {hint}")
        if got.shape != expected.shape:
            return _wrong(f"your matrix has shape {got.shape} for {what}; it should be {need}.")
        return _wrong(f"for {what}, your im2col(x) @ w.reshape(-1, C_out) differs from tf.nn.conv2d. Row "
                      "(n x H_out + i) x W_out + j is x[n, i:i+kh, j:j+kw, :].reshape(-1).")
    (n, h, w, c, kh, kw), *_, (n2, h2, w2, c2, kh2, kw2) = cases
    return _correct(f"your im2col(x) @ w.reshape(-1, C_out) equals tf.nn.conv2d on {len(cases)} shapes, from x "
                    f"{(n, h, w, c)} with a {kh}x{kw} kernel to x {(n2, h2, w2, c2)} with a {kh2}x{kw2} kernel: a "
                    "convolution is one matrix multiply.")


# ------------------------------------------------------------------------------------ 03_flops
def conv_macs_reference(layer):
    """Multiply-adds of one conv layer per image (0 for any other layer), by labkit.flops's rule for it."""
    from labkit.flops import counter as flops

    rule = flops._rule_for(layer)
    if rule is None:
        return 0
    shape = lambda s: [tuple(s[1:])] if isinstance(s, tuple) else [tuple(t[1:]) for t in s]  # noqa: E731
    kind, macs, _ = rule(layer, shape(layer.input_shape), shape(layer.output_shape),
                         dict.fromkeys(flops._OPTIONS, False))
    return int(macs) if kind == "conv" else 0


def _macs_models(rng):
    """Three small models, smallest first: non-square kernels, strides, 'same' and 'valid', no groups."""
    import tensorflow as tf

    r = lambda lo, hi: int(rng.integers(lo, hi + 1))  # noqa: E731
    zeros = dict(kernel_initializer="zeros")  # no draw from TensorFlow's global seed: shapes are all that count
    L = tf.keras.layers
    first = tf.keras.Sequential([
        tf.keras.Input((7, 6, 2), name="image"),
        L.Conv2D(3, (3, 2), strides=(2, 1), padding="valid", name="conv_a", **zeros),
        L.Flatten(name="flatten"), L.Dense(2, name="fc", **zeros)], name="model_1")
    kh, kw = r(2, 4), r(1, 3)
    second = tf.keras.Sequential([
        tf.keras.Input((r(12, 16), r(12, 16), r(2, 4)), name="image"),
        L.Conv2D(r(3, 6), (kh, kw + (kw == kh)), strides=(r(1, 2), 2), padding="same", name="conv_b", **zeros),
        L.ReLU(name="relu"), L.MaxPooling2D(2, name="pool"),
        L.Conv2D(r(2, 5), (1, r(2, 3)), padding="valid", use_bias=False, name="conv_c", **zeros),
        L.GlobalAveragePooling2D(name="gap"), L.Dense(3, name="fc", **zeros)], name="model_2")
    inputs = tf.keras.Input((r(10, 16), r(8, 12), 3), name="image")
    x = L.Conv2D(r(4, 8), (3, 5), padding="same", name="conv_d", **zeros)(inputs)
    x = L.BatchNormalization(name="bn")(x)
    x = L.Conv2D(r(4, 8), (2, 3), strides=(2, 3), padding="valid", activation="relu", name="conv_e", **zeros)(x)
    x = L.Flatten(name="flatten")(x)
    third = tf.keras.Model(inputs, L.Dense(4, name="fc", **zeros)(x), name="model_3")
    return [first, second, third]


def _layer_text(layer):
    import tensorflow as tf

    if not isinstance(layer, tf.keras.layers.Conv2D):
        return f"layer {layer.name!r} ({type(layer).__name__})"
    (kh, kw), s = layer.kernel_size, layer.strides
    stride = s[0] if s[0] == s[1] else s
    size = lambda shape: "x".join(map(str, shape[1:]))  # noqa: E731
    return (f"layer {layer.name!r} (Conv2D, {layer.filters} filters of {kh}x{kw}, stride {stride}, {layer.padding!r}, "
            f"input {size(layer.input_shape)} -> output {size(layer.output_shape)})")


@_code_checker(lambda: conv_macs_reference, mistakes=("flops", "input_size", "bias", "not_conv"))
def conv_macs_function(fn, rng):
    """conv_macs(layer), summed over model.layers: the MACs of every conv layer against labkit.flops.count.

    (03_flops)
    """
    import tensorflow as tf

    from labkit.flops import counter as flops

    totals = []
    for model in _macs_models(rng):
        rows = {row.name: row for row in flops.count(model).rows}
        total = 0
        for layer in model.layers:
            row = rows[layer.name]
            expected = row.macs if row.kind == "conv" else 0
            is_conv = isinstance(layer, tf.keras.layers.Conv2D)
            where = f"{_layer_text(layer)} of {model.name}"
            try:
                got = fn(layer)
            except Exception as err:
                if not is_conv:
                    return _mistake("not_conv", f"your function raised {_error(err)} on {where}, which is not a "
                                                "convolution: return 0 for those (isinstance(layer, "
                                                "tf.keras.layers.Conv2D)).")
                return _wrong(f"your function raised {_error(err)} on {where}.")
            if got is None:
                if _is_placeholder(fn):
                    return _unanswered()
                return _wrong(f"your function returned None for {where}: return a number (0 for layers that are "
                              "not convolutions).")
            if isinstance(got, (bool, np.bool_)) or not isinstance(got, (int, float, np.integer, np.floating)):
                return _wrong(f"your function returned {_describe(got)} for {where}; return a number.")
            if np.isclose(got, expected, rtol=1e-9, atol=0):
                total += expected
                continue
            if not is_conv:
                return _mistake("not_conv", f"your function gave {got:,} for {where}; only convolutions count "
                                            "here: return 0 for every other layer.")
            (h_in, w_in, _), (h_out, w_out, c_out) = layer.input_shape[1:], layer.output_shape[1:]
            per_output = expected // (h_out * w_out * c_out)
            variants = [
                ("flops", 2 * expected, "that is FLOPs (2 per multiply-add); count MACs, each multiply-add once."),
                ("input_size", h_in * w_in * c_out * per_output, f"the output is {h_out}x{w_out}, not the input's "
                 f"{h_in}x{w_in}: strides and 'valid' padding shrink it (layer.output_shape)."),
                ("bias", expected + h_out * w_out * c_out, "the bias is an add, not a multiply-add: leave it out of "
                 "the MACs."),
                ("bias", expected + c_out, "the bias is an add, not a multiply-add: leave it out of the MACs."),
            ]
            for key, value, hint in variants:
                if value != expected and np.isclose(got, value, rtol=1e-9, atol=0):
                    return _mistake(key, f"{where}: you gave {got:,}, labkit.flops.count says {expected:,}; {hint}")
            return _wrong(f"{where}: you gave {got:,}, labkit.flops.count says {expected:,} = H_out x W_out x "
                          "C_out x kh x kw x C_in.")
        totals.append(f"{model.name} {total:,}")
    return _correct(f"every layer of three models the checker built (non-square kernels, strides, 'same' and "
                    f"'valid', bias or not) matches labkit.flops.count; conv MACs per image: {', '.join(totals)}.")

