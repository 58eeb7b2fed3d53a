"""The network sweep: 16 CIFAR-10 networks trained in parallel workers, and the Pareto front (05_network_sweep).

    runner      train many configs in parallel worker processes, save each result as it lands, resume (API)
    networks    the MATLAB white paper's 16 networks: configs, parameter counts, the trainer, `labkit sweep`
    workerpool  spawned workers with a thread budget each, dying with the process that started them

Uses labkit.flops (03) for the networks' MACs.
"""
from labkit.sweep.runner import (  # noqa: F401  (the package's API)
    check_writable,
    load_results,
    locked,
    merge_records,
    records_dataframe,
    settings_mismatch,
    write_results,
    kill_pool,
    new_pool,
    raise_interrupt,
    config_key,
    config_name,
    pareto_front,
    run_config,
    SweepRun,
    run_sweep,
    measure_speedup,
    plot_speedup,
)
