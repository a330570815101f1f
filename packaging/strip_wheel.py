"""Strips the executables of a wheel in place: ``python
packaging/strip_wheel.py WHEEL...``.

`make wheels` runs it on the Ivy wheel instead of maturin's ``strip``
setting, which passes rustc ``-C strip=symbols`` and so rebuilds Ivy beside
the unstripped copy ``make ivy`` keeps (with debug line tables, for
profiles): here it costs a second. The RECORD gets the new hashes and
sizes, so pip installs the result as any wheel."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import subprocess
import sys
import tempfile
import zipfile


def record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def strip_wheel(path: str) -> list[str]:
    """Strips every file under ``*.data/scripts/`` that is an ELF binary;
    returns their names."""
    with zipfile.ZipFile(path) as zin:
        infos = zin.infolist()
        files = {i.filename: zin.read(i) for i in infos}
    stripped = []
    for name, data in files.items():
        if ".data/scripts/" in name and data[:4] == b"\x7fELF":
            with tempfile.TemporaryDirectory() as tmp:
                binary = os.path.join(tmp, "bin")
                with open(binary, "wb") as f:
                    f.write(data)
                subprocess.run(["strip", "--strip-all", binary], check=True)
                with open(binary, "rb") as f:
                    files[name] = f.read()
            stripped.append(name)
    if not stripped:
        return []
    [record] = [n for n in files if n.endswith(".dist-info/RECORD")]
    rows = list(csv.reader(io.StringIO(files[record].decode())))
    for row in rows:
        if row and row[0] in stripped:
            row[1:3] = [record_hash(files[row[0]]), str(len(files[row[0]]))]
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    files[record] = out.getvalue().encode()
    tmp_path = path + ".tmp"
    with zipfile.ZipFile(tmp_path, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in infos:  # same order and modes; RECORD stays last
            zout.writestr(info, files[info.filename], compress_type=zipfile.ZIP_DEFLATED)
    os.replace(tmp_path, path)
    return stripped


def main() -> None:
    for path in sys.argv[1:]:
        for name in strip_wheel(path):
            print(f"{path}: stripped {name}")


if __name__ == "__main__":
    main()
