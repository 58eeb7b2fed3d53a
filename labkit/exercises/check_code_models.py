"""Checkers for exercises whose answer is code, 05-06: the Pareto front (05) and the transfer set-up (06).

The same kind as labkit.exercises.check_code (whose machinery they use): the learner's function runs on inputs the
checker makes, against a brute force or a real Keras training step, and one line is printed. (05_network_sweep)
"""
from __future__ import annotations

import numpy as np

from labkit.exercises.check_code import _code_checker, _correct, _error, _is_placeholder, _mistake, _unanswered, _wrong
from labkit.exercises.verdict import _describe

__all__ = ["pareto_function", "transfer_function"]


# ------------------------------------------------------------------------------------ 05_network_sweep
def pareto_reference(points):
    """Indices of the (memory, accuracy) points no other point beats, ordered by memory (labkit.sweep)."""
    from labkit.sweep.runner import pareto_front
    return pareto_front(points)


def _front(points, beats):
    """Brute force: the points no other point beats, by memory then index."""
    keep = [i for i, p in enumerate(points) if not any(beats(q, p) for j, q in enumerate(points) if j != i)]
    return sorted(keep, key=lambda i: (points[i][0], i))


def _beats(q, p):  # less or equal memory, higher or equal accuracy, one strictly
    return q[0] <= p[0] and q[1] >= p[1] and (q[0] < p[0] or q[1] > p[1])


def _pareto_cases(rng):
    """Smallest first: one point, two, duplicates, ties on each axis, then random sets full of ties."""
    cases = [[(1.0, 0.5)], [(2.0, 0.5), (1.0, 0.4)], [(1.0, 0.5), (1.0, 0.5)], [(1.0, 0.5), (1.0, 0.7)],
             [(1.0, 0.5), (2.0, 0.5)], [(3.0, 0.6), (1.0, 0.5), (3.0, 0.6), (2.0, 0.4)]]
    for n in (6, 9, 14, 21, 30):
        memory = rng.integers(1, max(3, n // 2), size=n).astype(float)
        accuracy = rng.integers(1, max(3, n // 2), size=n) / 10
        points = [(float(m), float(a)) for m, a in zip(memory, accuracy)]
        points.append(points[int(rng.integers(n))])  # an exact duplicate
        cases.append([points[i] for i in rng.permutation(len(points))])
    return cases


def _indices(result, n):
    """The learner's result as a list of ints, or a reason it is not one."""
    if isinstance(result, (str, bytes, dict)) or not hasattr(result, "__iter__"):
        return None, f"returned {_describe(result)}; return a list of indices"
    out = []
    for item in result:
        if isinstance(item, (bool, np.bool_)) or not isinstance(item, (int, np.integer)):
            if isinstance(item, (tuple, list, np.ndarray)):
                return None, "returned points; return their indices (positions in the list) instead"
            return None, f"returned {_describe(result)}; return a list of whole-number indices"
        if not 0 <= item < n:
            return None, f"returned the index {item}; indices run from 0 to {n - 1}"
        out.append(int(item))
    return out, None


@_code_checker(lambda: pareto_reference, mistakes=("strict", "twins", "order", "maximised_memory"))
def pareto_function(fn, rng):
    """my_pareto_front(points): the front's indices ordered by memory, against a brute force. (05_network_sweep)"""
    cases = _pareto_cases(rng)
    for points in cases:
        what = f"the points {points}" if len(points) <= 8 else f"{len(points)} random points with ties"
        try:
            result = fn([tuple(p) for p in points])
        except Exception as err:
            return _wrong(f"your function raised {_error(err)} on {what}.")
        if result is None:
            return _unanswered() if _is_placeholder(fn) else _wrong(f"your function returned None on {what}: end "
                                                                    "it with `return` and the list of indices.")
        got, why = _indices(result, len(points))
        if got is None:
            return _wrong(f"on {what} your function {why}.")
        front = _front(points, _beats)
        memories = [points[i][0] for i in got]
        if sorted(got) == sorted(front) and len(got) == len(set(got)) and memories == sorted(memories):
            continue
        variants = [
            ("strict", lambda q, p: q[0] < p[0] and q[1] > p[1], "a point is also beaten by one with EQUAL memory "
             "and higher accuracy (or equal accuracy and less memory): less or equal on memory, higher or equal on "
             "accuracy, one of them strictly."),
            ("twins", lambda q, p: q[0] <= p[0] and q[1] >= p[1], "an exact duplicate does not beat its twin: "
             "at least one of the two comparisons must be strict."),
            ("maximised_memory", lambda q, p: _beats((-q[0], q[1]), (-p[0], p[1])), "less memory is better: a "
             "point is beaten by one with LESS (or equal) memory and higher (or equal) accuracy."),
        ]
        for key, beats, hint in variants:
            wrong_front = set(_front(points, beats))
            if wrong_front != set(front) and set(got) == wrong_front and len(got) == len(wrong_front):
                return _mistake(key, f"on {what} you gave {got}, the front is {front}: {hint}")
        if sorted(got) == sorted(front) and len(got) == len(set(got)):
            return _mistake("order", f"on {what} you gave {got}: the right points, but order them by memory "
                                     f"(smallest first): {front}.")
        return _wrong(f"on {what} you gave {got}; the front is {front}.")
    return _correct(f"your front equals a brute force on {len(cases)} sets of points, duplicates and ties on both "
                    "axes included, ordered by memory.")


# ------------------------------------------------------------------------------------ 06_transfer_learning
MOMENTUM = 0.9  # the recipe's SGD momentum (the paper's and labkit.transfer's)


def transfer_reference(model, frozen, lr):
    """Freeze the layers named in `frozen`, give the new head the paper's factors (x10 weights, x20 biases) at
    learning rate lr (SGD, momentum 0.9), compile; returns the model. (06_transfer_learning)"""
    from labkit import transfer

    for layer in model.layers:
        if layer.name in frozen:
            layer.trainable = False
    optimizer = transfer.sgd_with_lr_factors(model, {transfer.HEAD: transfer.HEAD_LR_FACTORS}, learning_rate=lr,
                                             momentum=MOMENTUM)
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _transfer_case(rng):
    """A small pretrained-style model (compiled for training from scratch, as a model arrives), and a batch."""
    import tensorflow as tf

    from labkit import transfer
    from labkit.models.cifar import sweep_net

    base = sweep_net(filters=4, filter_size=3, pool_size=2, input_shape=(12, 12, 3), classes=5)
    model = transfer.transfer_model(base, 3)
    model.set_weights([rng.normal(0, 0.3, size=w.shape).astype(np.float32) for w in model.get_weights()])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy")
    x = rng.normal(size=(8, 12, 12, 3)).astype(np.float32)
    y = (np.arange(8) % 3).astype(np.int32)
    return model, x, y


def _expected_moves(model, x, y, lr):
    """lr x gradient of the compiled loss for every weight of the model (what plain SGD's first step moves)."""
    import tensorflow as tf

    with tf.GradientTape() as tape:
        tape.watch(model.weights)  # frozen ones too: the oracle needs their gradient to see they did not move
        loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(y, model(x, training=True)))
        loss += sum(model.losses) if model.losses else 0.0
    return {v.name: lr * g.numpy() for v, g in zip(model.weights, tape.gradient(loss, model.weights))}


def _ratio(moved, step):
    """How many times lr x gradient a variable moved (least squares; 0 when it did not move)."""
    return float(np.vdot(moved, -step) / max(np.vdot(step, step), 1e-30))


def _rates(model, ratios, frozen, what):
    """The first wrong learning rate (a trainable base layer off factor 1, the head off the paper's factors), or
    None."""
    from labkit import transfer

    head, factors = transfer.HEAD, transfer.HEAD_LR_FACTORS
    head_layer = model.get_layer(head)
    for layer in model.layers:
        if layer.name in frozen or layer.name == head or not layer.weights:
            continue
        got = [ratios[v.name] for v in layer.weights]
        if not np.allclose(got, 1.0, rtol=1e-2):
            if any(np.isclose(r, f, rtol=1e-2) for r in got for f in factors.values()):
                return _mistake("factor_on_base", f"{layer.name!r} moved {max(got):.1f}x the base rate "
                                                  f"({what}): the factors are for the new head only; the "
                                                  "base trains at lr.")
            return _wrong(f"{layer.name!r} moved {max(got):.2f}x lr x gradient ({what}); a trainable base "
                          "layer learns at lr, factor 1.")
    got = {w.name.split("/")[-1].split(":")[0]: ratios[w.name] for w in head_layer.weights}
    if all(np.isclose(r, 1.0, rtol=1e-2) for r in got.values()):
        return _mistake("no_factors", f"{head!r} learns at the base rate ({what}): give it the paper's "
                                      f"factors, transfer.sgd_with_lr_factors(model, {{{head!r}: {factors}}}, "
                                      "learning_rate=lr, momentum=0.9).")
    if not all(np.isclose(got[k], f, rtol=1e-2) for k, f in factors.items()):
        shown = ", ".join(f"{k} x{got[k]:.1f}" for k in factors)
        want = ", ".join(f"{k} x{f:g}" for k, f in factors.items())
        return _wrong(f"{head!r} moved {shown} the base rate ({what}); the paper's factors are {want}.")
    return None


def _momentum(model, x, y, lr, start, frozen, what):
    """A second step moves lr x factor x gradient + momentum x the first move: None at MOMENTUM, else the verdict."""
    from labkit import transfer

    first = {v.name: v.numpy() for v in model.weights}
    plain = _expected_moves(model, x, y, lr)  # lr x gradient at the weights after the first step
    try:
        model.train_on_batch(x, y)
    except Exception as err:
        return _wrong(f"a second training step of the model your function returned raised {_error(err)} ({what}).")
    head, factors = transfer.HEAD, transfer.HEAD_LR_FACTORS
    carried, previous = [], []
    for layer in model.layers:
        if layer.name in frozen:
            continue
        for v in layer.weights:
            factor = factors[v.name.split("/")[-1].split(":")[0]] if layer.name == head else 1.0
            carried.append((v.numpy() - first[v.name] + factor * plain[v.name]).ravel())  # the second move - SGD's
            previous.append((first[v.name] - start[v.name]).ravel())  # the first move
    carried, previous = np.concatenate(carried), np.concatenate(previous)
    m = float(np.vdot(carried, previous) / max(np.vdot(previous, previous), 1e-30))
    if np.isclose(m, MOMENTUM, atol=0.02):
        return None
    if abs(m) < 0.02:
        return _mistake("no_momentum", f"the rates are right in one step, but the second step carries nothing of "
                                       f"the first ({what}): the recipe is SGD with momentum {MOMENTUM:g}, "
                                       f"transfer.sgd_with_lr_factors(..., momentum={MOMENTUM:g}).")
    return _wrong(f"the second step carries on {m:.2f} of the first step's move ({what}); SGD with momentum "
                  f"{MOMENTUM:g} carries on {MOMENTUM:g}.")


@_code_checker(lambda: transfer_reference, mistakes=("forgot_recompile", "froze_head", "factor_on_base",
                                                     "no_factors", "not_frozen", "no_momentum"))
def transfer_function(fn, rng):
    """prepare_transfer(model, frozen, lr): frozen layers stay put after a step, the head learns at x10 / x20, and
    a second step shows the momentum (0.9).

    (06_transfer_learning)
    """
    from labkit import transfer

    lr, head = 0.01, transfer.HEAD
    factors = transfer.HEAD_LR_FACTORS
    frozen = ["conv1"]  # the base's first layer: conv2 is a trainable base layer, so a misplaced factor shows
    model, x, y = _transfer_case(rng)
    what = f"frozen={frozen}, lr={lr}"
    try:
        result = fn(model, list(frozen), lr)
    except Exception as err:
        if not model.get_layer(head).trainable:
            return _mistake("froze_head", f"{head!r} is frozen too ({what}), so nothing new can learn: freeze "
                                          "only the layers named in `frozen`; the new head must train.")
        return _wrong(f"your function raised {_error(err)} ({what}, on a small transfer model: conv1, conv2, "
                      f"{head}).")
    if result is None and _is_placeholder(fn):
        return _unanswered()
    model = model if result is None else result
    if not hasattr(model, "train_on_batch") or not hasattr(model, "get_layer"):
        return _wrong(f"your function returned {_describe(result)}; return the compiled model.")
    moves = _expected_moves(model, x, y, lr)
    before = {v.name: v.numpy() for v in model.weights}
    try:
        model.train_on_batch(x, y)
    except Exception as err:
        return _wrong(f"training the model your function returned raised {_error(err)} ({what}).")
    ratios = {v.name: _ratio(v.numpy() - before[v.name], moves[v.name]) for v in model.weights}
    moved = {v.name: not np.array_equal(v.numpy(), before[v.name]) for v in model.weights}
    layer_of = {v.name: layer.name for layer in model.layers for v in layer.weights}
    for name in sorted(moved):
        layer = model.get_layer(layer_of[name])
        if layer.name in frozen and moved[name]:
            if not layer.trainable:
                return _mistake("forgot_recompile", f"{layer.name!r} is marked trainable=False but still moved "
                                                    f"({what}): Keras reads `trainable` when the model is "
                                                    "compiled, so compile AFTER freezing.")
            return _mistake("not_frozen", f"{layer.name!r} still trains ({what}): set its trainable to False.")
    head_layer = model.get_layer(head)
    if not any(moved[v.name] for v in head_layer.weights):
        if not head_layer.trainable:
            return _mistake("froze_head", f"{head!r} did not move: it is frozen too, so nothing new learns; "
                                          "freeze only the layers named in `frozen`.")
        return _wrong(f"{head!r} did not move in one training step ({what}).")
    return _rates(model, ratios, frozen, what) or _momentum(model, x, y, lr, before, frozen, what) or _correct(
        f"in two real Keras training steps (frozen={frozen}, lr={lr}) the frozen layer did not move, conv2 learned "
        f"at lr and the new head at x{factors['kernel']:g} (weights) and x{factors['bias']:g} (biases), and the "
        f"second step carried on {MOMENTUM:g} of the first (momentum {MOMENTUM:g}).")
