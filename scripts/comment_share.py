"""The share of comment lines in the C++/CUDA sources (docs/design.md §8: 10-15% in csrc).

A comment line is a non-blank line that starts with ``//`` or lies in a ``/* ... */`` block;
the share is comment lines over non-blank lines, for ``csrc/**/*.{h,cpp,cu,cuh}`` (or the
folders given). Lines that end in a comment after code count as code.

    python scripts/comment_share.py              # the total, then csrc/<subsystem> totals
    python scripts/comment_share.py --files      # and every file, most comment lines first
    python scripts/comment_share.py csrc/comm    # only these folders
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = (".h", ".cpp", ".cu", ".cuh")


@dataclass
class Count:
    lines: int = 0  # non-blank lines
    comments: int = 0

    def add(self, other: Count) -> None:
        self.lines += other.lines
        self.comments += other.comments

    @property
    def share(self) -> float:
        return self.comments / self.lines if self.lines else 0.0


def count_text(text: str) -> Count:
    """Non-blank and comment lines of one C++ source."""
    c = Count()
    in_block = False
    for line in text.splitlines():
        s = line.strip()
        if not s:
            continue
        c.lines += 1
        if in_block:
            c.comments += 1
            in_block = "*/" not in s
        elif s.startswith("//"):
            c.comments += 1
        elif s.startswith("/*"):
            c.comments += 1
            in_block = "*/" not in s
    return c


def sources(folders: list[Path]) -> list[Path]:
    return sorted(p for d in folders for p in d.rglob("*") if p.suffix in SUFFIXES and p.is_file())


def count_files(folders: list[Path]) -> dict[Path, Count]:
    return {p: count_text(p.read_text(encoding="utf-8")) for p in sources(folders)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="*", help="folders to count (default: csrc)")
    parser.add_argument("--files", action="store_true", help="also print every file")
    args = parser.parse_args(argv)
    folders = [ROOT / f for f in args.folders] or [ROOT / "csrc"]
    per_file = count_files(folders)
    total = Count()
    groups: dict[str, Count] = {}
    for path, c in per_file.items():
        total.add(c)
        rel = path.relative_to(ROOT)
        groups.setdefault(str(Path(*rel.parts[:2])), Count()).add(c)
    print(f"{total.share:6.1%}  {total.comments:5d} / {total.lines:5d}  total")
    for name, c in sorted(groups.items()):
        print(f"{c.share:6.1%}  {c.comments:5d} / {c.lines:5d}  {name}")
    if args.files:
        print()
        for path, c in sorted(per_file.items(), key=lambda kv: -kv[1].comments):
            print(f"{c.share:6.1%}  {c.comments:5d} / {c.lines:5d}  {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
