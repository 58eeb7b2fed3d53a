"""Transfer learning offline (06_transfer_learning).

    finetune    per-layer learning-rate factors for Keras 2.15, freezing, the MATLAB multi-GPU white paper's recipe
"""
from labkit.transfer.finetune import (  # noqa: F401  (the package's API)
    STRATEGIES,
    STRATEGY_LABELS,
    HEAD,
    HEAD_LR_FACTORS,
    variable_factors,
    FactorSGD,
    sgd_with_lr_factors,
    measure_factors,
    freeze,
    param_counts,
    feature_extractor,
    copy_model,
    transfer_model,
    split_classes,
    per_class_subset,
    fit,
    pretrain,
    make_strategy,
    compare_strategies,
    plot_accuracy_vs_data,
    plot_accuracy_vs_time,
    IMAGENET_WEIGHTS,
    imagenet_weights_path,
    prestage_hint,
    imagenet_base,
)
