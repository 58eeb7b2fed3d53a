"""A fork server for the suite's ranks and kernels: TensorFlow, Keras and Horovod imported once, each forked from it.

Every rank the suite starts imports TensorFlow first: about 3 s of CPU, on every rank of every launch (the notebook
runs launch hundreds of ranks). tests/conftest.py starts one server per run (`forkserver.py serve SOCKET`) and sets
LABKIT_RANK_PYTHON (labkit.scale.launch.rank_python), so that every launch, under horovodrun or mpirun, starts each
rank as `python -I -S forkserver.py run PYTHON ARGS...`: a client without TensorFlow that asks the server for a child.
The notebooks' kernels start the same way: conftest puts a copy of the labkit kernel's spec, the client first, in
JUPYTER_PATH's first folder.
The child takes the client's standard streams, working directory, environment, umask and CPU affinity, runs
`PYTHON ARGS` (`-m module ...`, or a script's path, and their arguments) and its exit status comes back as the
client's own: an exit code, or death by the same signal (137 after the out-of-memory killer's SIGKILL). Signals
sent to the client go on to the child; a client that dies (SIGKILL included) takes the child with it, so a
launch's clean-up still leaves nothing running.

The client starts the rank as Python would (exec, no server) whenever the server could not give the same process:
no server yet (its imports take a few seconds), another user (the socket is the owner's), another cgroup, namespace
or resource limit (the Binder box, the virtual cluster's nodes, Slurm's jobs), an environment that Python or
TensorFlow reads at start-up set otherwise (a PYTHONPATH that shadows what the server imported, another hash seed),
or Python options it does not handle. What the server preloads is third-party only:
labkit is imported by each child afresh, so a profile or setting read at import is the child's own.
"""
import sys

_AT_START = {name.split(".", 1)[0] for name in sys.modules}  # what Python imported before any sys.path[0] or script
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import struct  # noqa: E402

# variables read when Python, TensorFlow, Keras or a BLAS start: a child of the server saw the server's values
IMPORT_ENV = ("LANG", "LC_ALL", "LC_CTYPE", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "GOTO_NUM_THREADS", "LD_PRELOAD",
              "LD_LIBRARY_PATH", "TF_CPP_MIN_LOG_LEVEL", "TF_CPP_MAX_VLOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS",
              "CUDA_VISIBLE_DEVICES", "KERAS_HOME", "KERAS_BACKEND", "TF_USE_LEGACY_KERAS")
# PYTHON* variables a child takes as its own (the rest are read at start-up, and must be the server's)
_PYTHON_OWN = ("PYTHONPATH", "PYTHONHASHSEED", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE")
# sizes of the BLAS pools numpy loads: a child sets its own (threadpoolctl), as a process would have them at start
BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
_NAMESPACES = ("cgroup", "ipc", "mnt", "net", "pid", "user", "uts")
_LIMITS = ("RLIMIT_AS", "RLIMIT_DATA", "RLIMIT_RSS", "RLIMIT_CPU", "RLIMIT_NPROC", "RLIMIT_NOFILE", "RLIMIT_STACK")
_SERVER_PYTHONPATH = os.environ.get("PYTHONPATH")
PRELOAD = ("numpy", "tensorflow", "keras", "horovod.tensorflow", "horovod.tensorflow.keras", "psutil",
           "ipykernel.kernelapp")  # the notebooks' kernels start from it too (tests/conftest.py)


def _top_level(folder: str) -> set:
    """The names a folder on sys.path offers for `import NAME`."""
    try:
        entries = os.listdir(folder)
    except OSError:
        return set()
    return {e.split(".", 1)[0] for e in entries if e.endswith((".py", ".pyc", ".so", ".pth")) or "." not in e}


def _pythonpath_fits(server: dict) -> bool:
    """A PYTHONPATH of the client's own fits when none of its folders offers a module the server has imported
    (its sitecustomize is run by the child, as site runs it): the child then imports from them what Python would."""
    mine = os.environ.get("PYTHONPATH") or None
    if mine == server["pythonpath"]:
        return True
    if server["pythonpath"]:
        return False
    taken = set(server["modules"]) - {"sitecustomize", "usercustomize"}
    return not any(_top_level(d) & taken for d in mine.split(os.pathsep) if d)


def _first_path(argv) -> str:
    """What Python puts first on sys.path for argv: the working directory for -m, else the script's folder."""
    return os.getcwd() if argv[1] == "-m" else os.path.dirname(os.path.abspath(argv[1]))


def identity() -> dict:
    """What a process shares with the server when a child of the server can stand in for it."""
    import resource
    python = os.path.abspath(sys.executable)
    env = {k: os.environ.get(k) for k in IMPORT_ENV}
    env.update({k: v for k, v in os.environ.items() if k.startswith("PYTHON") and k not in _PYTHON_OWN})
    if env["LD_LIBRARY_PATH"]:  # mpirun puts its lib folder first: the server loaded Open MPI from there already
        own_lib = os.path.join(os.path.dirname(os.path.dirname(python)), "lib")
        env["LD_LIBRARY_PATH"] = ":".join(d for d in env["LD_LIBRARY_PATH"].split(":") if d != own_lib) or None
    ident = {"uid": os.getuid(), "gid": os.getgid(), "python": python, "env": env,
             "limits": {n: list(resource.getrlimit(getattr(resource, n))) for n in _LIMITS if hasattr(resource, n)}}
    for ns in _NAMESPACES:
        try:
            ident[ns] = os.readlink(f"/proc/self/ns/{ns}")
        except OSError:
            ident[ns] = None
    try:
        with open("/proc/self/cgroup") as f:
            ident["cgroup_path"] = f.read()
    except OSError:
        ident["cgroup_path"] = None
    return ident


# ------------------------------------------------------------------------------------------------ the wire
def _send(sock, obj, fds=()):
    data = json.dumps(obj).encode()
    msg = struct.pack("!I", len(data)) + data
    if fds:
        import array
        sock.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        sock.sendall(msg)


def _recv(sock, nfds=0):
    import array
    fds = array.array("i")
    head, anc, _flags, _addr = sock.recvmsg(4, socket.CMSG_SPACE(nfds * fds.itemsize) if nfds else 0)
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    if len(head) < 4:
        raise EOFError("the other end closed")
    size = struct.unpack("!I", head)[0]
    body = b""
    while len(body) < size:
        chunk = sock.recv(size - len(body))
        if not chunk:
            raise EOFError("the other end closed")
        body += chunk
    return json.loads(body), list(fds)


# ------------------------------------------------------------------------------------------------ client
def _without_frozen_modules(argv) -> list:
    """argv without -X frozen_modules=...: it only chooses where the standard library's bytecode comes from (a
    debugger's wish: the Jupyter kernel's spec asks for it), which the server's child has loaded already."""
    out, i = [argv[0]], 1
    while i < len(argv) and argv[i].startswith("-X"):
        opt, step = (argv[i][2:], 1) if argv[i] != "-X" else ((argv[i + 1] if i + 1 < len(argv) else ""), 2)
        if not opt.startswith("frozen_modules="):
            break
        i += step
    return out + list(argv[i:])


def _supported(argv) -> bool:
    """PYTHON -m module ... or PYTHON SCRIPT ...: what the child runs; any option of Python's own is not."""
    if len(argv) < 2:
        return False
    if argv[1] == "-m":
        return len(argv) >= 3
    return not argv[1].startswith("-")


def _die_with_parent() -> None:
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _umask() -> int:
    mask = os.umask(0o22)
    os.umask(mask)
    return mask


def _trace(what: str, argv) -> None:
    """One line per start in $LABKIT_SUITE_FORKSERVER_TRACE, if set: forked, or started as Python would and why."""
    trace = os.environ.get("LABKIT_SUITE_FORKSERVER_TRACE")
    if trace:
        with open(trace, "a") as f:
            f.write(f"{what} {' '.join(argv)[:120]}\n")


def _exec(argv, why=""):
    _trace(f"exec {why}", argv)
    os.execv(argv[0], argv)


def client(argv) -> None:
    """Run argv (PYTHON ARGS...) as a child of the server at $LABKIT_SUITE_FORKSERVER, else exec it."""
    path = os.environ.get("LABKIT_SUITE_FORKSERVER", "")
    original, argv = argv, _without_frozen_modules(argv)
    if not path or not _supported(argv):
        _exec(original, "unsupported")
    try:
        with open(path + ".id") as f:
            server = json.load(f)
    except (OSError, ValueError):
        _exec(original, "noserver")
    mine = identity()
    why = [k for k in mine if server.get(k) != mine[k] and k != "env"]
    why += [k for k in {*server["env"], *mine["env"]} if server["env"].get(k) != mine["env"].get(k)]
    why += [] if all(os.environ.get(k, "1").isdigit() for k in BLAS_THREADS) else ["BLAS threads"]
    why += [] if not _top_level(_first_path(argv)) & set(server["modules"]) else ["sys.path[0]"]
    why += [] if _pythonpath_fits(server) else ["PYTHONPATH"]
    # a hash seed is fixed when Python starts: the server's (tests/conftest.py gives it labkit's set_seed(0), which
    # the notebooks' kernels pass on to their ranks) is one a process without a seed of its own could have drawn
    seed = os.environ.get("PYTHONHASHSEED", "random")
    why += [] if seed in ("random", "", server["hashseed"]) else ["PYTHONHASHSEED"]
    if why or os.path.abspath(argv[0]) != server["python"]:
        _exec(original, "differs:" + ",".join(why))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        _send(sock, {"argv": argv[1:], "env": dict(os.environ), "cwd": os.getcwd(), "umask": _umask(),
                     "affinity": sorted(os.sched_getaffinity(0))}, fds=(0, 1, 2))
        hello, _ = _recv(sock)
        pid = hello["pid"]  # a status instead: the child ended before it ran anything
    except (OSError, EOFError, ValueError, KeyError):
        sock.close()
        _exec(original, "connect")  # nothing has run yet: start it as Python would
    _trace("fork", argv)

    def forward(signum, _frame):  # to the child's process group, as to a process group of its own
        try:
            os.killpg(pid, signum)
        except OSError:
            pass

    if os.environ.get("JPY_PARENT_PID") == str(os.getppid()):  # a Jupyter kernel: it ends with its parent, whose
        _die_with_parent()  # death ipykernel sees in a kernel started by Python (its parent poller)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    try:
        status = _recv(sock)[0]["status"]
    except (OSError, EOFError, ValueError):
        sys.exit(255)  # the server went away before the child's end was known
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    sys.exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


# ------------------------------------------------------------------------------------------------ server
def serve(path: str) -> None:
    """Preload, listen on path (mode 0600), fork a child per connection, send each client its child's status."""
    import importlib
    import select
    _die_with_parent()  # the suite that started us
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    # what the preloads made (about 300,000 objects) moves to the collector's permanent generation: a child's full
    # collections skip it and leave its pages shared with the server instead of copying them. Measured on
    # tests/exercises/test_check_hvd.py in one test process (its 40 scripts in one 2-rank launch): 109 and 113 core-s
    # of the machine without it, 101 and 105 with it. A child's own objects are collected as Python would.
    import gc
    gc.collect()
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    listener.bind(path)
    os.umask(old)
    listener.listen(64)
    tmp = f"{path}.id.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({**identity(), "pythonpath": os.environ.get("PYTHONPATH") or None,
                   "hashseed": os.environ.get("PYTHONHASHSEED", "random"),
                   "modules": sorted({name.split(".", 1)[0] for name in sys.modules} - _AT_START)}, f)
    os.replace(tmp, path + ".id")  # clients read it whole or not at all
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    clients, forked = {}, 0

    def stop(*_):  # say how many ranks it started, for the suite's summary
        with open(path + ".forked", "w") as f:
            f.write(str(forked))
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    while True:
        try:
            ready = select.select([listener, wake_r], [], [])[0]
        except InterruptedError:
            continue
        if wake_r in ready:
            os.read(wake_r, 512)
        if listener in ready:
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            try:
                pid = os.fork()
            except OSError:  # the client finds the socket closed before any reply: it starts as Python would
                conn.close()
                continue
            if pid == 0:
                listener.close()
                signal.set_wakeup_fd(-1)
                os.close(wake_r)
                os.close(wake_w)
                for other in clients.values():
                    other.close()
                _child(conn)  # never returns
            clients[pid] = conn
            forked += 1
        _reap(clients)


def _reap(clients) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = clients.pop(pid, None)
        if conn is not None:
            try:
                _send(conn, {"status": status})
            except OSError:
                pass
            conn.close()


def _child(conn) -> None:
    code = 1
    try:
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        os.setsid()
        request, fds = _recv(conn, 3)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.umask(request["umask"])
        os.sched_setaffinity(0, request["affinity"])
        os.environ.clear()
        os.environ.update(request["env"])
        import tempfile
        tempfile.tempdir = None  # gettempdir() reads this TMPDIR, not the server's
        _stdio(request["env"])
        _sys_path(request["env"])
        _started_as(request["env"])
        _send(conn, {"pid": os.getpid()})
        _watch(conn)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_DFL)
        code = _run(request["argv"])
    except BaseException:  # noqa: BLE001  (the child must end here, whatever happened)
        try:
            import traceback
            traceback.print_exc()
        except BaseException:  # noqa: BLE001
            pass
    finally:
        os._exit(code)


def _stdio(env) -> None:
    """Standard streams as Python would have made them for env (PYTHONUNBUFFERED), over the client's fds."""
    import io
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        raw = io.FileIO(fd, "w", closefd=False)
        buf = raw if unbuffered else io.BufferedWriter(raw)
        setattr(sys, name, io.TextIOWrapper(buf, encoding=old.encoding, errors=old.errors,  # as Python 3.9+ does:
                                            line_buffering=not unbuffered and (name == "stderr" or raw.isatty()),
                                            write_through=unbuffered))  # stderr line-buffered, -u unbuffered
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding=sys.stdin.encoding)
    sys.__stdout__, sys.__stderr__, sys.__stdin__ = sys.stdout, sys.stderr, sys.stdin


def _sys_path(env) -> None:
    """The client's PYTHONPATH (one that fits, _pythonpath_fits) where Python puts it, and its sitecustomize run as
    site runs it at start-up."""
    folders = [d for d in (env.get("PYTHONPATH") or "").split(os.pathsep) if d]
    if not folders or env.get("PYTHONPATH") == _SERVER_PYTHONPATH:
        return
    sys.path[1:1] = [os.path.abspath(d) for d in folders]
    if any(os.path.exists(os.path.join(d, "sitecustomize.py")) for d in folders):
        sys.modules.pop("sitecustomize", None)  # the server's own, if its Python had one, is not the client's
        try:
            import sitecustomize  # noqa: F401
        except Exception as err:  # noqa: BLE001  (as site: said, and the start goes on)
            print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(err).__name__}: {err}",
                  file=sys.stderr)


def _started_as(env) -> None:
    """What a Python started with env would have set at start-up: bytecode writing, numpy's BLAS pool size."""
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    blas = next((env[k] for k in BLAS_THREADS if env.get(k)), None)  # OpenBLAS's order of precedence
    if blas is not None:
        try:
            from threadpoolctl import threadpool_limits
            threadpool_limits(limits=int(blas), user_api="blas")
        except ImportError:
            pass


def _watch(conn) -> None:
    """A thread that kills this child when its client's end closes (the client died, even by SIGKILL)."""
    import threading

    def wait():
        try:
            while conn.recv(64):
                pass
        except OSError:
            pass
        os.killpg(0, signal.SIGKILL)  # this child's group: what it started goes with it

    threading.Thread(target=wait, name="forkserver-client", daemon=True).start()


def _run(argv) -> int:
    """Run `-m module args` or `script args` as __main__, end as the interpreter would: the exit code."""
    import atexit
    import random
    import runpy
    import threading
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()  # a process of its own would not share the server's state
    code = 0
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        code = _exit_code(e.code)
    except KeyboardInterrupt:
        import traceback
        traceback.print_exc()
        _finish(threading, atexit)
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # as Python ends on an uncaught Ctrl-C: by SIGINT
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # noqa: BLE001  (as the interpreter reports an uncaught exception)
        sys.excepthook(*sys.exc_info())
        code = 1
    _finish(threading, atexit)
    return code


def _exit_code(value) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def _finish(threading, atexit) -> None:
    try:
        threading._shutdown()  # wait for non-daemon threads, as the interpreter does before atexit
    except BaseException:  # noqa: BLE001
        pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2])
    elif sys.argv[1:2] == ["run"]:
        client(sys.argv[2:])
    else:
        sys.exit("usage: forkserver.py serve SOCKET | run PYTHON ARGS...")
