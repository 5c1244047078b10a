"""The outer side's launches: which items each launch runs, learning the inner test ids (one collect-only
subprocess per Python environment), starting each launch once, and its result (docs/dev/testing.md)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import support
from _pytest import nodes
from ranked_records import LaunchResult, RankLog
from ranked_spec import COLLECT_ENV, RANKED_DIR, REPORTS_ENV, SELECT_ENV, START_ENV, Launch, Site

# --- outer side: the session's launches ------------------------------------------------------------------


def load_module(path: Path, name: str) -> Any:
    """Import a file by path as `name`, reusing the module when that file is already imported so."""
    mod = sys.modules.get(name)
    if mod is not None and Path(getattr(mod, "__file__", "") or "").resolve() == path.resolve():
        return mod
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def flavour_python(flavour: str) -> str:
    return support.flavour_python_path(flavour)


class CollectRun:
    """`pytest --collect-only` of some ranked paths in one Python environment, started at once, in the
    background; `result()` waits: (inner items as (node id, line, domain), errors by node id)."""

    def __init__(self, python: str, paths: list[str], root: Path, tmp: Path) -> None:
        self.python, self.out = python, tmp / "collected.json"
        env = {**START_ENV, "HPCRING_RANKED": "1", COLLECT_ENV: str(self.out), "PYTHONUNBUFFERED": "1"}
        argv = [python, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *paths]
        self.proc = subprocess.Popen(
            ["timeout", "-k", "5", "300", *argv],
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        self.data: dict[str, Any] | None = None

    def result(self) -> tuple[list[tuple[str, int | None, str]], dict[str, str]]:
        if self.data is None:
            output, _ = self.proc.communicate()
            if self.proc.returncode not in (0, 1, 2, 5) or not self.out.exists():
                tail = "\n".join(output.splitlines()[-30:])
                raise nodes.Collector.CollectError(
                    f"collecting the ranked tests with {self.python} failed (exit code "
                    f"{self.proc.returncode}):\n{tail}"
                )
            self.data = json.loads(self.out.read_text())
        return [tuple(i) for i in self.data["items"]], dict(self.data["errors"])  # type: ignore[misc]


@dataclass
class Planned:
    """One outer item to be: its launch, the inner id (None: one stand-in for a launch that cannot even be
    collected here), where the inner test is, and why it is skipped if it is."""

    launch: Launch
    inner: str | None
    lineno: int | None = None
    domain: str = ""
    skip: str | None = None


class RankedSession:
    """The session's view of the ranked tests: the table, the collect-only runs, the launches' results."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.root = Path(config.rootpath)
        self.ranked = self.root / RANKED_DIR
        self.launches: list[Launch] = list(
            load_module(self.ranked / "launches.py", "ranked_launches").LAUNCHES
        )
        keys = [la.key for la in self.launches]
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        assert not dupes, f"{RANKED_DIR}/launches.py: launches {dupes} share a key (give one a name)"
        self.by_key = {la.key: la for la in self.launches}
        self.results: dict[str, LaunchResult] = {}
        self.broken: dict[str, str] = {}  # launches that could not even start: why
        self.sites: dict[str, Site] = {}
        self.wanted_whole: set[str] = set()  # launches an outer test asks for: they run all their tests
        self.pending: dict[str, int] = {}  # selected items not yet torn down, per launch
        self.items: list[pytest.Item] = []  # the session's items, once collected
        self.complete: set[str] = set()  # launches whose every test was collected
        self._plan: tuple[dict[Path, list[Planned]], dict[Path, str]] | None = None

    @classmethod
    def of(cls, config: pytest.Config) -> RankedSession:
        if SESSION not in config.stash:
            config.stash[SESSION] = cls(config)
        return config.stash[SESSION]

    def tmp(self, name: str) -> Path:
        factory: pytest.TempPathFactory = self.config._tmp_path_factory  # type: ignore[attr-defined]
        return factory.mktemp(name)

    def site(self, launch: Launch) -> Site | None:
        if launch.site is None:
            return None
        if launch.site not in self.sites:
            file, _, attr = launch.site.partition(":")
            path = self.root / file
            self.sites[launch.site] = getattr(load_module(path, path.stem), attr)()
        return self.sites[launch.site]

    def missing_module(self, launch: Launch) -> str | None:
        for module in launch.requires:
            if importlib.util.find_spec(module) is None:
                return f"could not import '{module}'"
        return None

    def skip_reason(self, launch: Launch) -> str | None:
        """Why the launch cannot run here (all known before it runs), or None."""
        reason = self.missing_module(launch) or support.missing_flavour(launch.flavour)
        site = self.site(launch)
        return reason or (site.skip_reason(launch) if site is not None else None)

    def arg_paths(self) -> list[Path]:
        """The paths named on the command line (the test paths when none was)."""
        base = Path(self.config.invocation_params.dir)
        paths = [Path(os.path.abspath(base / arg.split("::")[0])) for arg in self.config.args]
        return paths if paths and all(p.exists() for p in paths) else [self.root]

    def targets(self, launch: Launch) -> list[Path]:
        """What of the launch's paths the command line asks for: a path, or a file or folder inside one."""
        out: list[Path] = []
        for p in (self.ranked / q for q in launch.paths):
            assert p.exists(), f"{RANKED_DIR}/launches.py: {launch.key} names {p}, which does not exist"
            for arg in self.arg_paths():
                if arg == p or p in arg.parents:
                    out.append(arg)
                elif arg in p.parents:
                    out.append(p)
        return list(dict.fromkeys(t for t in out if not any(o in t.parents for o in out)))

    def plan(self) -> tuple[dict[Path, list[Planned]], dict[Path, str]]:
        """Items per ranked file (launches in table order, then inner order) and collection errors per
        path. One collect-only run per Python environment, of what the command line asks for; a launch
        whose environment is missing takes its ids from the main one (its items are skipped), one whose
        required module is missing gets one skipped stand-in per file."""
        if self._plan is not None:
            return self._plan
        reasons = {la.key: self.skip_reason(la) for la in self.launches}

        def python(la: Launch) -> str:
            py = flavour_python(la.flavour)
            return py if Path(py).exists() else sys.executable

        targets = {la.key: self.targets(la) for la in self.launches}
        self.complete = {
            la.key for la in self.launches if all(self.ranked / q in targets[la.key] for q in la.paths)
        }
        by_python: dict[str, set[Path]] = {}
        for la in self.launches:
            if self.missing_module(la) is None:
                by_python.setdefault(python(la), set()).update(targets[la.key])
        runs = {}
        for py, wanted in by_python.items():
            paths = sorted(
                str(t.relative_to(self.root)) for t in wanted if not any(o in t.parents for o in wanted)
            )
            if paths:
                runs[py] = CollectRun(py, paths, self.root, self.tmp("collect"))
        planned: dict[Path, list[Planned]] = {}
        errors: dict[Path, str] = {}
        for la in self.launches:
            mine = targets[la.key]
            if not mine:
                continue
            if self.missing_module(la) is not None:
                for m in mine:
                    for f in sorted(m.rglob("test_*.py")) if m.is_dir() else [m]:
                        planned.setdefault(f, []).append(Planned(la, None, skip=reasons[la.key]))
                continue
            items, errs = runs[python(la)].result()
            for nodeid, text in errs.items():
                path = self.root / nodeid.split("::")[0]
                if any(path == m or m in path.parents or path in m.parents for m in mine):
                    errors.setdefault(
                        path, f"collecting in the {la.flavour} environment ({python(la)}):\n{text}"
                    )
            for nodeid, lineno, domain in items:
                path = self.root / nodeid.split("::")[0]
                if any(path == m or m in path.parents for m in mine):
                    planned.setdefault(path, []).append(Planned(la, nodeid, lineno, domain, reasons[la.key]))
        self._plan = planned, errors
        return self._plan

    def every_id(self, launch: Launch) -> list[str]:
        """Every inner id of the launch that was collected (all of them if the launch is in `complete`)."""
        if self._plan is None:
            return []
        return [p.inner for ps in self._plan[0].values() for p in ps if p.launch is launch and p.inner]

    def selection(self, launch: Launch) -> list[str] | None:
        """The inner ids to run: the selected items', or None for all (also when an outer test asks for
        the launch: it needs every test to have run)."""
        if launch.key in self.wanted_whole:
            return None
        chosen = [i.inner for i in self.items if getattr(i, "launch", None) is launch and i.inner]
        return chosen or None

    def result(self, launch: Launch) -> LaunchResult:
        if launch.key in self.broken:
            raise RuntimeError(f"launch {launch.key} could not start: {self.broken[launch.key]}")
        if launch.key not in self.results:
            try:
                self.results[launch.key] = self.run(launch)
            except Exception as exc:
                self.broken[launch.key] = f"{type(exc).__name__}: {exc}"
                raise
            finally:
                self.release_site(launch)
        return self.results[launch.key]

    def run(self, launch: Launch) -> LaunchResult:
        """One launch of the real launcher, under `timeout`, running the selected inner ids on every rank."""
        tmp = self.tmp(f"launch-{launch.key.replace('/', '-')}")
        selected = self.selection(launch)
        py = flavour_python(launch.flavour)
        tbstyle = self.config.getoption("tbstyle", "auto")
        # tee-sys: a test's prints are in its report and in the launcher's output, where a crash shows them
        inner_cmd = [py, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--capture=tee-sys"]
        inner_cmd += [*([f"--tb={tbstyle}"] if tbstyle != "auto" else []), *launch.pytest_args]
        inner_cmd += [f"{RANKED_DIR}/{p}" for p in launch.paths]
        own_env = {k: v.replace("{tmp}", str(tmp)) for k, v in launch.env.items()}
        env = {
            **START_ENV,
            "HPCRING_RANKED": "1",
            "PYTHONUNBUFFERED": "1",
            "HPCRING_TEST_BASETEMP": str(tmp / "ranks"),
            REPORTS_ENV: str(tmp / "reports"),
            **own_env,
        }
        if selected is not None:
            (tmp / "select.json").write_text(json.dumps(selected))
            env[SELECT_ENV] = str(tmp / "select.json")
        prefix: list[str] = []
        site_args: list[str] = []
        site = self.site(launch)
        if site is not None:
            prefix, site_args, site_env = site.prepare(launch)
            env.update(site_env)
        argv = [*prefix, py, "-m", "hpcring", "run", "-np", str(launch.np), "--mpi", launch.flavour]
        argv += ["--emulate-nodes", str(launch.emulate_nodes)] if launch.emulate_nodes else []
        argv += [*launch.launcher_args, *site_args, "--", *inner_cmd]
        t0 = time.monotonic()
        proc = subprocess.run(
            ["timeout", "-k", "5", str(launch.timeout), *argv],
            cwd=self.root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            check=False,
        )
        took = time.monotonic() - t0
        (tmp / "output.log").write_text(f"$ {' '.join(argv)}\n{proc.stdout}")
        logs = {int(f.stem[4:]): RankLog.read(f) for f in (tmp / "reports").glob("rank*.jsonl")}
        # Run order: as the ranks began the tests (all in the same order), then those none began.
        order: list[str] = []
        for log in sorted(logs.values(), key=lambda lg: -len(lg.begun)):
            order += [n for n in log.begun if n not in order]
        order += [n for n in (selected if selected is not None else self.every_id(launch)) if n not in order]
        result = LaunchResult(launch, argv, own_env, tmp, proc.returncode, proc.stdout, took, order, logs)
        if site is not None:
            site.finished(launch, result)
        return result

    def release_site(self, launch: Launch) -> None:
        """Close the launch's site once no launch of this session that still has to run uses it."""
        if launch.site is None or launch.site not in self.sites:
            return
        wanted = {
            i.launch.key for i in self.items if isinstance(getattr(i, "launch", None), Launch)
        } | self.wanted_whole
        users = {la.key for la in self.launches if la.site == launch.site and la.key in wanted}
        if all(k in self.results or k in self.broken for k in users):
            self.sites.pop(launch.site).close()

    def close(self) -> None:
        for site in self.sites.values():
            site.close()
        self.sites.clear()


SESSION = pytest.StashKey[RankedSession]()
