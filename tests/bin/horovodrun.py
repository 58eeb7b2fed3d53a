"""horovodrun for the test suite: Horovod's own launcher (horovod.runner.launch, the same code path), without its
per-launch check that Horovod was built with Gloo. That check starts a child process which imports TensorFlow only
to ask the extension (about 3 s of CPU and 3.5 s of wall time on every `horovodrun --gloo`, hundreds of them in
`make test`). tests/conftest.py points LABKIT_HOROVODRUN at tests/bin/horovodrun, which runs this; the build
itself is checked, uncut: `horovodrun --check-build` passes through (labkit doctor, tests/test_doctor.py), and
tests/scale/test_launch.py asks the extension as the real launcher does.

Where the suite runs a fork server (LABKIT_SUITE_FORKSERVER, tests/conftest.py), each rank of a static Gloo launch
of a Python command starts through tests/bin/forkserver.py's client, which forks the rank from a process that has
imported TensorFlow already, or starts it as Python would when a fork could not give the same process."""
import os
import sys
from pathlib import Path

import horovod.runner.launch as launch

FORKSERVER = Path(__file__).resolve().with_name("forkserver.py")


def through_forkserver(command):
    """command (PYTHON ARGS...) started by the fork server's client, when the suite runs one."""
    if os.environ.get("LABKIT_SUITE_FORKSERVER") and command and Path(command[0]).name.startswith("python"):
        return [command[0], "-I", "-S", str(FORKSERVER), "run", *command]
    return command


if __name__ == "__main__":
    if not {"-cb", "--check-build"} & set(sys.argv[1:]):
        launch.gloo_built = lambda verbose=False: True
        _gloo_run = launch.gloo_run
        launch.gloo_run = lambda settings, nics, env, server_ip, command: _gloo_run(
            settings, nics, env, server_ip, through_forkserver(command))
    sys.argv[0] = "horovodrun"
    sys.exit(launch.run_commandline())
