"""horovodrun for the test suite: Horovod's own launcher (horovod.runner.launch, the same code path), without its
per-launch check that Horovod was built with Gloo. That check starts a child process which imports TensorFlow only
to ask the extension (about 3 s of CPU and 3.5 s of wall time on every `horovodrun --gloo`, hundreds of them in
`make test`). tests/conftest.py points LABKIT_HOROVODRUN at tests/bin/horovodrun, which runs this; the build
itself is checked, uncut: `horovodrun --check-build` passes through (its Gloo controller is the launcher's own
gloo_built() call), and tests/scale/test_launch.py reads that report and compares it with the doctor's one-process
probe."""
import sys

import horovod.runner.launch as launch

if not {"-cb", "--check-build"} & set(sys.argv[1:]):
    launch.gloo_built = lambda verbose=False: True

if __name__ == "__main__":
    sys.argv[0] = "horovodrun"
    sys.exit(launch.run_commandline())
