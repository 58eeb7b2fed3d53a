"""The network sweep: 16 CIFAR-10 networks trained in parallel workers, and the Pareto front (05_network_sweep).

    runner      train many configs in parallel worker processes, save each result as it lands, resume (API)
    store       the results file: JSON lines, one record per config, merged under a lock, settings checked
    networks    the MATLAB white paper's 16 networks: configs, parameter counts, the trainer, `labkit sweep`
    workerpool  worker processes with a thread budget each, dying with the process that started them
    plans       what 05 launches on this machine: the parallel sweep's worker counts (`labkit plan`)

Uses labkit.flops (03) for the networks' MACs.
"""
from labkit.sweep.runner import (
    SweepRun,
    config_key,
    config_name,
    kill_pool,
    measure_speedup,
    new_pool,
    pareto_front,
    plot_speedup,
    raise_interrupt,
    run_config,
    run_sweep,
)
from labkit.sweep.store import (
    ResultsNotSaved,
    check_writable,
    load_results,
    merge_records,
    records_dataframe,
    settings_mismatch,
    write_results,
)

__all__ = [
    "ResultsNotSaved", "SweepRun", "check_writable", "config_key", "config_name", "kill_pool", "load_results",
    "measure_speedup", "merge_records", "new_pool", "pareto_front", "plot_speedup", "raise_interrupt",
    "records_dataframe", "run_config", "run_sweep", "settings_mismatch", "write_results",
]
