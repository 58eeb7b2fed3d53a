"""`labkit plan`: the launches each measuring notebook would make on this machine. Each lesson's own plans
module says its launches; labkit.base.plans fits them to the machine and prints the table. (00_welcome)"""
from __future__ import annotations

from labkit.base import plans
from labkit.conv import plans as im2col
from labkit.deepdive import plans as deep_dive
from labkit.scale import plans as scaling
from labkit.sweep import plans as sweep

PLANNERS = (im2col.experiments, scaling.experiments, sweep.experiments, deep_dive.experiments)  # 02, 04, 05, 07


def cli_main(argv=None) -> int:
    """`labkit plan`: the launches each notebook would make here (LABKIT_CORES / LABKIT_MEMORY to ask elsewhere)."""
    return plans.main(argv, PLANNERS)
