"""`hpcring profiles list|show NAME|validate FILE|schema|init`: what the built-in profiles are, whether yours
is valid, and a first profile for the cluster you are on."""

from __future__ import annotations

import argparse

from hpcring.errors import ProfileError, choices


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    sub.add_parser("list", help="list the built-in profiles")
    show = sub.add_parser("show", help="print a profile's YAML (with its cited sources)")
    show.add_argument("name", help="profile name, file, or 'local'")
    val = sub.add_parser(
        "validate", help="check a profile file; exit 2 with the YAML path of the first error"
    )
    val.add_argument("file", nargs="+", help="profile YAML file(s) to check, each on its own")
    schema = sub.add_parser("schema", help="print the JSON Schema of profiles (or of job files)")
    schema.add_argument("--job", action="store_true", help="print the job file schema instead")
    schema.add_argument(
        "--schema-version",
        type=int,
        default=None,
        metavar="N",
        help="schema version to print (profiles: 1 or 2); default: the newest [HPCRING_SCHEMA_VERSION]",
    )
    init = sub.add_parser(
        "init",
        help="write a profile (schema v2) for this cluster: run it on a compute node",
        description="Reads /sys (CPUs, NUMA, NICs), lstopo, nvidia-smi/rocm-smi and the batch system "
        "(scontrol/sinfo, qstat, flux, bqueues); what it cannot find out is left as TODO comments.",
    )
    init.add_argument(
        "-o", "--output", metavar="FILE", help="write here instead of stdout [HPCRING_INIT_OUTPUT]"
    )
    init.add_argument(
        "--name", help="profile name (default: Slurm's ClusterName or the host name) [HPCRING_INIT_NAME]"
    )
    init.add_argument(
        "--sysfs-root", metavar="DIR", help="read this /sys tree instead of /sys [HPCRING_SYSFS_ROOT]"
    )
    init.add_argument(
        "--scheduler",
        help="the batch system: slurm, pbs, flux or lsf; needed where none of their commands answers "
        "[HPCRING_INIT_SCHEDULER]",
    )
    init.add_argument(
        "--from-dir",
        metavar="DIR",
        help="read recorded tool outputs (<source>.txt, e.g. scontrol-partition.txt) instead of running the "
        "tools [HPCRING_INIT_FROM_DIR]",
    )


def _schema(name: str, version: int | None) -> int:
    from hpcring.cli.flag_values import env_default
    from hpcring.errors import ConfigError
    from hpcring.schedulers import validation

    shipped = validation.versions(name)
    env = env_default("HPCRING_SCHEMA_VERSION", int)
    chosen = version if version is not None else env if isinstance(env, int) else shipped[-1]
    if chosen not in shipped:
        raise ConfigError(f"--schema-version: no {name} schema {chosen}; allowed: {choices(shipped)}")
    print(validation.schema_text(name, chosen), end="")
    return 0


def _init(args: argparse.Namespace) -> int:
    import os
    import socket
    from pathlib import Path

    from hpcring.schedulers.profile_init import compose, probe, sysfs, writer

    def opt(value: str | None, var: str) -> str | None:
        return value if value is not None else (os.environ.get(var) or None)

    output = opt(args.output, "HPCRING_INIT_OUTPUT")
    root = Path(opt(args.sysfs_root, "HPCRING_SYSFS_ROOT") or "/sys")
    from_dir = opt(args.from_dir, "HPCRING_INIT_FROM_DIR")
    if output is not None and Path(output).exists():
        raise ProfileError(f"--output: {output!r} exists; remove it or choose another file")
    if not root.is_dir():
        raise ProfileError(f"--sysfs-root: {str(root)!r} is not a directory")
    if from_dir is not None:
        if not Path(from_dir).is_dir():
            raise ProfileError(f"--from-dir: {from_dir!r} is not a directory")
        outputs, notes = probe.read_dir(Path(from_dir)), list[str]()
    else:
        outputs, notes = probe.run_all()
    draft = compose.compose(
        sysfs.read_tree(root),
        outputs,
        opt(args.name, "HPCRING_INIT_NAME"),
        socket.gethostname(),
        opt(args.scheduler, "HPCRING_INIT_SCHEDULER"),
    )
    draft.notes.extend(notes)
    text = writer.profile_yaml(draft)
    from hpcring.schedulers import profile

    profile.parse(text, "profiles init (generated)")  # never hand out a file that does not validate
    if output is None:
        print(text, end="")
        return 0
    Path(output).write_text(text, "utf-8")
    print(f"wrote {output}: profile {draft.name!r} from {', '.join(draft.sources) or 'no source'}")
    return 0


def _list() -> int:
    from hpcring.schedulers import profile

    for name in profile.builtin_names():
        if name == profile.LOCAL:
            print(f"{name:<20} this machine, detected (/sys, lscpu, nvidia-smi)")
            continue
        p = profile.load(name)
        retired = f" [retired {p.retired.date}]" if p.retired else ""
        print(f"{name:<20} {p.site.scheduler:<10} {p.site.launcher:<7} {p.description}{retired}")
    return 0


def _validate(files: list[str]) -> int:
    from hpcring.schedulers import profile

    for f in files:
        if not f.endswith((".yaml", ".yml")) and "/" not in f:
            f = f"./{f}"  # a file name, never a built-in profile name
        try:
            p = profile.load(f)
        except ProfileError:
            raise
        node = p.node
        print(
            f"{f}: valid profile {p.name!r}: {node.sockets} x {node.cores_per_socket} cores x "
            f"{node.threads_per_core} threads, {len(node.reserved_cores)} reserved, {len(node.gpus)} GPU(s), "
            f"{p.site.scheduler}/{p.site.launcher}"
        )
    return 0


def main(args: argparse.Namespace) -> int:
    from hpcring.schedulers import profile

    if args.action == "list":
        return _list()
    if args.action == "show":
        print(profile.source_of(args.name)[1], end="")
        return 0
    if args.action == "validate":
        return _validate(args.file)
    if args.action == "init":
        return _init(args)
    return _schema("job" if args.job else "profile", args.schema_version)
