"""labkit.data and labkit.data.cifar10: the CIFAR-10 loader on a fixture in CIFAR-10's own format, checksums, the
synthetic set, the tf.data pipeline (shapes, normalisation, shuffling, sharding, augmentation) and `labkit data`."""
from __future__ import annotations

import hashlib
import io
import pickle
import tarfile
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest

import labkit  # noqa: F401  (sets TF's log level before TensorFlow loads)
from labkit.data import cifar10
from labkit.data import loading as data

N_PER_BATCH = 7  # small batches; the format is the same as the real 10000-image ones


def _write_batch(path: Path, images: np.ndarray, labels: np.ndarray, name: bytes):
    """Write one batch exactly as cifar-10-python does: a pickled dict with bytes keys, NCHW rows of 3072."""
    rows = images.transpose(0, 3, 1, 2).reshape(len(images), 3072)  # red plane, green plane, blue plane
    d = {b"batch_label": name, b"labels": [int(v) for v in labels], b"data": rows,
         b"filenames": [b"img_%d.png" % i for i in range(len(images))]}
    with open(path, "wb") as f:
        pickle.dump(d, f, protocol=2)


def trust(monkeypatch, folder: Path):
    """Let labkit accept this fixture's files: its checksum table (cifar10.CIFAR10_FILES, the official MD5s
    otherwise) swapped for the fixture's own MD5s and row counts, for this test only."""
    table = {}
    for name in cifar10.CIFAR10_FILES:
        with open(folder / name, "rb") as f:
            rows = len(pickle.load(f, encoding="bytes")[b"data"])  # the test's own file, not untrusted data
        table[name] = (hashlib.md5((folder / name).read_bytes()).hexdigest(), rows)
    monkeypatch.setattr(cifar10, "CIFAR10_FILES", table)


def make_cifar_fixture(root: Path, seed=0, monkeypatch=None):
    """A miniature cifar-10-batches-py/ under root plus its tar.gz; returns (images, labels, archive).
    With monkeypatch, labkit trusts these files for the test (trust())."""
    rng = np.random.default_rng(seed)
    folder = root / data.CIFAR10_DIRNAME
    folder.mkdir(parents=True)
    images = rng.integers(0, 256, (6 * N_PER_BATCH, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, 6 * N_PER_BATCH).astype(np.uint8)
    for i in range(5):
        s = slice(i * N_PER_BATCH, (i + 1) * N_PER_BATCH)
        _write_batch(folder / f"data_batch_{i + 1}", images[s], labels[s], b"training batch %d of 5" % (i + 1))
    _write_batch(folder / "test_batch", images[5 * N_PER_BATCH:], labels[5 * N_PER_BATCH:], b"testing batch 1 of 1")
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [c.encode() for c in data.CIFAR10_CLASSES], b"num_vis": 3072}, f)
    archive = root / data.CIFAR10_ARCHIVE
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname=data.CIFAR10_DIRNAME)
    if monkeypatch is not None:
        trust(monkeypatch, folder)
    return images, labels, archive


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """No real data directories: HOME and LABKIT_DATA point into tmp_path."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LABKIT_DATA", str(tmp_path / "labkit_data"))
    return tmp_path


def _only_archive(tmp_path, name="staged", monkeypatch=None):
    images, labels, archive = make_cifar_fixture(tmp_path / "src", monkeypatch=monkeypatch)
    target = tmp_path / name
    target.mkdir()
    moved = target / data.CIFAR10_ARCHIVE
    archive.rename(moved)
    return images, labels, moved


# --- the parser ------------------------------------------------------------------------------------------


def test_parser_reads_cifar_format_as_keras_does(isolated, monkeypatch):
    images, labels, _ = make_cifar_fixture(isolated / "staged", monkeypatch=monkeypatch)
    (x_train, y_train), (x_test, y_test) = data.load_cifar10(isolated / "staged", download=False)
    n = 5 * N_PER_BATCH
    assert x_train.dtype == np.uint8 and x_train.shape == (n, 32, 32, 3)
    assert y_train.shape == (n, 1) and y_test.shape == (N_PER_BATCH, 1)
    np.testing.assert_array_equal(x_train, images[:n])
    np.testing.assert_array_equal(x_test, images[n:])
    np.testing.assert_array_equal(y_train[:, 0], labels[:n])
    # second oracle: Keras's own CIFAR batch parser on the same file
    from keras.src.datasets.cifar import load_batch

    k_data, k_labels = load_batch(str(isolated / "staged" / data.CIFAR10_DIRNAME / "test_batch"))
    np.testing.assert_array_equal(x_test, k_data.transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(y_test[:, 0], k_labels)


def test_verified_archive_is_extracted_and_used(isolated, monkeypatch):
    images, labels, archive = _only_archive(isolated, monkeypatch=monkeypatch)
    monkeypatch.setattr(cifar10, "CIFAR10_MD5", hashlib.md5(archive.read_bytes()).hexdigest())
    (x_train, _), (x_test, y_test) = data.load_cifar10(archive.parent, download=False)
    np.testing.assert_array_equal(x_test, images[5 * N_PER_BATCH:])
    np.testing.assert_array_equal(y_test[:, 0], labels[5 * N_PER_BATCH:])
    assert data.find_cifar10(archive.parent) == archive.parent / data.CIFAR10_DIRNAME
    assert not [p for p in archive.parent.iterdir() if p.name.startswith(".cifar10-")]  # temp dir cleaned up


def test_checksum_failure_is_reported_and_archive_never_used(isolated):
    _, _, archive = _only_archive(isolated)  # a valid tar.gz, but not the official file: MD5 differs
    with pytest.raises(data.CorruptDataError, match="MD5") as err:
        data.load_cifar10(archive.parent, download=False)
    assert isinstance(err.value, ValueError)
    assert "labkit data fetch cifar10" in str(err.value)  # says what to do
    assert data.find_cifar10(archive.parent) is None  # nothing extracted


def test_truncated_archive_fails_checksum(isolated, monkeypatch):
    _, _, archive = _only_archive(isolated)
    good = hashlib.md5(archive.read_bytes()).hexdigest()
    monkeypatch.setattr(cifar10, "CIFAR10_MD5", good)
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    with pytest.raises(data.CorruptDataError, match="truncated or corrupted"):
        data.load_cifar10(archive.parent, download=False)
    assert data.find_cifar10(archive.parent) is None


def test_truncated_archive_with_matching_checksum_fails_extraction(isolated, monkeypatch):
    # a checksum that matches but a broken gzip stream: the tar reader must fail cleanly, nothing half-extracted
    _, _, archive = _only_archive(isolated)
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    monkeypatch.setattr(cifar10, "CIFAR10_MD5", hashlib.md5(archive.read_bytes()).hexdigest())
    with pytest.raises(data.CorruptDataError, match="could not be extracted"):
        data.load_cifar10(archive.parent, download=False)
    assert not (archive.parent / data.CIFAR10_DIRNAME).exists()
    assert not [p for p in archive.parent.iterdir() if p.name.startswith(".cifar10-")]


def test_corrupted_batch_file_is_reported(isolated, monkeypatch):
    make_cifar_fixture(isolated / "staged", monkeypatch=monkeypatch)
    batch = isolated / "staged" / data.CIFAR10_DIRNAME / "data_batch_3"
    batch.write_bytes(batch.read_bytes()[:1000])
    with pytest.raises(data.CorruptDataError, match="data_batch_3"):
        data.load_cifar10(isolated / "staged", download=False)


def test_wrong_shape_batch_is_reported(isolated, monkeypatch):
    make_cifar_fixture(isolated / "staged")
    folder = isolated / "staged" / data.CIFAR10_DIRNAME
    with open(folder / "test_batch", "wb") as f:
        pickle.dump({b"data": np.zeros((4, 100), np.uint8), b"labels": [0, 1, 2, 3]}, f)
    trust(monkeypatch, folder)  # its checksum passes: the shape check is what refuses it
    with pytest.raises(data.CorruptDataError, match="3072"):
        data.load_cifar10(isolated / "staged", download=False)


def test_search_order_data_dir_then_labkit_data_then_keras_cache(isolated, monkeypatch):
    keras_cache = isolated / "home" / ".keras" / "datasets"
    make_cifar_fixture(keras_cache, seed=1)
    assert data.find_cifar10() == keras_cache / data.CIFAR10_DIRNAME
    make_cifar_fixture(isolated / "labkit_data", seed=2)
    assert data.find_cifar10() == isolated / "labkit_data" / data.CIFAR10_DIRNAME
    images, _, _ = make_cifar_fixture(isolated / "explicit", seed=3, monkeypatch=monkeypatch)
    (x_train, _), _ = data.load_cifar10(isolated / "explicit", download=False)
    np.testing.assert_array_equal(x_train, images[: 5 * N_PER_BATCH])


def test_missing_data_without_download_says_how_to_fetch(isolated):
    with pytest.raises(FileNotFoundError, match="labkit data fetch cifar10"):
        data.load_cifar10(download=False)


def test_download_goes_through_get_file_with_the_official_md5(isolated, monkeypatch):
    _, _, archive = _only_archive(isolated, name="server")
    calls = []

    def fake_get_file(fname, origin, file_hash, hash_algorithm, cache_dir, cache_subdir):
        calls.append((fname, origin, file_hash, hash_algorithm))
        dest = Path(cache_dir) / cache_subdir / fname
        dest.write_bytes(archive.read_bytes())
        return str(dest)

    import tensorflow as tf

    monkeypatch.setattr(tf.keras.utils, "get_file", fake_get_file)
    monkeypatch.setattr(cifar10, "CIFAR10_MD5", hashlib.md5(archive.read_bytes()).hexdigest())
    path = data.fetch_cifar10(isolated / "fetched")
    assert calls == [(data.CIFAR10_ARCHIVE, data.CIFAR10_URL, cifar10.CIFAR10_MD5, "md5")]
    assert path == isolated / "fetched" / data.CIFAR10_ARCHIVE


def test_official_checksum_constant():
    # typed in from https://www.cs.toronto.edu/~kriz/cifar.html, not copied from labkit
    assert data.CIFAR10_MD5 == "c58f30108f718f92721af3b95e74349a"


def test_network_failure_is_a_clear_connection_error(isolated, monkeypatch):
    import tensorflow as tf

    def offline(**kwargs):
        raise Exception("URL fetch failure on https://www.cs.toronto.edu: None -- [Errno -3] no network")

    monkeypatch.setattr(tf.keras.utils, "get_file", offline)
    with pytest.raises(ConnectionError, match="labkit data fetch cifar10"):
        data.load_cifar10(isolated / "nowhere")


# --- load_dataset and the synthetic set ------------------------------------------------------------------


def test_load_dataset_falls_back_to_synthetic_and_says_so(isolated):
    (x, y), (xt, yt), info = data.load_dataset(n_train=30, n_test=20)
    assert info.name == "synthetic" and info["name"] == "synthetic"
    assert "not CIFAR-10" in str(info)
    assert x.shape == (30, 32, 32, 3) and x.dtype == np.uint8 and y.shape == (30,) and xt.shape[0] == 20
    assert len(info.class_names) == 10


def test_load_dataset_prefers_cifar10_when_present(isolated, monkeypatch):
    make_cifar_fixture(isolated / "labkit_data", monkeypatch=monkeypatch)
    (x, y), (xt, yt), info = data.load_dataset(n_train=10, n_test=5)
    assert info.name == "cifar10" and info.class_names[0] == "airplane"
    assert x.shape == (10, 32, 32, 3) and y.shape == (10,) and xt.shape == (5, 32, 32, 3)


@pytest.mark.parametrize("profile", ["quick", "workshop"])
def test_a_session_profile_takes_as_many_cifar10_images_as_offline_ones(monkeypatch, profile):
    """Images x epochs set a profile's minutes and memory, and an image costs the same on either set: quick and
    workshop take the same counts from CIFAR-10 as from the offline set; full takes all of CIFAR-10."""
    monkeypatch.setenv("LABKIT_PROFILE", profile)
    monkeypatch.delenv("LABKIT_SMOKE", raising=False)
    assert data.default_sizes("cifar10") == data.default_sizes("synthetic")
    assert data.default_sizes("cifar10")[0] < 50000
    monkeypatch.setenv("LABKIT_PROFILE", "full")
    assert data.default_sizes("cifar10") == (50000, 10000)
    with pytest.raises(ValueError, match="name"):
        data.default_sizes("mnist")


def test_workshop_reads_only_the_cifar10_batches_it_uses(isolated, monkeypatch):
    """CIFAR-10 larger than the workshop's 10,000 images (here 5 x 2,500 train, 2,500 test): load_dataset() keeps
    the first 10,000 / 2,000, reads data_batch_1..4 and the test batch only, each checked against its MD5, and
    keeps no view into a larger array (the rest never stays in memory); info says which part it is."""
    monkeypatch.setenv("LABKIT_PROFILE", "workshop")
    monkeypatch.delenv("LABKIT_SMOKE", raising=False)
    folder = isolated / "labkit_data" / data.CIFAR10_DIRNAME
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (15000, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, 15000).astype(np.uint8)
    for i in range(5):
        s = slice(i * 2500, (i + 1) * 2500)
        _write_batch(folder / f"data_batch_{i + 1}", images[s], labels[s], b"training batch")
    _write_batch(folder / "test_batch", images[12500:], labels[12500:], b"testing batch 1 of 1")
    trust(monkeypatch, folder)
    read = []
    real_load = cifar10._load_batch
    monkeypatch.setattr(cifar10, "_load_batch", lambda path, files=None: read.append(path.name) or real_load(
        path, files))
    (x, y), (xt, yt), info = data.load_dataset()
    assert info.name == "cifar10" and (len(x), len(xt)) == data.default_sizes("synthetic") == (10000, 2000)
    np.testing.assert_array_equal(x, images[:10000])
    np.testing.assert_array_equal(y, labels[:10000])
    np.testing.assert_array_equal(xt, images[12500:14500])
    assert read == ["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "test_batch"]
    for a in (x, xt):
        assert a.base is None or a.base.nbytes == a.nbytes, "a view into more images than were asked for"
    assert "first 10,000 of CIFAR-10's 12,500 training images" in str(info)


@pytest.mark.parametrize("kwargs, word", [({"name": "mnist"}, "name"), ({"n_train": 0}, "n_train"),
                                          ({"n_test": -1}, "n_test")])
def test_load_dataset_bad_input_names_the_parameter(isolated, kwargs, word):
    with pytest.raises(ValueError, match=word):
        data.load_dataset(**kwargs)


def test_synthetic_is_deterministic_balanced_and_prefix_stable():
    (x1, y1), (t1, _) = data.synthetic(1500, 200, seed=0)
    (x2, y2), (t2, _) = data.synthetic(1200, 200, seed=0)
    np.testing.assert_array_equal(x1[:1200], x2)
    np.testing.assert_array_equal(y1[:1200], y2)
    (x3, _), _ = data.synthetic(100, 0, seed=1)
    assert not np.array_equal(x3, x1[:100])
    assert not np.array_equal(t1[:100], x1[:100])  # test set is a different draw
    counts = np.bincount(y1, minlength=10)
    assert counts.min() > 100  # every class present in fair numbers
    assert 40 < x1.mean() < 215 and x1.std() > 30  # not blank, not saturated


@pytest.mark.parametrize("n_train,n_test,seed,digest", [(2500, 1200, 0, "08d62826fdad92c0"),
                                                        (1000, 0, 7, "7f555b365931689f")])
def test_synthetic_is_the_set_it_has_always_been(n_train, n_test, seed, digest):
    """The offline set's bytes, recorded from the generator as it was at 6052749, before d252fbe computed each image's
    mask for its own shape only: the committed notebooks' numbers come from these images, so a faster generator
    keeps them."""
    (x, y), (xt, yt) = data.synthetic(n_train, n_test, seed=seed)
    h = hashlib.sha256()
    for a in (x, y, xt, yt):
        h.update(np.ascontiguousarray(a).tobytes())
    assert h.hexdigest()[:16] == digest


def test_synthetic_classes_are_not_separable_by_colour():
    # the shape, not the colour, carries the class: per-class mean colours are all close to each other
    (x, y), _ = data.synthetic(3000, 0)
    means = np.array([x[y == c].reshape(-1, 3).mean(0) for c in range(10)])
    assert np.ptp(means, axis=0).max() < 40


# --- the tf.data pipeline --------------------------------------------------------------------------------


def _tiny(n=10):
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8), np.arange(n) % 10


def test_pipeline_shapes_and_normalisation():
    x, y = _tiny(10)
    batches = list(data.make_dataset(x, y, 4, shuffle=False))
    assert [b[0].shape[0] for b in batches] == [4, 4, 2]
    images, labels = batches[0]
    assert images.dtype.name == "float32" and images.shape == (4, 32, 32, 3)
    expected = (x[:4] / 255.0 - np.array(data.MEAN)) / np.array(data.STD)
    np.testing.assert_allclose(images.numpy(), expected, atol=1e-5)
    np.testing.assert_array_equal(labels.numpy(), y[:4])
    np.testing.assert_allclose(data.normalize(x[:4]), expected, atol=1e-5)
    assert [b[0].shape[0] for b in data.make_dataset(x, y, 4, drop_remainder=True)] == [4, 4]


def test_shuffle_is_a_permutation_seeded_and_reshuffled_each_epoch():
    x, y = _tiny(20)
    ds = data.make_dataset(x, np.arange(20), 5, seed=3)
    epoch1 = np.concatenate([b[1].numpy() for b in ds])
    epoch2 = np.concatenate([b[1].numpy() for b in ds])
    assert sorted(epoch1) == list(range(20)) and sorted(epoch2) == list(range(20))
    assert list(epoch1) != list(range(20)) and list(epoch1) != list(epoch2)
    again = np.concatenate([b[1].numpy() for b in data.make_dataset(x, np.arange(20), 5, seed=3)])
    np.testing.assert_array_equal(epoch1, again)


def test_sharding_splits_the_data_disjointly_and_completely():
    x, _ = _tiny(23)
    seen = []
    for rank in range(3):
        labels = np.concatenate([b[1].numpy() for b in data.make_dataset(x, np.arange(23), 4, shard=(rank, 3))])
        assert sorted(labels) == list(range(rank, 23, 3))
        seen.extend(labels)
    assert sorted(seen) == list(range(23))


def test_augmentation_is_a_flip_and_a_shift_of_at_most_4_pixels():
    x, y = _tiny(16)
    norm = data.normalize(x)
    images = np.concatenate([b[0].numpy() for b in data.make_dataset(x, y, 8, shuffle=False, augment=True)])
    shifts, flips = set(), 0
    for orig, aug in zip(norm, images):
        padded = {False: np.pad(orig, ((4, 4), (4, 4), (0, 0))), True: np.pad(orig[:, ::-1], ((4, 4), (4, 4), (0, 0)))}
        match = [(f, dy, dx) for f in (False, True) for dy in range(9) for dx in range(9)
                 if np.allclose(padded[f][dy:dy + 32, dx:dx + 32], aug, atol=1e-6)]
        assert match, "augmented image is not a flipped/translated copy of its original"
        f, dy, dx = match[0]
        flips += f
        shifts.add((dy - 4, dx - 4))
    assert 0 < flips < 16  # both flipped and unflipped images
    assert len(shifts) > 3  # many different translations


def test_augmentation_differs_between_epochs_and_is_seeded():
    x, y = _tiny(8)
    ds = data.make_dataset(x, y, 8, shuffle=False, augment=True)
    a, b = next(iter(ds))[0].numpy(), next(iter(ds))[0].numpy()
    assert not np.allclose(a, b)
    again = next(iter(data.make_dataset(x, y, 8, shuffle=False, augment=True)))[0].numpy()
    np.testing.assert_array_equal(a, again)  # reproducible from the seed


@pytest.mark.parametrize("kwargs, word", [
    ({"batch_size": 0}, "batch_size"), ({"shard": (3, 3)}, "shard"), ({"shard": (0,)}, "shard")])
def test_pipeline_bad_input_names_the_parameter(kwargs, word):
    x, y = _tiny(4)
    args = {"batch_size": 2, **kwargs}
    with pytest.raises(ValueError, match=word):
        data.make_dataset(x, y, **args)


def test_pipeline_rejects_float_images_and_mismatched_labels():
    x, y = _tiny(4)
    with pytest.raises(ValueError, match="uint8"):
        data.make_dataset(x.astype(np.float32), y, 2)
    with pytest.raises(ValueError, match="one label per image"):
        data.make_dataset(x, y[:3], 2)


# --- the CLI ---------------------------------------------------------------------------------------------


def test_cli_where_lists_places_and_choice(isolated, monkeypatch):
    make_cifar_fixture(isolated / "labkit_data", monkeypatch=monkeypatch)
    out = io.StringIO()
    with redirect_stdout(out):
        assert data.cli_main(["where"]) == 0
    text = out.getvalue()
    assert str(isolated / "labkit_data") in text and "extracted" in text and "cifar10" in text


def test_cli_fetch_reports_corrupt_download(isolated, monkeypatch, capsys):
    def corrupt(**kwargs):
        raise ValueError("Incomplete or corrupted file detected.")

    import tensorflow as tf

    monkeypatch.setattr(tf.keras.utils, "get_file", corrupt)
    assert data.cli_main(["fetch", "cifar10", "--dir", str(isolated / "d")]) == 1
    assert "MD5" in capsys.readouterr().err


def _serve_archive(isolated, monkeypatch):
    """A fixture archive 'downloaded' by a stand-in for Keras' get_file, with its MD5 as the official one."""
    _, _, archive = _only_archive(isolated, name="server", monkeypatch=monkeypatch)
    import tensorflow as tf

    def fake_get_file(fname, origin, file_hash, hash_algorithm, cache_dir, cache_subdir):
        dest = Path(cache_dir) / fname
        dest.write_bytes(archive.read_bytes())
        return str(dest)

    monkeypatch.setattr(tf.keras.utils, "get_file", fake_get_file)
    monkeypatch.setattr(cifar10, "CIFAR10_MD5", hashlib.md5(archive.read_bytes()).hexdigest())


def test_cli_fetch_stages_data(isolated, monkeypatch, capsys):
    _serve_archive(isolated, monkeypatch)
    assert data.cli_main(["fetch", "cifar10", "--dir", str(isolated / "d")]) == 0
    assert "export LABKIT_DATA=" in capsys.readouterr().out
    assert data.find_cifar10(isolated / "d") is not None


def test_cli_help_runs():
    with pytest.raises(SystemExit) as exc:
        data.cli_main(["--help"])
    assert exc.value.code == 0


# --- untrusted files: checksums before parsing, and an unpickler that cannot run code ----------------------


class _RunsCode:
    """Pickles to 'call os.system(...)' on load: what a planted data_batch_1 in a shared directory could do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def _plant(folder: Path, marker: Path):
    with open(folder / "data_batch_1", "wb") as f:
        pickle.dump({b"data": _RunsCode(marker), b"labels": [0]}, f, protocol=2)


def test_planted_pickle_is_refused_by_its_checksum_before_parsing(isolated):
    make_cifar_fixture(isolated / "staged")
    folder = isolated / "staged" / data.CIFAR10_DIRNAME
    marker = isolated / "pwned"
    _plant(folder, marker)
    with pytest.raises(data.CorruptDataError, match="not the official CIFAR-10 file") as err:
        data.load_cifar10(isolated / "staged", download=False)
    assert "data_batch_1" in str(err.value) and "labkit data fetch cifar10 --force" in str(err.value)
    assert not marker.exists()


def test_planted_pickle_is_refused_by_the_unpickler_even_with_a_matching_checksum(isolated, monkeypatch):
    make_cifar_fixture(isolated / "staged")
    folder = isolated / "staged" / data.CIFAR10_DIRNAME
    marker = isolated / "pwned"
    _plant(folder, marker)
    # the planted file's own MD5 in the table (trust() would unpickle it, so not trust())
    table = dict(cifar10.CIFAR10_FILES,
                 data_batch_1=(hashlib.md5((folder / "data_batch_1").read_bytes()).hexdigest(), 1))
    monkeypatch.setattr(cifar10, "CIFAR10_FILES", table)
    with pytest.raises(data.CorruptDataError) as err:
        cifar10._load_batch(folder / "data_batch_1")
    message = str(err.value)
    assert "posix.system" in message or "os.system" in message  # names what it refused
    assert "data_batch_1" in message and "labkit data fetch cifar10 --force" in message
    assert not marker.exists()  # the command never ran
    # the oracle: plain pickle.load would have run it
    with open(folder / "data_batch_1", "rb") as f:
        pickle.load(f, encoding="bytes")
    assert marker.exists()


def test_batch_cut_short_is_refused_even_with_a_matching_checksum(isolated, monkeypatch):
    images, labels, _ = make_cifar_fixture(isolated / "staged", monkeypatch=monkeypatch)
    folder = isolated / "staged" / data.CIFAR10_DIRNAME
    _write_batch(folder / "data_batch_2", images[:3], labels[:3], b"training batch 2 of 5")  # 3 of 7 rows
    table = dict(cifar10.CIFAR10_FILES)
    table["data_batch_2"] = (hashlib.md5((folder / "data_batch_2").read_bytes()).hexdigest(), N_PER_BATCH)
    monkeypatch.setattr(cifar10, "CIFAR10_FILES", table)
    with pytest.raises(data.CorruptDataError, match=f"holds 3 images; this file holds {N_PER_BATCH}"):
        data.load_cifar10(isolated / "staged", download=False)


@pytest.mark.parametrize("bad, word", [({b"data": np.zeros((7, 3072), np.float32), b"labels": [0] * 7}, "uint8"),
                                       ({b"data": np.zeros((7, 3072), np.uint8), b"labels": [12] * 7}, "0..9")])
def test_wrong_dtype_or_label_range_is_refused(isolated, monkeypatch, bad, word):
    make_cifar_fixture(isolated / "staged")
    folder = isolated / "staged" / data.CIFAR10_DIRNAME
    with open(folder / "test_batch", "wb") as f:
        pickle.dump(bad, f, protocol=2)
    trust(monkeypatch, folder)
    with pytest.raises(data.CorruptDataError, match=word):
        data.load_cifar10(isolated / "staged", download=False)


def test_official_per_file_checksums():
    # typed in from torchvision/datasets/cifar.py (CIFAR10.train_list / test_list), not copied from labkit
    assert {k: v[0] for k, v in cifar10.CIFAR10_FILES.items()} == {
        "data_batch_1": "c99cafc152244af753f735de768cd75f", "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
        "data_batch_3": "54ebc095f3ab1f0389bbae665268c751", "data_batch_4": "634d18415352ddfa80567beed471001a",
        "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb", "test_batch": "40351d587109b95175f43aff81a1287e"}
    assert {v[1] for v in cifar10.CIFAR10_FILES.values()} == {10000}  # 50000 train + 10000 test images


def test_cifar10_problem_names_a_corrupt_archive_and_the_fix(isolated):
    _, _, archive = _only_archive(isolated)  # not the official archive
    problem = data.cifar10_problem(archive.parent)
    assert problem and "MD5" in problem and "labkit data fetch cifar10 --force" in problem
    assert data.cifar10_problem(isolated / "nowhere") is None


def test_cifar10_problem_is_none_for_trusted_files(isolated, monkeypatch):
    make_cifar_fixture(isolated / "staged", monkeypatch=monkeypatch)
    assert data.cifar10_problem(isolated / "staged") is None


def test_cli_fetch_force_replaces_a_corrupt_copy(isolated, monkeypatch, capsys):
    _serve_archive(isolated, monkeypatch)
    target = isolated / "d"
    assert data.cli_main(["fetch", "cifar10", "--dir", str(target)]) == 0
    batch = target / data.CIFAR10_DIRNAME / "data_batch_4"
    batch.write_bytes(batch.read_bytes()[:500])  # damaged after staging
    capsys.readouterr()
    assert data.cli_main(["fetch", "cifar10", "--dir", str(target)]) == 1
    assert "--force" in capsys.readouterr().err
    assert data.cli_main(["fetch", "cifar10", "--dir", str(target), "--force"]) == 0
    data.load_cifar10(target, download=False)  # good again


def test_cli_fetch_into_an_unwritable_dir_is_one_line_exit_2(isolated, capsys):
    blocker = isolated / "a-file"
    blocker.write_text("")
    assert data.cli_main(["fetch", "cifar10", "--dir", str(blocker / "sub")]) == 2  # not a directory, even as root
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--dir" in err and "writable" in err


def test_cli_where_names_a_corrupt_copy(isolated, capsys):
    _only_archive(isolated, name="labkit_data")  # $LABKIT_DATA holds an archive that fails its MD5
    assert data.cli_main(["where"]) == 1
    out = capsys.readouterr().out
    assert "stops with an error" in out and "--force" in out and "the synthetic set" not in out


def test_a_device_in_place_of_a_batch_is_refused_without_reading_it(isolated, monkeypatch):
    make_cifar_fixture(isolated / "staged", monkeypatch=monkeypatch)
    batch = isolated / "staged" / data.CIFAR10_DIRNAME / "data_batch_2"
    batch.unlink()
    batch.symlink_to("/dev/zero")  # hashing it would never end
    with pytest.raises(data.CorruptDataError, match="data_batch_2 is missing or not a regular file"):
        data.load_cifar10(isolated / "staged", download=False)
