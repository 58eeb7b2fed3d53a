# Loaded by the JupyterLab that scripts/lab.sh starts (it puts this folder first on JUPYTER_CONFIG_PATH).
# The token arrives in the server's environment, never on its command line (`ps` shows command lines to
# every user). Take it out of the environment here, before any kernel starts: kernels inherit the
# server's environment, and the learner's code has no business holding the server's token.
import os

_token = os.environ.pop("JUPYTER_TOKEN", None)
if _token:
    c.IdentityProvider.token = _token  # noqa: F821  (c is the config object Jupyter passes in)
del _token
