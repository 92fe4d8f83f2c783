"""``python -m overlap.info [--json | --env]``: what this build of overlap can do here.

``--json`` prints the raw facts, ``--env`` the table of OVERLAP_* environment variables.
"""

from __future__ import annotations

import json
import sys

from overlap._native import build_info
from overlap._version import __version__


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}" if v else "none"


def summary() -> str:
    """A short human-readable summary of :func:`overlap.build_info`."""
    info = build_info()
    lines = [f"overlap {__version__}"]
    if not info["cuda_compiled"]:
        lines.append(f"  CUDA support : ABSENT ({info['no_cuda_reason']})")
        lines.append("  transports   : host only")
        return "\n".join(lines)
    lines += [
        f"  CUDA support : compiled for {info['cuda_archs']}",
        f"  CUDA runtime : {_cuda_version(info['cudart_version'])} "
        f"(built with {_cuda_version(info['cudart_build_version'])}), "
        f"driver {_cuda_version(info['driver_version'])}",
        f"  cuBLASLt     : {info['cublaslt_version']} from {info['cublaslt_loaded_library']}",
        f"  GPUs         : {info['device_count']}"
        + (f" ({info['device_error']})" if info["device_error"] else ""),
    ]
    for d in info["devices"]:
        cc = ".".join(map(str, d["compute_capability"]))
        peers = "".join("1" if p else "0" for p in d["peer_access"])
        lines.append(
            f"    [{d['ordinal']}] {d['name']} sm_{cc.replace('.', '')} {d['sm_count']} SMs "
            f"{d['total_memory'] / 2**30:.0f} GiB bus {d['pci_bus_id']} peer-access {peers}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    if "--env" in sys.argv:
        from overlap.env import format_table

        print(format_table())
    elif "--json" in sys.argv:
        print(json.dumps(build_info(), indent=2))
    else:
        print(summary())
