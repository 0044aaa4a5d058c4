#!/usr/bin/env python3
# sass_compare.py: Compares the SASS of every kernel in two sets of objects. Verdict: tool; it showed the split of the kernels into files changed no instruction.
"""Compare the SASS of every kernel in two sets of CUDA objects, per (arch, kernel).

    python3 dev/sass_compare.py OBJDIR_A OBJDIR_B [OLD=NEW ...]

Each directory holds .o files built by nvcc (any split into files: kernels are
matched by their mangled name and arch, not by file). Prints the kernels that
exist in one set only and those whose SASS differs; exit status 1 if any.
Used to show that moving code between files changed no instruction. OLD=NEW
renames kernel OLD of set A to NEW before matching (a kernel that gained a
template parameter, e.g. a new variant beside it, is compared with its old self).
"""
import glob
import os
import re
import subprocess
import sys


def kernels(objdir):
    out = {}
    for obj in sorted(glob.glob(os.path.join(objdir, "*.o"))):
        text = subprocess.run(["cuobjdump", "-sass", obj], capture_output=True, text=True,
                              check=True).stdout
        arch, name, body = None, None, []
        for line in text.splitlines():
            m = re.match(r"\s*arch = (sm_\w+)", line)
            if m:
                if name:
                    out[(arch, name)] = "\n".join(body)
                arch, name, body = m.group(1), None, []
                continue
            m = re.match(r"\s*Function : (\S+)", line)
            if m:
                if name:
                    out[(arch, name)] = "\n".join(body)
                name, body = m.group(1), []
                continue
            # an instruction's two lines: /*offset*/ opcode ... /* low encoding */, then
            # /* high encoding */ (control bits: stalls, barriers); spacing varies by file.
            # (the offset has 4 hex digits below 0x10000 and more past it)
            if name is not None and re.match(r"\s+/\*(?:[0-9a-f]{4,}\*/| 0x[0-9a-f]{16} \*/)", line):
                body.append(" ".join(line.split()))
        if name:
            out[(arch, name)] = "\n".join(body)
    return out


def main():
    a, b = kernels(sys.argv[1]), kernels(sys.argv[2])
    for spec in sys.argv[3:]:
        old, new = spec.split("=")
        a = {(arch, new if name == old else name): body for (arch, name), body in a.items()}
    only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    differ = sorted(k for k in set(a) & set(b) if a[k] != b[k])
    for k in only_a:
        print("only in A:", *k)
    for k in only_b:
        print("only in B:", *k)
    for k in differ:
        print("differs:", *k)
    same = len(set(a) & set(b)) - len(differ)
    print(f"{same} kernels identical, {len(differ)} differ, {len(only_a)} only in A, "
          f"{len(only_b)} only in B (archs: {sorted({k[0] for k in a})})")
    return 1 if only_a or only_b or differ else 0


if __name__ == "__main__":
    sys.exit(main())
