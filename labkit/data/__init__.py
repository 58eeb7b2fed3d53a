"""Data sets (01_cnn_basics onwards): CIFAR-10 verified before it is read, and an offline set labkit generates.

    loading     load_cifar10 / load_dataset / synthetic: what the notebooks call (this package's API)
    cifar10     CIFAR-10 on disk: where it is looked for, checksum-verified download, a parser that runs no code
"""
from labkit.data.loading import (  # noqa: F401  (the package's API)
    CIFAR10_ARCHIVE,
    CIFAR10_CLASSES,
    CIFAR10_DIRNAME,
    CIFAR10_FILES,
    CIFAR10_MD5,
    CIFAR10_URL,
    CorruptDataError,
    cifar10_available,
    cifar10_problem,
    fetch_cifar10,
    find_cifar10,
    load_cifar10,
    md5,
    SYNTHETIC_CLASSES,
    MEAN,
    STD,
    DatasetInfo,
    synthetic,
    random_batch,
    default_sizes,
    load_dataset,
    normalize,
    augment_batch,
    make_dataset,
    cli_main,
)
