"""The real databases the store's tests run against: an SQLite file per test, and one
PostgreSQL cluster for the session (Debian's `postgresql` package: initdb and pg_ctl in a
temporary folder, a unix socket only, fsync off), a fresh database in it per test.

initdb refuses to run as root (CI and this machine run the tests as root): there the cluster
runs as the `postgres` user the package creates (runuser), else as nobody (setpriv)."""
from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest


def pg_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    initdb = found[-1] if found else shutil.which("initdb")
    if not initdb:  # CI installs it (.ci/run): a missing package fails these tests, never skips them
        pytest.fail("PostgreSQL's initdb is not installed (Debian: apt-get install postgresql)")
    return Path(initdb).parent


def _as_owner(folder: Path) -> list[str]:
    """The command prefix that runs a PostgreSQL tool as a non-root user owning `folder`."""
    if os.geteuid() != 0:
        return []
    try:
        user = pwd.getpwnam("postgres")
        os.chown(folder, user.pw_uid, user.pw_gid)
        return ["runuser", "-u", "postgres", "--"]
    except KeyError:
        os.chown(folder, 65534, 65534)
        return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    folder: Path
    port: int
    run_as: list[str]
    bin: Path
    _n = itertools.count()

    def ctl(self, *args: str) -> None:
        subprocess.run([*self.run_as, str(self.bin / "pg_ctl"), "-D", str(self.folder / "data"), *args],
                       check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        self.ctl("-o", f"-k {self.folder} -p {self.port} -c listen_addresses='' -c fsync=off",
                 "-l", str(self.folder / "log"), "-w", "start")

    def stop(self) -> None:
        self.ctl("-m", "fast", "-w", "stop")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://tt@/{database}?host={self.folder}&port={self.port}"

    def new_database(self) -> str:
        name = f"t{os.getpid()}_{next(self._n)}"
        with psycopg.connect(host=str(self.folder), port=self.port, user="tt", dbname="postgres",
                             autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)


@pytest.fixture(scope="session")
def postgres():
    folder = Path(tempfile.mkdtemp(prefix="tt-pg-", dir="/tmp"))  # short: a unix socket's path is <= 107 bytes
    run_as = _as_owner(folder)
    binaries = pg_bin()
    subprocess.run([*run_as, str(binaries / "initdb"), "-D", str(folder / "data"), "-A", "trust", "-U", "tt",
                    "--no-sync", "-E", "UTF8"], check=True, capture_output=True, timeout=120)
    cluster = Cluster(folder, _free_port(), run_as, binaries)
    cluster.start()
    try:
        yield cluster
    finally:
        try:
            cluster.ctl("-m", "immediate", "stop")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """A fresh, empty database of each kind (its URL as --db takes it)."""
    if request.param == "sqlite":
        return str(tmp_path / "traces.db")
    return request.getfixturevalue("postgres").new_database()
