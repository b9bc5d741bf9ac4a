"""Shared JVMs for the Java engines (TextWorldExpress, ScienceWorld).

One JVM per (jar, options) per process hosts every game interface object of that engine: 128
concurrent games need one JVM, not 128. Closing one environment never shuts the shared JVM down;
the last user, interpreter exit, or :meth:`SharedJVM.restart` after a crash does.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import threading
from typing import Any, ClassVar

from .base import EnvError, EnvUnavailable

JAVA_HELP = "Java 17+ is missing: install it with `apt-get install -y default-jre-headless`"

# A JVM left alone grows to GBs; the engines run in far less (ScienceWorld measured ~200 MB).
DEFAULT_JAVA_OPTS = ("-Xmx512m", "-XX:+UseSerialGC", "-Xss8m")


def java_missing() -> str | None:
    return None if shutil.which("java") else JAVA_HELP


class SharedJVM:
    """A lazily started py4j gateway to one jar, shared by every user in this process."""

    _instances: ClassVar[dict[tuple[str, tuple[str, ...]], SharedJVM]] = {}
    _lock = threading.Lock()

    def __init__(self, jar: str, cwd: str, java_opts: tuple[str, ...]) -> None:
        self.jar, self.cwd, self.java_opts = jar, cwd, java_opts
        self.gateway: Any = None
        self.generation = 0  # bumps on every (re)start so users can tell their objects are stale
        self.users = 0

    @classmethod
    def get(cls, jar: str, cwd: str, java_opts: tuple[str, ...] = DEFAULT_JAVA_OPTS) -> SharedJVM:
        key = (jar, java_opts)
        with cls._lock:
            if key not in cls._instances:
                cls._instances[key] = SharedJVM(jar, cwd, java_opts)
            return cls._instances[key]

    def acquire(self) -> Any:
        """Register a user and return the live gateway (starting the JVM if needed)."""
        with self._lock:
            self.users += 1
            return self._ensure()

    def release(self) -> None:
        with self._lock:
            self.users = max(0, self.users - 1)
            if self.users == 0:
                self._shutdown()

    def jvm(self) -> Any:
        with self._lock:
            return self._ensure().jvm

    def restart(self) -> None:
        """Kill and relaunch the JVM (after a crash); every interface object becomes stale."""
        with self._lock:
            self._shutdown()
            self._ensure()

    def alive(self) -> bool:
        gw = self.gateway
        return gw is not None and gw.java_process is not None and gw.java_process.poll() is None

    def _ensure(self) -> Any:
        if self.gateway is not None and self.alive():
            return self.gateway
        if self.gateway is not None:
            self._shutdown()
        missing = java_missing()
        if missing:
            raise EnvUnavailable(missing)
        from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway

        env_opts = os.environ.get("FACTOR_JAVA_OPTS")
        opts = list(env_opts.split()) if env_opts else list(self.java_opts)
        try:
            # A process group of its own: Ctrl-C in the terminal interrupts Python (which then
            # shuts the JVM down) instead of killing the JVM under a running call, which surfaced
            # as py4j tracebacks and exit 1. die_on_exit still ends it if Python dies first.
            port, proc = launch_gateway(
                classpath=self.jar,
                die_on_exit=True,
                cwd=self.cwd,
                javaopts=opts,
                return_proc=True,
                create_new_process_group=True,
            )
        except Exception as exc:  # py4j reports a failed launch with bare exceptions
            raise EnvError(
                f"could not start the JVM for {os.path.basename(self.jar)}: {exc}"
            ) from exc
        self.gateway = JavaGateway(
            gateway_parameters=GatewayParameters(auto_field=True, port=port), java_process=proc
        )
        self.generation += 1
        return self.gateway

    def _shutdown(self) -> None:
        gw, self.gateway = self.gateway, None
        if gw is None:
            return
        proc = gw.java_process
        with contextlib.suppress(Exception):  # the JVM may already be dead; we only need it gone
            gw.shutdown()
        if proc is not None and proc.poll() is None:
            try:  # py4j's launched JVM exits when its stdin sees a newline (die_on_exit)
                proc.stdin.write(b"\n")
                proc.stdin.flush()
                proc.wait(timeout=5)
            except Exception:
                proc.kill()

    @classmethod
    def shutdown_all(cls) -> None:
        with cls._lock:
            for inst in cls._instances.values():
                inst._shutdown()


atexit.register(SharedJVM.shutdown_all)
# py4j logs every broken connection with a traceback; a dead JVM is reported by EnvPool instead.
logging.getLogger("py4j").setLevel(logging.CRITICAL)


def _not_py4j(record: logging.LogRecord) -> bool:
    """Drop what py4j logs on the root logger (its Ctrl-C handler prints a whole traceback)."""
    return not (record.name == "root" and "py4j" in record.pathname)


logging.getLogger().addFilter(_not_py4j)
