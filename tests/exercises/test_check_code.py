"""Code exercises' checkers: each is fed a correct solution written the way a learner would (not the reference),
every mistake it claims to name (written as the learner's code), the learner edition's placeholder, None, and
garbage; and an exercise whose solution is a function body goes through the learner-edition builder and runs.

The oracles are the checkers' own (TensorFlow's conv and patches, the course's tf.function train step,
labkit.flops.count, a brute-force front, a real Keras training step); the reference each checker returns must pass
it too, and the brute force must agree with labkit.sweep.pareto_front on the checker's cases.
"""
import contextlib
import io

import nbformat
import numpy as np
import pytest
import tensorflow as tf

from labkit.exercises import build as exercises
from labkit.exercises import check, check_code, check_code_models
from labkit.exercises.verdict import NOT_ANSWERED
from labkit.transfer import finetune as transfer

CODE_CHECKERS = ["training_step", "im2col_function", "conv_macs_function", "pareto_function", "transfer_function"]


def placeholder(*args):
    answer = None  # your answer here  # noqa: F841 (the learner edition's body, exactly)


# ------------------------------------------------------------------------------------ 01: the training step
def step_ok(model, optimizer, loss_fn, x, y):
    with tf.GradientTape() as tape:
        predictions = model(x, training=True)
        loss = loss_fn(y, predictions)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


step_ok_compiled = tf.function(step_ok)  # a learner's tf.function works too (one model and optimizer per check)


def step_tape_outside(model, optimizer, loss_fn, x, y):
    predictions = model(x, training=True)
    with tf.GradientTape() as tape:
        loss = loss_fn(y, predictions)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


def step_not_applied(model, optimizer, loss_fn, x, y):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    tape.gradient(loss, model.trainable_variables)
    return loss


def step_by_hand(model, optimizer, loss_fn, x, y):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    for v, g in zip(model.trainable_variables, tape.gradient(loss, model.trainable_variables)):
        v.assign_sub(0.1 * g)
    return loss


def step_uphill(model, optimizer, loss_fn, x, y):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip([-g for g in grads], model.trainable_variables))
    return loss


def step_inference(model, optimizer, loss_fn, x, y):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=False))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


def step_no_return(model, optimizer, loss_fn, x, y):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))


# ------------------------------------------------------------------------------------ 02: im2col
def _im2col(x, kh, kw, *, rows_first=True, channels_first=False, shrink=0, swap_kernel=False, flat=True):
    n, h, w, c = x.shape
    th, tw = (kw, kh) if swap_kernel else (kh, kw)
    ho, wo = h - th + 1 - shrink, w - tw + 1 - shrink
    rows = []
    for b in range(n):
        order = [(i, j) for i in range(ho) for j in range(wo)] if rows_first else \
            [(i, j) for j in range(wo) for i in range(ho)]
        for i, j in order:
            patch = x[b, i:i + th, j:j + tw, :]
            rows.append((patch.transpose(2, 0, 1) if channels_first else patch).reshape(-1))
    out = np.array(rows)
    return out if flat else out.reshape(n, ho, wo, -1)


def im2col_ok(x, kh, kw):
    n, h, w, c = x.shape
    rows = []
    for b in range(n):
        for i in range(h - kh + 1):
            for j in range(w - kw + 1):
                rows.append(x[b, i:i + kh, j:j + kw, :].reshape(-1))
    return np.array(rows)


def im2col_strided(x, kh, kw):  # another correct way: numpy's sliding windows
    win = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(1, 2))  # (n, ho, wo, c, kh, kw)
    return win.transpose(0, 1, 2, 4, 5, 3).reshape(-1, kh * kw * x.shape[-1])


# ------------------------------------------------------------------------------------ 03: MACs
def macs_ok(layer):
    if not isinstance(layer, tf.keras.layers.Conv2D):
        return 0
    _, h_out, w_out, c_out = layer.output_shape
    kh, kw = layer.kernel_size
    return h_out * w_out * c_out * kh * kw * layer.input_shape[-1]


def macs_flops(layer):
    return 2 * macs_ok(layer)


def macs_input_size(layer):
    if not isinstance(layer, tf.keras.layers.Conv2D):
        return 0
    _, h, w, c_in = layer.input_shape
    kh, kw = layer.kernel_size
    return h * w * layer.filters * kh * kw * c_in


def macs_bias(layer):
    if not isinstance(layer, tf.keras.layers.Conv2D):
        return 0
    _, h_out, w_out, c_out = layer.output_shape
    return macs_ok(layer) + h_out * w_out * c_out


def macs_every_layer(layer):  # no isinstance: Flatten has no kernel_size
    _, h_out, w_out, c_out = layer.output_shape
    return h_out * w_out * c_out * layer.kernel_size[0] * layer.kernel_size[1] * layer.input_shape[-1]


def macs_dense_too(layer):
    if isinstance(layer, tf.keras.layers.Dense):
        return layer.units * layer.input_shape[-1]
    return macs_ok(layer)


# ------------------------------------------------------------------------------------ 05: Pareto front
def _front(points, beats):
    keep = [i for i, p in enumerate(points) if not any(beats(q, p) for j, q in enumerate(points) if j != i)]
    return sorted(keep, key=lambda i: points[i][0])


def pareto_ok(points):
    return _front(points, lambda q, p: q[0] <= p[0] and q[1] >= p[1] and (q[0] < p[0] or q[1] > p[1]))


def pareto_sweep_line(points):  # another correct way: sort, keep what beats the best so far
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best, i = [], -np.inf, 0
    while i < len(order):
        group = [k for k in order[i:] if points[k][0] == points[order[i]][0]]
        top = points[group[0]][1]
        if top > best:
            front += [k for k in group if points[k][1] == top]
        best, i = max(best, top), i + len(group)
    return front


def pareto_strict(points):
    return _front(points, lambda q, p: q[0] < p[0] and q[1] > p[1])


def pareto_twins(points):
    return _front(points, lambda q, p: q[0] <= p[0] and q[1] >= p[1])


def pareto_by_index(points):
    return sorted(pareto_ok(points))


def pareto_max_memory(points):
    return _front(points, lambda q, p: q[0] >= p[0] and q[1] >= p[1] and (q[0] > p[0] or q[1] > p[1]))


# ------------------------------------------------------------------------------------ 06: transfer
HEAD_FACTORS = {"kernel": 10, "bias": 20}


def _compile(model, optimizer):
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def transfer_ok(model, frozen, lr):
    for name in frozen:
        model.get_layer(name).trainable = False
    return _compile(model, transfer.sgd_with_lr_factors(model, {"new_fc": HEAD_FACTORS}, learning_rate=lr,
                                                        momentum=0.9))


def transfer_no_compile(model, frozen, lr):
    for name in frozen:
        model.get_layer(name).trainable = False
    return model


def transfer_freeze_all(model, frozen, lr):
    transfer.freeze(model)
    return _compile(model, transfer.sgd_with_lr_factors(model, {"new_fc": HEAD_FACTORS}, learning_rate=lr))


def transfer_freeze_all_plain(model, frozen, lr):
    transfer.freeze(model)
    return _compile(model, tf.keras.optimizers.SGD(lr, momentum=0.9))


def transfer_factor_everywhere(model, frozen, lr):
    for name in frozen:
        model.get_layer(name).trainable = False
    factors = {layer.name: HEAD_FACTORS for layer in model.layers if layer.trainable_weights}
    return _compile(model, transfer.sgd_with_lr_factors(model, factors, learning_rate=lr))


def transfer_no_factors(model, frozen, lr):
    for name in frozen:
        model.get_layer(name).trainable = False
    return _compile(model, tf.keras.optimizers.SGD(lr, momentum=0.9))


def transfer_no_momentum(model, frozen, lr):  # one step from zero velocity cannot tell it from the recipe
    for name in frozen:
        model.get_layer(name).trainable = False
    return _compile(model, transfer.sgd_with_lr_factors(model, {"new_fc": HEAD_FACTORS}, learning_rate=lr,
                                                        momentum=0.0))


def transfer_factor_sgd_plain(model, frozen, lr):  # FactorSGD's own default: no momentum
    for name in frozen:
        model.get_layer(name).trainable = False
    return _compile(model, transfer.FactorSGD(transfer.variable_factors(model, {"new_fc": HEAD_FACTORS}),
                                              learning_rate=lr))


def transfer_half_momentum(model, frozen, lr):
    for name in frozen:
        model.get_layer(name).trainable = False
    return _compile(model, transfer.sgd_with_lr_factors(model, {"new_fc": HEAD_FACTORS}, learning_rate=lr,
                                                        momentum=0.5))


def test_transfer_momentum_other_than_the_recipes_is_named_with_its_value():
    verdict = check.CHECKERS["transfer_function"].judge(transfer_half_momentum)
    assert verdict.status == "wrong" and "0.50 of the first" in verdict.message, verdict.message


def transfer_not_frozen(model, frozen, lr):
    return _compile(model, transfer.sgd_with_lr_factors(model, {"new_fc": HEAD_FACTORS}, learning_rate=lr))


CASES = {  # checker -> (correct solutions, {mistake key: [the learner's functions making it]})
    "training_step": ([step_ok, step_ok_compiled], {
        "tape_outside": [step_tape_outside], "not_applied": [step_not_applied], "forgot_optimizer": [step_by_hand],
        "wrong_sign": [step_uphill], "training_false": [step_inference], "loss_not_returned": [step_no_return]}),
    "im2col_function": ([im2col_ok, im2col_strided], {
        "channel_order": [lambda x, kh, kw: _im2col(x, kh, kw, channels_first=True)],
        "off_by_one": [lambda x, kh, kw: _im2col(x, kh, kw, shrink=1)],
        "hw_swapped": [lambda x, kh, kw: _im2col(x, kh, kw, rows_first=False),
                       lambda x, kh, kw: _im2col(x, kh, kw, swap_kernel=True)],
        "not_2d": [lambda x, kh, kw: _im2col(x, kh, kw, flat=False)]}),
    "conv_macs_function": ([macs_ok], {
        "flops": [macs_flops], "input_size": [macs_input_size], "bias": [macs_bias],
        "not_conv": [macs_every_layer, macs_dense_too]}),
    "pareto_function": ([pareto_ok, pareto_sweep_line], {
        "strict": [pareto_strict], "twins": [pareto_twins], "order": [pareto_by_index],
        "maximised_memory": [pareto_max_memory]}),
    "transfer_function": ([transfer_ok], {
        "forgot_recompile": [transfer_no_compile], "froze_head": [transfer_freeze_all, transfer_freeze_all_plain],
        "factor_on_base": [transfer_factor_everywhere], "no_factors": [transfer_no_factors],
        "not_frozen": [transfer_not_frozen], "no_momentum": [transfer_no_momentum, transfer_factor_sgd_plain]}),
}


def _line(fn, answer, capsys, **kw):
    """What the notebook's check cell prints for this answer: must be exactly one line."""
    ref = fn(answer, **kw)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "Traceback" not in out, out
    return out.strip(), ref


@pytest.mark.parametrize("name", CODE_CHECKERS)
def test_correct_solutions_and_the_reference_pass(name, capsys):
    fn = check.CHECKERS[name]
    solutions, _ = CASES[name]
    for solution in solutions:
        line, ref = _line(fn, solution, capsys)
        assert line.startswith("Correct!"), (solution.__name__, line)
    assert fn.judge(ref).status == "correct", "the reference the lesson goes on with must pass its own checker"
    assert fn.judge(solutions[0], seed=7).status == "correct", "another seed: other shapes and values"


@pytest.mark.parametrize("name", CODE_CHECKERS)
def test_each_named_mistake_is_recognised(name):
    fn = check.CHECKERS[name]
    _, mistakes = CASES[name]
    assert set(mistakes) == set(fn.mistakes), "every mistake the checker names is tested, and no other"
    for key, wrongs in mistakes.items():
        for wrong in wrongs:
            verdict = fn.judge(wrong)
            assert (verdict.status, verdict.mistake) == ("mistake", key), (key, verdict.message)
            assert verdict.message.startswith("Not quite: ") and "\n" not in verdict.message


@pytest.mark.parametrize("name", CODE_CHECKERS)
def test_placeholder_and_none_are_not_answered(name, capsys):
    fn = check.CHECKERS[name]
    for answer in (None, placeholder, ...):
        line, ref = _line(fn, answer, capsys)
        assert line == NOT_ANSWERED
        assert callable(ref) and ref.__name__.endswith("_reference")  # the one that passes (test above)


def _raises(*args):
    raise RuntimeError("learner's bug\nsecond line")


GARBAGE = [3, "my_function", [1, 2], object(), _raises, lambda *a: "text", lambda *a: float("nan"),
           lambda *a: {"a": 1}, lambda *a: -1, lambda *a: [[1, 2]], lambda *a: True, lambda *a: a]


@pytest.mark.parametrize("name", CODE_CHECKERS)
def test_garbage_gets_one_line_never_a_traceback(name, capsys):
    fn = check.CHECKERS[name]
    for answer in GARBAGE:
        line, _ = _line(fn, answer, capsys)
        assert not line.startswith("Correct") and line != NOT_ANSWERED, (answer, line)
    assert "second line" not in fn.judge(_raises).message


def test_a_tf_function_solution_passes_each_time_the_check_is_run_and_its_errors_read_well():
    # a tf.function keeps the variables of the first model and optimizer it traced: the checker re-wraps it
    assert [check.training_step.judge(step_ok_compiled).status for _ in range(2)] == ["correct", "correct"]

    @tf.function
    def step_typo(model, optimizer, loss_fn, x, y):
        return undefined_name  # noqa: F821

    message = check.training_step.judge(step_typo).message
    assert "NameError: name 'undefined_name' is not defined" in message and "in user code" not in message


def test_checks_leave_the_notebooks_layer_names_and_random_stream_alone():
    # a notebook's later cells print auto-named layers and draw from TensorFlow's global seed
    names = lambda: (tf.keras.layers.Dense(1).name, tf.keras.Sequential().name)  # noqa: E731
    tf.random.set_seed(0)
    first, draw = names(), tf.random.uniform((3,)).numpy()
    tf.random.set_seed(0)
    for name in ("training_step", "im2col_function", "conv_macs_function", "pareto_function"):
        assert check.CHECKERS[name].judge(CASES[name][0][0]).status == "correct"
    second, again = names(), tf.random.uniform((3,)).numpy()
    assert second == tuple(_next_name(n) for n in first)  # only our own two layers were named in between
    assert np.array_equal(draw, again)


def _next_name(name):
    """Keras's next automatic name after `name`: dense -> dense_1 -> dense_2."""
    stem, _, number = name.rpartition("_")
    return f"{stem}_{int(number) + 1}" if number.isdigit() else f"{name}_1"


def test_a_forgotten_return_is_not_mistaken_for_the_placeholder():
    verdict = check.pareto_function.judge(lambda points: sorted(points) and None)
    assert verdict.status == "wrong" and "returned None" in verdict.message


def test_the_smallest_failing_input_is_described():
    def big_only_wrong(points):  # right on small inputs, wrong from 8 points on
        return pareto_ok(points) if len(points) < 8 else pareto_ok(points)[:-1]
    verdict = check.pareto_function.judge(big_only_wrong)
    assert verdict.status == "wrong" and "random points with ties" in verdict.message
    verdict = check.pareto_function.judge(lambda points: list(range(len(points))))
    assert "[(2.0, 0.5), (1.0, 0.4)]" in verdict.message  # the smallest set it fails on, shown in full


def test_brute_force_agrees_with_labkit_sweep():
    for points in check_code_models._pareto_cases(np.random.default_rng(3)):
        assert check_code_models._front(points, check_code_models._beats) == check_code_models.pareto_reference(points)


def test_im2col_oracle_is_tf_conv2d():
    rng = np.random.default_rng(1)
    for n, h, w, c, kh, kw in check_code._im2col_cases(rng):
        x = rng.standard_normal((n, h, w, c)).astype(np.float32)
        wt = rng.standard_normal((kh, kw, c, 3)).astype(np.float32)
        cols = check_code._patches(x, kh, kw).reshape(-1, kh * kw * c)
        y = (cols @ wt.reshape(-1, 3)).reshape(n, h - kh + 1, w - kw + 1, 3)
        assert np.allclose(y, tf.nn.conv2d(x, wt, 1, "VALID").numpy(), rtol=1e-4, atol=1e-4)
        assert kh != kw and h != w


def test_registered_beside_the_arithmetic_checkers_and_listed(tmp_path):
    for name in CODE_CHECKERS:
        assert check.CHECKERS[name] is getattr(check, name)
        assert check.CHECKERS[name].__doc__.strip().splitlines()[0]
    _notebook(tmp_path / "01_tiny.ipynb")
    (found,) = exercises.list_exercises(tmp_path)
    assert found.checker == "pareto_function" and "brute force" in found.checks


SOLUTION = """\
# Exercise 9.1 · The Pareto front as a function
def my_pareto_front(points):
    ### BEGIN SOLUTION
    front = []
    for i, (m, a) in enumerate(points):
        if not any(mj <= m and aj >= a and (mj < m or aj > a) for mj, aj in points):
            front.append(i)
    return sorted(front, key=lambda i: points[i][0])
    ### END SOLUTION"""


def _notebook(path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("Write the front."),
                nbformat.v4.new_code_cell(SOLUTION, metadata={"tags": ["exercise"]}),
                nbformat.v4.new_code_cell("from labkit.exercises import check\n\n"
                                          "my_pareto_front = check.pareto_function(my_pareto_front)"),
                nbformat.v4.new_code_cell("print(my_pareto_front([(2, 0.5), (1, 0.5), (3, 0.9)]))")]
    nbformat.write(nb, str(path))
    return nb


def _run(cells):
    ns, out = {}, io.StringIO()
    with contextlib.redirect_stdout(out):
        for source in cells:
            exec(source, ns)
    return out.getvalue().splitlines()


def test_learner_edition_of_a_code_exercise_runs_and_says_not_answered(tmp_path):
    (tmp_path / "src").mkdir()
    _notebook(tmp_path / "src" / "01_tiny.ipynb")
    (built,) = exercises.build(tmp_path / "learner", tmp_path / "src")
    nb = nbformat.read(str(built), as_version=4)
    stub = nb.cells[1].source
    assert stub == ("# Exercise 9.1 · The Pareto front as a function\ndef my_pareto_front(points):\n"
                    f"    {exercises.PLACEHOLDER}")  # the multi-line solution became one indented line
    assert _run(c.source for c in nb.cells[1:]) == [NOT_ANSWERED, "[1, 2]"]  # the lesson goes on, with the reference
    source = nbformat.read(str(tmp_path / "src" / "01_tiny.ipynb"), as_version=4)
    lines = _run(c.source for c in source.cells[1:])
    assert lines[0].startswith("Correct!") and lines[1] == "[1, 2]"
