"""`dashboard [RUNS_DIR]`: serve the Streamlit app over a folder of runs.

The app itself is `dashboard/app.py`; this entry point only picks the
address, prints the URL and replaces itself with `streamlit run` (exec, so
signals and the exit code are Streamlit's own), through dashboard/serve.py,
which imports the analyzer before Streamlit starts listening.
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
from pathlib import Path

# The app reads the runs folder from this variable; one channel for both the
# CLI and tests (AppTest cannot pass script arguments).
RUNS_DIR_ENV = "DASHBOARD_RUNS_DIR"
APP_PATH = Path(__file__).resolve().parent / "app.py"
LOCALHOST = "127.0.0.1"


def free_port(host: str) -> int:
    """A TCP port the OS reports free on `host` right now (0-bind trick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    """True when `host:port` can be bound (nothing listens there)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
        return True


def streamlit_argv(host: str, port: int) -> list[str]:
    """The `streamlit run` command line for the app on `host:port`.

    Headless (no browser opened, no email prompt), no usage statistics, no
    file watcher (the app's code does not change while it is served), viewer
    toolbar (no "clear cache"/"deploy" developer menu), no "magic" (the
    pages call st.* explicitly; rewriting a page's syntax tree for magic
    took 0.1 s of every new session's first run).
    """
    return [
        sys.executable,
        "-m",
        "dashboard.serve",  # `python -m streamlit`, after importing the analyzer (dashboard/serve.py)
        "run",
        str(APP_PATH),
        "--server.address",
        host,
        "--server.port",
        str(port),
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        "--server.fileWatcherType",
        "none",
        "--server.runOnSave",
        "false",
        "--client.toolbarMode",
        "viewer",
        "--global.developmentMode",
        "false",
        "--runner.magicEnabled",
        "false",
    ]


def build_parser() -> argparse.ArgumentParser:
    """The ``dashboard`` command's arguments (tests/test_public_surface.py freezes its flags)."""
    parser = argparse.ArgumentParser(
        prog="dashboard",
        description="Serve the trainperf dashboard over a folder of runs (reftrain run "
        "directories and folders of PyTorch profiler traces).",
    )
    from analyzer.ingest.formats import package_version  # the one version lookup of trainperf's commands

    parser.add_argument("--version", action="version", version=f"dashboard (trainperf) {package_version()}")
    parser.add_argument("runs_dir", nargs="?", default="runs", help="folder of runs (default: runs/)")
    parser.add_argument("--port", type=int, default=None, help="TCP port (default: a free one)")
    parser.add_argument(
        "--host",
        default=LOCALHOST,
        help="address to bind (default 127.0.0.1, this machine only; "
        "0.0.0.0 exposes the dashboard to the network, deliberately)",
    )
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def missing_libraries() -> list[str]:
    """The `dashboard` extra's libraries that cannot be imported here (the analyzer installs without them)."""
    import importlib.util

    return [name for name in ("streamlit", "plotly") if importlib.util.find_spec(name) is None]


def main(argv: list[str] | None = None) -> int:
    """Validate the arguments, print the URL and exec Streamlit.

    Returns an exit code only on a usage error (2); otherwise it does not
    return: the process becomes the Streamlit server.
    """
    args = parse_args(argv)
    missing = missing_libraries()
    if missing:
        print(f"dashboard: {', '.join(missing)} not installed: pip install 'trainperf[dashboard]'", file=sys.stderr)
        return 2
    runs_dir = Path(args.runs_dir).expanduser()
    if not runs_dir.is_dir():
        print(
            f"dashboard: {runs_dir} is not a folder (run `make demo` to create runs/, "
            "or pass a folder of runs or traces)",
            file=sys.stderr,
        )
        return 2
    try:
        if args.port is None:
            port = free_port(args.host)
        elif not 0 < args.port < 65536:
            print(f"dashboard: --port {args.port} is not a TCP port (1 to 65535)", file=sys.stderr)
            return 2
        elif not port_is_free(args.host, args.port):
            print(f"dashboard: port {args.port} on {args.host} is already in use", file=sys.stderr)
            return 2
        else:
            port = args.port
    except OSError as exc:
        print(f"dashboard: cannot bind {args.host}: {exc.strerror or exc}", file=sys.stderr)
        return 2

    shown_host = args.host if args.host not in ("0.0.0.0", "") else socket.gethostname()
    print(f"dashboard: serving {runs_dir.resolve()}", flush=True)
    print(f"dashboard: open http://{shown_host}:{port}/", flush=True)
    if args.host != LOCALHOST:
        print(f"dashboard: bound to {args.host}, reachable from other machines", flush=True)

    env = dict(os.environ)
    env[RUNS_DIR_ENV] = str(runs_dir.resolve())
    cmd = streamlit_argv(args.host, port)
    os.execve(cmd[0], cmd, env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
