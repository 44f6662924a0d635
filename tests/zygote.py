"""``cubelake`` commands in new processes forked from a warm one: the tests' CLI runs without the import cost.

A command started as ``python -m cubelake.cli`` spends 0.7-2.5 s of CPU importing numpy, GDAL, zarr, xarray and
the rest before it does anything, and the suite starts hundreds. The zygote is one process that imports them
once and then forks a child per command: the child is a new process with its own pid, environment, working
folder, standard streams and exit status, runs ``cubelake.cli`` as ``python -m`` would, and exits, so each
command still starts from a clean state (nothing a command does is seen by the next). What differs from a cold
start is only what was imported before the command began, which is why the start-up tests, and every test that
times its own start, starts a real ``python -m cubelake.cli`` instead. Kill and race tests use :class:`WarmProcess`:
SIGKILL and Ctrl-C reach the forked command itself, as they would a cold one. ``CUBELAKE_TEST_COLD_CLI=1``
(:func:`cold`) makes every helper start commands cold.

The zygote forks from a single thread (it serves one request at a time, from a select loop) and is checked to
have no other thread after its imports, so the children inherit no held lock.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: what every command imports; nothing here may start a thread at import
PRELOAD = ("numpy", "rasterio", "rasterio.warp", "zarr", "xarray", "pyproj", "shapely", "typer", "rich",
           "cubelake.cli", "cubelake.lake", "cubelake.storage", "cubelake.catalog", "cubelake.ingest", "torch")
#: a zygote without torch, for commands whose memory is measured: a child starts with its zygote's resident
#: memory (~195 MiB with these, ~375 MiB with torch too), as a cold ``cubelake ingest`` has after its imports
LIGHT = tuple(name for name in PRELOAD if name != "torch")


@dataclass
class _Zygote:
    proc: subprocess.Popen[bytes]
    path: str


_LOCK = threading.Lock()
_ZYGOTES: dict[bool, _Zygote] = {}


def _start(light: bool) -> _Zygote:
    folder = tempfile.mkdtemp(prefix="cubelake-zygote-")
    path = os.path.join(folder, "sock")
    proc = subprocess.Popen([sys.executable, "-m", "tests.zygote", path, *(["light"] if light else [])],
                            cwd=Path(__file__).resolve().parents[1], stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not os.path.exists(path):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the CLI zygote did not start (exit {proc.poll()})")
        time.sleep(0.02)
    atexit.register(_stop, proc, folder)
    return _Zygote(proc, path)


def _stop(proc: subprocess.Popen[bytes], folder: str) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    shutil.rmtree(folder, ignore_errors=True)


def _zygote(light: bool = False) -> _Zygote:
    """The running zygote (started if it is not): with :data:`PRELOAD`, or ``light`` with :data:`LIGHT`."""
    with _LOCK:
        z = _ZYGOTES.get(light)
        if z is None or z.proc.poll() is not None:
            z = _ZYGOTES[light] = _start(light)
        return z


def cold() -> bool:
    """Whether this run starts every command cold (``CUBELAKE_TEST_COLD_CLI=1``), not from the zygote."""
    return os.environ.get("CUBELAKE_TEST_COLD_CLI") == "1"


def socket_path() -> str:
    """The zygote's socket (started if it is not running): what ``tests/bin/cubelake`` connects to."""
    return _zygote().path


def run(args: list[str], env: dict[str, str], cwd: str | None, timeout: float,
        code: str | None = None) -> tuple[int, bytes, bytes]:
    """Run ``cubelake *args`` (or, given ``code``, ``python -c code``) in a child of the zygote: its exit code,
    stdout and stderr (``TimeoutExpired``, the child killed, past ``timeout``)."""
    proc = WarmProcess(args, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, code=code)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise subprocess.TimeoutExpired(proc.args, timeout) from None
    return proc.wait(), out, err


class WarmProcess:
    """``subprocess.Popen`` of ``cubelake *args``, forked from the zygote: a real process (its own pid, session,
    streams, exit status) that tests signal, kill and wait for; ``stdout``/``stderr``: ``None`` (this process's),
    ``subprocess.DEVNULL`` or ``subprocess.PIPE``; ``light``: forked from the zygote without torch."""

    def __init__(self, args: list[str], *, env: dict[str, str] | None = None, cwd: str | Path | None = None,
                 stdout: int | None = None, stderr: int | None = None, text: bool = False,
                 code: str | None = None, light: bool = False) -> None:
        self.args = ["cubelake", *args] if code is None else ["python", "-c", code, *args]
        self.returncode: int | None = None
        self.stdout: Any = None
        self.stderr: Any = None
        null = os.open(os.devnull, os.O_RDWR)
        fds, theirs = [null], [null]
        for name, spec, own in (("stdout", stdout, 1), ("stderr", stderr, 2)):
            if spec == subprocess.PIPE:
                r, w = os.pipe()
                setattr(self, name, open(r, "r" if text else "rb"))  # noqa: SIM115 (closed by communicate)
                fds.append(w)
                theirs.append(w)
            else:
                fds.append(null if spec == subprocess.DEVNULL else own)
        request = {"args": args, "env": dict(os.environ if env is None else env), "cwd": str(cwd or os.getcwd()),
                   "code": code}
        self._conn = socket.socket(socket.AF_UNIX)
        try:
            self._conn.connect(_zygote(light).path)
            socket.send_fds(self._conn, [json.dumps(request).encode() + b"\n"], fds)
        finally:
            for fd in theirs:
                os.close(fd)
        self._conn.settimeout(30)
        self._reader = self._conn.makefile("rb")
        self.pid = int(self._reader.readline())
        self._got: dict[str, Any] = {}
        self._readers: list[threading.Thread] = []

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):  # it ended already (as Popen.send_signal)
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def poll(self) -> int | None:
        if self.returncode is None and select_ready(self._conn):
            return self.wait()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._conn.settimeout(timeout)
            try:
                line = self._reader.readline()
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout or 0) from None
            if not line:
                raise RuntimeError("the CLI zygote went away")
            self.returncode = int(line)
            self._reader.close()
            self._conn.close()
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[Any, Any]:
        """Everything the piped streams say until the process ends, and its end (as ``Popen.communicate``, which
        can be called again after a ``TimeoutExpired``: the streams' readers go on, and nothing read is lost)."""
        got = self._got
        if not self._readers:
            self._readers = [threading.Thread(target=lambda n=n, f=f: got.__setitem__(n, f.read()), daemon=True)
                             for n, f in (("out", self.stdout), ("err", self.stderr)) if f is not None]
            for t in self._readers:
                t.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self._readers:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        self.wait(None if deadline is None else max(0.1, deadline - time.monotonic()))
        for f in (self.stdout, self.stderr):
            if f is not None:
                f.close()
        return got.get("out"), got.get("err")


def select_ready(conn: socket.socket) -> bool:
    with selectors.DefaultSelector() as sel:
        sel.register(conn, selectors.EVENT_READ)
        return bool(sel.select(0))


# -- the zygote itself ------------------------------------------------------------------------------------


def _child(request: dict[str, object], fds: list[int]) -> None:
    """In the forked child: become ``python -m cubelake.cli <args>`` (never returns)."""
    import runpy

    code = 0
    try:
        os.setsid()  # its own process group, as a new command has
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.chdir(str(request["cwd"]))
        os.environ.clear()
        os.environ.update(request["env"])  # type: ignore[arg-type]
        for fd, theirs in enumerate(fds):  # the caller's stdin, stdout and stderr (or /dev/null, or pipes)
            os.dup2(theirs, fd)
            os.close(theirs)
        sys.path[0] = str(request["cwd"])  # as ``python -m`` puts the working folder first
        if request.get("code") is not None:  # python -c: a __main__ without a file
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            sys.argv = ["-c", *request["args"]]  # type: ignore[misc]
            exec(compile(str(request["code"]), "<string>", "exec"), main.__dict__)
        else:
            sys.argv = [sys.executable, *request["args"]]  # type: ignore[misc]
            runpy.run_module("cubelake.cli", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:  # what an uncaught exception does in a fresh interpreter
        import traceback

        traceback.print_exc()
        code = 1
    try:  # what an interpreter does on its way out: wait for its threads, run its exit functions, flush
        threading._shutdown()  # type: ignore[attr-defined]
        import atexit as _atexit

        _atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _receive(conn: socket.socket) -> tuple[dict[str, object] | None, list[int]]:
    """One request line, and the descriptors sent with it: the caller's stdin, stdout and stderr."""
    conn.settimeout(30)
    try:
        data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 3)
        while data and not data.endswith(b"\n"):
            more = conn.recv(1 << 16)
            if not more:
                break
            data += more
    except OSError:
        return None, []
    conn.settimeout(None)
    if not data.endswith(b"\n") or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        return None, []
    return json.loads(data), fds


def _serve(path: str, light: bool) -> None:
    for name in LIGHT if light else PRELOAD:
        __import__(name)
    assert threading.active_count() == 1, f"a preloaded module started a thread: {threading.enumerate()}"
    server = socket.socket(socket.AF_UNIX)
    server.bind(path + ".tmp")
    os.rename(path + ".tmp", path)
    server.listen(64)
    sel = selectors.DefaultSelector()
    sel.register(server, selectors.EVENT_READ)
    waiting: dict[int, socket.socket] = {}
    while True:
        for _key, _ in sel.select(timeout=0.05):
            conn, _ = server.accept()
            request, fds = _receive(conn)
            if request is None:
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                server.close()
                conn.close()
                _child(request, fds)
            for fd in fds:
                os.close(fd)
            conn.sendall(f"{pid}\n".encode())
            waiting[pid] = conn
        while waiting:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = waiting.pop(pid)
            with conn:
                conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
        if os.getppid() == 1:  # the test process is gone
            return


if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2:] == ["light"])
