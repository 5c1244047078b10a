"""The kubelet's `$(VAR)` expansion, written from Kubernetes' documented rule: how a container sees the
command, args and env values of a manifest (tests/schedulers' Kubernetes tests, the podman pod emulation)."""

from __future__ import annotations

import re

_VAR = re.compile(r"\$(\$|\(([A-Za-z_][A-Za-z0-9_]*)\))")


def kubelet_expand(text: str, env: dict[str, str]) -> str:
    """What a container sees of a command/args/env string: `$$` -> `$`, `$(NAME)` -> NAME's value when the
    container defines NAME, else left as written (Kubernetes API reference, Container.command/args/env)."""

    def one(m: re.Match[str]) -> str:
        if m.group(1) == "$":
            return "$"
        name = m.group(2)
        return env[name] if name in env else m.group(0)

    return _VAR.sub(one, text)
