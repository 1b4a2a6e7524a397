#!/usr/bin/env python3
"""Checks that the x86 GEMM tiles keep their accumulators in registers.

A register tile's step loop (the innermost loop with at least MIN_PRODUCTS vector multiply-adds:
VFMADD*PS, VDPBF16PS) must not read or write a vector register's bytes on the stack. When a tile's
epilogue holds a call (the x86-64 ABI saves no vector register across one), GCC may keep some
accumulators on the stack through every step: a load and a store per accumulator per step, and a
chain through memory. That happened once (2026-12-07, a call left in the bf16 rounding of the
avx512_bf16 tile's store) and cost the bf16-output GEMMs 1.3x on a Zen 5; the bits were the same, so
no other test saw it (docs/benchmarks.md, "A tile's accumulators on the stack").

Usage: check_tile_loops.py OBJECT_DIR [LEVEL...]
  OBJECT_DIR: the directory of the kernels' object files (build/CMakeFiles/moe_core.dir/src/kernels/x86);
  LEVEL: level objects (kernels_<LEVEL>.cpp.o) that must hold at least one tile loop
  (default: avx2 avx512 avx512_bf16). Every kernels_*.cpp.o in the directory is checked.
Exits 0 when every tile loop is clean, 1 naming each loop that is not (or a level without tiles).
"""
import pathlib
import re
import subprocess
import sys

MAX_LOOP = 1000  # instructions
MIN_PRODUCTS = 12  # the smallest full tile: avx2's 6 x 2 f32 tile, 12 FMAs a step
PRODUCT = re.compile(r"(vfmadd\d+ps|vdpbf16ps)\b")
LINE = re.compile(r"\s*([0-9a-f]+):\s+(.*)")
BACK_JUMP = re.compile(r"j\w+\s+([0-9a-f]+)")
VECTOR_REG = re.compile(r"%[xyz]mm\d+")
STACK = re.compile(r"\(%r[sb]p\)")


def innermost_loops(obj):
    """(section, start address, instructions) of each innermost loop of the object's code that is
    at most MAX_LOOP instructions long (a tile's step loop is a few dozen)."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", str(obj)],
                         capture_output=True, text=True, check=True).stdout
    # Template instances sit in their own sections, each numbered from 0: one section at a time.
    for section in out.split("\nDisassembly of section ")[1:]:
        name = section[:section.find(":")]
        code = [(int(m.group(1), 16), m.group(2)) for line in section.split("\n") if (m := LINE.match(line))]
        index = {addr: i for i, (addr, _) in enumerate(code)}
        target = [-1] * len(code)  # the index a backward jump at i goes to
        for i, (addr, ins) in enumerate(code):
            m = BACK_JUMP.match(ins)
            if m and int(m.group(1), 16) < addr and int(m.group(1), 16) in index:
                target[i] = index[int(m.group(1), 16)]
        for e, s in enumerate(target):
            if s < 0 or e - s > MAX_LOOP:
                continue
            # Innermost: no other backward jump inside [s, e) lands at or after s.
            if not any(target[i] >= s for i in range(s, e)):
                yield name, code[s][0], [ins for _, ins in code[s:e + 1]]


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    directory = pathlib.Path(argv[1])
    required = argv[2:] or ["avx2", "avx512", "avx512_bf16"]
    objects = sorted(directory.glob("kernels_*.cpp.o"))
    if not objects:
        print(f"check_tile_loops: no kernels_*.cpp.o in {directory}", file=sys.stderr)
        return 1
    failures = 0
    for obj in objects:
        tiles = 0
        for section, start, body in innermost_loops(obj):
            products = sum(1 for ins in body if PRODUCT.match(ins))
            if products < MIN_PRODUCTS:
                continue
            tiles += 1
            stack = [ins for ins in body if VECTOR_REG.search(ins) and STACK.search(ins)]
            if stack:
                failures += 1
                print(f"{obj.name}: the loop at {start:#x} ({section}) has {products} products and "
                      f"{len(stack)} vector stack accesses a step, e.g. {stack[:3]}")
        level = obj.name[len("kernels_"):-len(".cpp.o")]
        print(f"{obj.name}: {tiles} tile loops")
        if level in required and tiles == 0:
            failures += 1
            print(f"{obj.name}: no tile loop found (expected the {level} level's GEMM tiles)")
    print("check_tile_loops: " + ("every tile loop keeps its accumulators in registers" if failures == 0
                                  else f"{failures} problem(s)"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
