"""tierstack bench workloads, pip: makes deterministic pure-Python wheels, or lists the
top-level importable names of the wheels in a folder.

  wheels.py make OUT WHEELS MODULES   WHEELS wheels of MODULES modules each (sub-packages of 10)
  wheels.py names DIR                 one importable top-level name a line
"""
import base64
import hashlib
import os
import sys
import zipfile


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def module_source(pkg, sub, i):
    lines = [f'"""{pkg}.{sub}.mod{i}: generated for tierstack bench workloads."""', ""]
    lines.append(f"CONSTANT_{i} = {i * 7919 % 1000}")
    for k in range(6):
        lines += [
            "",
            f"def f{k}(x, y={k}):",
            f'    """Function {k} of module {i}."""',
            f"    total = x * {k + 1} + y",
            f"    for j in range({k + 2}):",
            "        total += j * CONSTANT_%d" % i,
            "    return total",
        ]
    lines += ["", f"class C{i}:", "    def __init__(self):", f"        self.v = f0({i})", ""]
    return "\n".join(lines).encode()


def make(out, wheels, modules):
    os.makedirs(out, exist_ok=True)
    for w in range(wheels):
        pkg = f"tsbench_pkg{w}"
        ver = "1.0.0"
        files = {}
        subs = [f"sub{s}" for s in range((modules + 9) // 10)]
        init = [f'"""{pkg}: generated for tierstack bench workloads."""']
        for s, sub in enumerate(subs):
            n = min(10, modules - s * 10)
            sinit = [f"from . import mod{i}" for i in range(n)]
            files[f"{pkg}/{sub}/__init__.py"] = ("\n".join(sinit) + "\n").encode()
            for i in range(n):
                files[f"{pkg}/{sub}/mod{i}.py"] = module_source(pkg, sub, i)
            init.append(f"from . import {sub}")
        files[f"{pkg}/__init__.py"] = ("\n".join(init) + "\n").encode()
        info = f"{pkg}-{ver}.dist-info"
        files[f"{info}/METADATA"] = (
            f"Metadata-Version: 2.1\nName: {pkg}\nVersion: {ver}\n"
            "Summary: generated for tierstack bench workloads\n"
        ).encode()
        files[f"{info}/WHEEL"] = (
            "Wheel-Version: 1.0\nGenerator: tierstack-bench\nRoot-Is-Purelib: true\n"
            "Tag: py3-none-any\n"
        ).encode()
        files[f"{info}/top_level.txt"] = f"{pkg}\n".encode()
        record = [record_line(n, d) for n, d in files.items()] + [f"{info}/RECORD,,"]
        files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
        path = os.path.join(out, f"{pkg}-{ver}-py3-none-any.whl")
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
            for n, d in files.items():
                zi = zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0))
                zi.external_attr = 0o644 << 16
                zi.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(zi, d)


def names(folder):
    found = set()
    for f in sorted(os.listdir(folder)):
        if not f.endswith(".whl"):
            continue
        with zipfile.ZipFile(os.path.join(folder, f)) as z:
            for n in z.namelist():
                top = n.split("/")[0]
                if top.endswith(".dist-info") or top.endswith(".data"):
                    continue
                if "/" in n:
                    cand = top if n == f"{top}/__init__.py" else None
                else:
                    cand = top[:-3] if top.endswith(".py") else None
                if cand and cand.isidentifier() and not cand.startswith("_"):
                    found.add(cand)
    for n in sorted(found):
        print(n)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "make":
        make(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif len(sys.argv) == 3 and sys.argv[1] == "names":
        names(sys.argv[2])
    else:
        sys.exit("usage: wheels.py make OUT WHEELS MODULES | wheels.py names DIR")
