"""An EMULATION of the Kubeflow MPI Operator's pods with podman (test_mpijob_pods.py): no Kubernetes here.

What the operator's controller makes of an MPIJob (kubeflow/mpi-operator,
pkg/controller/mpi_job_controller.go; docs/dev/kubernetes.md has the lines) is laid out with podman, read from
the rendered manifest itself:
- the job's headless Service: one podman network; each pod is a container with the pod's host name
  (`JOB-worker-I`, `JOB-launcher`), its DNS record `HOST.JOB.NS.svc.cluster.local` as a network alias, and a
  pod's DNS search list (`NS.svc.cluster.local svc.cluster.local cluster.local`; workers also
  `JOB.NS.svc.cluster.local`, which the operator adds), so exactly the names a pod resolves resolve;
- the SSH Secret: an ECDSA P-521 key pair in PEM as `id_rsa`, `id_rsa.pub` and `authorized_keys`, mode 0600
  when mounted at /root/.ssh (0644 elsewhere), read-only at `sshAuthMountPath` in every pod;
- the ConfigMap: `hostfile` (0444) and `discover_hosts.sh` (0555), mounted at /etc/mpi in the launcher only;
- workers: the container's command, else `/usr/sbin/sshd -De`, with `K_MPI_JOB_ROLE=worker`;
- the launcher is started once every worker is ready (`launcherCreationPolicy: WaitForWorkersReady`; ready =
  its readinessProbe's TCP port accepts), with the manifest's command, args and env as the kubelet expands
  them, then the operator's variables for the MPI implementation.
Not emulated: resource requests and limits (the containers share this machine), the scheduler, restarts.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubelet import kubelet_expand
from podman_images import Containers, podman

NAMESPACE = "default"
CLUSTER_DOMAIN = "cluster.local"
CONFIG_MOUNT = "/etc/mpi"
ROOT_SSH = "/root/.ssh"
SSHD = ["/usr/sbin/sshd", "-De"]
# The launcher's variables the operator adds, per spec.mpiImplementation (the controller's ompiEnvVars,
# intelEnvVars, mpichEnvVars, then the slots variable, then the blanked NVIDIA ones).
OPERATOR_ENV = {
    "OpenMPI": [
        ("OMPI_MCA_orte_keep_fqdn_hostnames", "true"),
        ("OMPI_MCA_orte_default_hostfile", f"{CONFIG_MOUNT}/hostfile"),
        ("OMPI_MCA_plm_rsh_args", "-o ConnectionAttempts=10"),
    ],
    "Intel": [
        ("I_MPI_HYDRA_HOST_FILE", f"{CONFIG_MOUNT}/hostfile"),
        ("I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS", "-o ConnectionAttempts=10"),
    ],
    "MPICH": [
        ("HYDRA_HOST_FILE", f"{CONFIG_MOUNT}/hostfile"),
        ("HYDRA_LAUNCH_EXTRA_ARGS", "-o ConnectionAttempts=10"),
    ],
}
SLOTS_ENV = {"OpenMPI": "OMPI_MCA_orte_set_default_slots", "Intel": "I_MPI_PERHOST"}
_QUANTITY = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


def pod_spec(obj: dict[str, Any], role: str) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["mpiReplicaSpecs"][role]["template"]["spec"]
    return spec


def service_name(obj: dict[str, Any], host: str) -> str:
    """The name the operator writes into the hostfile: `HOST.JOB.NS.svc` (no cluster domain configured)."""
    return f"{host}.{obj['metadata']['name']}.{NAMESPACE}.svc"


def worker_hosts(obj: dict[str, Any]) -> list[str]:
    job = obj["metadata"]["name"]
    return [f"{job}-worker-{i}" for i in range(obj["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"])]


def hostfile(obj: dict[str, Any]) -> str:
    """The ConfigMap's `hostfile`: `NAME slots=N` for Open MPI, `NAME:N` for Intel MPI and MPICH."""
    slots = obj["spec"].get("slotsPerWorker", 1)
    mpi = obj["spec"].get("mpiImplementation", "OpenMPI")
    lines = [
        f"{service_name(obj, h)} slots={slots}" if mpi == "OpenMPI" else f"{service_name(obj, h)}:{slots}"
        for h in worker_hosts(obj)
    ]
    return "".join(f"{line}\n" for line in lines)


def discover_hosts(obj: dict[str, Any], running: Sequence[str]) -> str:
    """The ConfigMap's `discover_hosts.sh`: one `echo NAME` per running worker pod, sorted by pod name."""
    return "#!/bin/sh\n" + "".join(f"echo {service_name(obj, h)}\n" for h in sorted(running))


def dns_options(obj: dict[str, Any], worker: bool) -> list[str]:
    """A pod's DNS search list (ClusterFirst), the operator's extra search domain on workers."""
    searches = [f"{NAMESPACE}.svc.{CLUSTER_DOMAIN}", f"svc.{CLUSTER_DOMAIN}", CLUSTER_DOMAIN]
    if worker:
        searches.append(f"{obj['metadata']['name']}.{NAMESPACE}.svc.{CLUSTER_DOMAIN}")
    return [w for s in searches for w in ("--dns-search", s)]


def bytes_of(quantity: str) -> int:
    """A Kubernetes binary quantity (`256Mi`) in bytes; plain numbers are bytes."""
    for suffix, factor in _QUANTITY.items():
        if quantity.endswith(suffix):
            return int(float(quantity[: -len(suffix)]) * factor)
    return int(quantity)


def container_env(container: dict[str, Any]) -> list[tuple[str, str]]:
    """The container's env as the kubelet sets it: each value expanded against the variables before it."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        env[item["name"]] = kubelet_expand(item["value"], env)
    return list(env.items())


def argv(container: dict[str, Any], env: dict[str, str]) -> list[str]:
    """command + args, expanded as the kubelet does."""
    words = [*container.get("command", []), *container.get("args", [])]
    return [kubelet_expand(w, env) for w in words]


def ssh_secret(directory: Path, mount_path: str, image: str) -> Path:
    """The operator's Secret as files: an ECDSA P-521 key (PEM, as the controller's x509.MarshalECPrivateKey)
    and its public half twice; mode 0600 only under /root/.ssh, as the controller sets it. The image's own
    ssh-keygen makes the key (the test machine need not have OpenSSH)."""
    directory.mkdir(parents=True)
    keygen = [
        "ssh-keygen",
        "-q",
        "-t",
        "ecdsa",
        "-b",
        "521",
        "-m",
        "PEM",
        "-N",
        "",
        "-C",
        "",
        "-f",
        "/s/id_rsa",
    ]
    made = podman("run", "--rm", "--network", "none", "-v", f"{directory}:/s", image, *keygen, timeout=120)
    assert made.returncode == 0, made.stderr
    public = (directory / "id_rsa.pub").read_text()
    (directory / "authorized_keys").write_text(public)
    mode = 0o600 if mount_path == ROOT_SSH else 0o644
    for name in ("id_rsa", "id_rsa.pub", "authorized_keys"):
        (directory / name).chmod(mode)
    directory.chmod(0o755)
    return directory


def config_map(directory: Path, obj: dict[str, Any], running: Sequence[str]) -> Path:
    directory.mkdir(parents=True)
    (directory / "hostfile").write_text(hostfile(obj))
    (directory / "hostfile").chmod(0o444)
    (directory / "discover_hosts.sh").write_text(discover_hosts(obj, running))
    (directory / "discover_hosts.sh").chmod(0o555)
    return directory


def ip_address(name: str, network: str) -> str:
    proc = podman("inspect", "--format", "{{json .NetworkSettings.Networks}}", name, timeout=60)
    assert proc.returncode == 0, proc.stderr
    address: str = json.loads(proc.stdout)[network]["IPAddress"]
    return address


def accepts(address: str, port: int) -> bool:
    """A tcpSocket readiness probe: does the port accept a connection?"""
    try:
        with socket.create_connection((address, port), timeout=1):
            return True
    except OSError:
        return False


@dataclass
class OperatorPods:
    """The pods of one MPIJob, emulated; `close` removes them and the network."""

    obj: dict[str, Any]
    image: str
    work: Path
    containers: Containers
    volumes: Sequence[str] = ()  # extra `-v` specs for every pod (the job's code and output volumes)
    network: str = ""
    workers: dict[str, str] = field(default_factory=dict)  # pod host name -> container name

    def __post_init__(self) -> None:
        self.network = f"{self.containers.name()}-net"
        made = podman("network", "create", self.network, timeout=60)
        assert made.returncode == 0, made.stderr
        self.mount = str(self.obj["spec"].get("sshAuthMountPath", ROOT_SSH))
        self.secret = ssh_secret(self.work / "ssh-secret", self.mount, self.image)

    def _pod(self, host: str, worker: bool) -> list[str]:
        """podman options of a pod: network, host name, Service DNS record, search list, SSH Secret."""
        job = self.obj["metadata"]["name"]
        options = ["--network", self.network, "--hostname", host]
        options += ["--network-alias", f"{host}.{job}.{NAMESPACE}.svc.{CLUSTER_DOMAIN}"]
        options += [*dns_options(self.obj, worker), "-v", f"{self.secret}:{self.mount}:ro"]
        for spec in self.volumes:
            options += ["-v", spec]
        return options

    def _container_options(self, container: dict[str, Any], spec: dict[str, Any]) -> list[str]:
        options = ["-w", container["workingDir"]] if container.get("workingDir") else []
        for volume in spec.get("volumes", []):
            shm = volume.get("emptyDir", {})
            if shm.get("medium") == "Memory" and "sizeLimit" in shm:
                options += ["--shm-size", str(bytes_of(shm["sizeLimit"]))]
        return options

    def start_workers(self, count: int | None = None, timeout: float = 60) -> list[str]:
        """Start the first `count` workers (all by default) and wait until each is ready."""
        spec = pod_spec(self.obj, "Worker")
        (container,) = spec["containers"]
        env = [*container_env(container), ("K_MPI_JOB_ROLE", "worker")]
        command = argv(container, dict(env)) or SSHD
        hosts = worker_hosts(self.obj)[: count if count is not None else None]
        for host in hosts:
            name = self.containers.name()
            options = [
                "run",
                "-d",
                "--rm",
                *self.containers.options(name, 900),
                *self._pod(host, worker=True),
            ]
            options += self._container_options(container, spec)
            options += [w for k, v in env for w in ("-e", f"{k}={v}")]
            started = podman(*options, "--entrypoint", json.dumps(command), self.image, timeout=120)
            assert started.returncode == 0, started.stderr
            self.workers[host] = name
        probe = container.get("readinessProbe", {}).get("tcpSocket", {}).get("port")
        deadline = time.monotonic() + timeout
        for host in hosts:
            if probe is None:
                continue
            address = ip_address(self.workers[host], self.network)
            while not accepts(address, int(probe)):
                assert time.monotonic() < deadline, f"worker {host} not ready on port {probe} in {timeout} s"
                time.sleep(0.2)
        return hosts

    def run_launcher(self, timeout: int) -> subprocess.CompletedProcess[str]:
        """The launcher pod, to its end: the manifest's command with its env and the operator's, /etc/mpi from
        the ConfigMap as it stands with the workers now running."""
        spec = pod_spec(self.obj, "Launcher")
        (container,) = spec["containers"]
        mpi = self.obj["spec"].get("mpiImplementation", "OpenMPI")
        env = [*container_env(container), ("K_MPI_JOB_ROLE", "launcher"), *OPERATOR_ENV[mpi]]
        if mpi in SLOTS_ENV:
            env.append((SLOTS_ENV[mpi], str(self.obj["spec"].get("slotsPerWorker", 1))))
        env += [("NVIDIA_VISIBLE_DEVICES", ""), ("NVIDIA_DRIVER_CAPABILITIES", "")]
        name = self.containers.name()
        config = config_map(self.work / f"config-{name}", self.obj, list(self.workers))
        job = self.obj["metadata"]["name"]
        options = [
            "run",
            "--rm",
            *self.containers.options(name, timeout),
            *self._pod(f"{job}-launcher", False),
        ]
        options += self._container_options(container, spec)
        options += ["-v", f"{config}:{CONFIG_MOUNT}:ro", *(w for k, v in env for w in ("-e", f"{k}={v}"))]
        command = argv(container, dict(env))
        try:
            return podman(*options, "--entrypoint", json.dumps(command), self.image, timeout=timeout + 30)
        finally:
            self.containers.remove(name)

    def close(self) -> None:
        self.containers.remove(*self.workers.values())
        podman("network", "rm", "--force", self.network, timeout=60)
